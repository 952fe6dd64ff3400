// Host arrays that CUDA ops take as arguments (token ids, positions, slots, block tables,
// inv_freq), on their way to the device. Two regions, both pinned staging + device copy:
//   eager     a 16 MiB ring bump-allocated in 256 B steps, one async copy per array,
//             deduplicated by content (a forward pass uploads each block table once although
//             every layer passes it again); a wrap first waits for the stream;
//   recorded  the arrays of one recorded pass (graph_tape.h): bump-allocated from offset 0 every
//             pass, so a replayed graph finds them at the addresses it captured; copied to the
//             device in one piece before the pass runs (flush_pass; a pass run in segments
//             copies what each segment added before it runs).
// Host C++ over the CUDA runtime; errors come back as null pointers / cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace lragent::cuda {

class HostArgs {
 public:
  static constexpr size_t kEagerBytes = 16u << 20;
  static constexpr size_t kPassBytes = 4u << 20;

  HostArgs() = default;
  ~HostArgs();
  HostArgs(const HostArgs&) = delete;
  HostArgs& operator=(const HostArgs&) = delete;

  // Allocates the pinned staging and device regions (stream-ordered on `stream`).
  cudaError_t init(cudaStream_t stream);

  // Device copy of `bytes` of host data, zero-padded to `padded` bytes (0: no padding), through
  // the eager ring. Null on a CUDA error or an array larger than the ring.
  const void* eager(const void* host, size_t bytes, size_t padded = 0);
  // The same into the recorded pass's region; null when the region is full (the caller then
  // uploads eagerly and gives up on a graph for this pass).
  const void* recorded(const void* host, size_t bytes, size_t padded);
  // A recorded pass starts: waits until the previous pass's copy has left the staging buffer.
  cudaError_t begin_pass();
  // A recorded pass (or a segment of it) is about to run: one copy of what its region gained
  // since the last flush to the device.
  cudaError_t flush_pass();

 private:
  void remember(const void* host, size_t bytes, size_t padded, size_t offset);
  struct Memo {
    size_t offset = 0, bytes = 0;
  };
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;  // pinned [kEagerBytes]
  void* dev_ = nullptr;      // [kEagerBytes]
  size_t off_ = 0;
  std::unordered_map<uint64_t, Memo> memo_;
  void* pass_staging_ = nullptr;  // pinned [kPassBytes]
  void* pass_dev_ = nullptr;      // [kPassBytes]
  size_t pass_off_ = 0;
  size_t pass_flushed_ = 0;  // [0, pass_flushed_) of the region is on its way to the device
  std::unordered_map<uint64_t, Memo> pass_memo_;
  // The pass's latest deduplicated arrays by host address: a block table comes again from the
  // same address for K, V and every layer's store and attention, and comparing it with its
  // staged copy costs a fraction of hashing it (8 KB a table at 32k tokens). A hit is a match of
  // the bytes, never of the address alone.
  struct Recent {
    const void* host = nullptr;
    size_t bytes = 0, padded = 0, offset = 0;
  };
  static constexpr int kRecent = 4;
  Recent recent_[kRecent];
  int recent_next_ = 0;
  bool use_recent_ = true;  // LRAGENT_CUDA_ARGS_RECENT=0: hash every array (measuring)
  cudaEvent_t pass_copied_ = nullptr;
  std::vector<unsigned char> pad_buf_;
};

}  // namespace lragent::cuda
