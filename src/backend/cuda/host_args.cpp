#include "backend/cuda/host_args.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lragent::cuda {
namespace {

// Content hash of an uploaded host array: 8 bytes per step (block tables of long contexts are
// tens of KB and every layer passes them again).
uint64_t content_hash(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull ^ n;
  const auto* b = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

cudaError_t HostArgs::init(cudaStream_t stream) {
  stream_ = stream;
  const char* recent = std::getenv("LRAGENT_CUDA_ARGS_RECENT");
  use_recent_ = !(recent && std::string(recent) == "0");
  cudaError_t e = cudaHostAlloc(&staging_, kEagerBytes, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaHostAlloc(&pass_staging_, kPassBytes, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaMallocAsync(&dev_, kEagerBytes, stream_);
  if (e == cudaSuccess) e = cudaMallocAsync(&pass_dev_, kPassBytes, stream_);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&pass_copied_, cudaEventDisableTiming);
  return e;
}

HostArgs::~HostArgs() {
  if (stream_) cudaStreamSynchronize(stream_);  // copies out of the staging buffers must finish
  if (dev_) cudaFreeAsync(dev_, stream_);
  if (pass_dev_) cudaFreeAsync(pass_dev_, stream_);
  if (stream_) cudaStreamSynchronize(stream_);
  if (staging_) cudaFreeHost(staging_);
  if (pass_staging_) cudaFreeHost(pass_staging_);
  if (pass_copied_) cudaEventDestroy(pass_copied_);
}

const void* HostArgs::eager(const void* host, size_t bytes, size_t padded) {
  if (padded > bytes) {
    // Only recorded passes pad (grid sizes of a bucket); this is their fallback when full.
    pad_buf_.assign(padded, 0);
    std::memcpy(pad_buf_.data(), host, bytes);
    host = pad_buf_.data();
    bytes = padded;
  }
  if (bytes == 0) return dev_;
  const uint64_t key = content_hash(host, bytes);
  auto it = memo_.find(key);
  if (it != memo_.end() && it->second.bytes == bytes &&
      std::memcmp(static_cast<char*>(staging_) + it->second.offset, host, bytes) == 0)
    return static_cast<char*>(dev_) + it->second.offset;
  const size_t need = (bytes + 255) / 256 * 256;
  if (need > kEagerBytes) return nullptr;
  if (off_ + need > kEagerBytes) {
    // Wrap: earlier copies out of the staging ring must have landed before it is rewritten.
    if (cudaStreamSynchronize(stream_) != cudaSuccess) return nullptr;
    off_ = 0;
    memo_.clear();
  }
  const size_t off = off_;
  off_ += need;
  std::memcpy(static_cast<char*>(staging_) + off, host, bytes);
  if (cudaMemcpyAsync(static_cast<char*>(dev_) + off, static_cast<char*>(staging_) + off, bytes,
                      cudaMemcpyHostToDevice, stream_) != cudaSuccess)
    return nullptr;
  memo_[key] = {off, bytes};
  return static_cast<char*>(dev_) + off;
}

const void* HostArgs::recorded(const void* host, size_t bytes, size_t padded) {
  padded = std::max(bytes, padded);
  // Arrays of 64 bytes or more (block tables) are deduplicated by content within the pass.
  uint64_t key = 0;
  if (bytes >= 64 && use_recent_)
    for (const Recent& r : recent_)
      if (r.host == host && r.bytes == bytes && r.padded == padded &&
          std::memcmp(static_cast<char*>(pass_staging_) + r.offset, host, bytes) == 0)
        return static_cast<char*>(pass_dev_) + r.offset;
  if (bytes >= 64) {
    key = content_hash(host, bytes) ^ (padded * 0x9e3779b97f4a7c15ull);
    auto it = pass_memo_.find(key);
    if (it != pass_memo_.end() && it->second.bytes == bytes &&
        std::memcmp(static_cast<char*>(pass_staging_) + it->second.offset, host, bytes) == 0) {
      remember(host, bytes, padded, it->second.offset);
      return static_cast<char*>(pass_dev_) + it->second.offset;
    }
  }
  const size_t need = (std::max<size_t>(padded, 1) + 15) / 16 * 16;
  if (pass_off_ + need > kPassBytes) return nullptr;
  char* dst = static_cast<char*>(pass_staging_) + pass_off_;
  if (bytes) std::memcpy(dst, host, bytes);
  if (padded > bytes) std::memset(dst + bytes, 0, padded - bytes);
  if (bytes >= 64) {
    pass_memo_[key] = {pass_off_, bytes};
    remember(host, bytes, padded, pass_off_);
  }
  const void* d = static_cast<char*>(pass_dev_) + pass_off_;
  pass_off_ += need;
  return d;
}

void HostArgs::remember(const void* host, size_t bytes, size_t padded, size_t offset) {
  recent_[recent_next_] = {host, bytes, padded, offset};
  recent_next_ = (recent_next_ + 1) % kRecent;
}

cudaError_t HostArgs::begin_pass() {
  pass_off_ = 0;
  pass_flushed_ = 0;
  pass_memo_.clear();
  for (Recent& r : recent_) r = Recent{};
  return cudaEventSynchronize(pass_copied_);
}

cudaError_t HostArgs::flush_pass() {
  if (pass_off_ == pass_flushed_) return cudaSuccess;
  cudaError_t e = cudaMemcpyAsync(static_cast<char*>(pass_dev_) + pass_flushed_,
                                  static_cast<char*>(pass_staging_) + pass_flushed_, pass_off_ - pass_flushed_,
                                  cudaMemcpyHostToDevice, stream_);
  pass_flushed_ = pass_off_;
  if (e == cudaSuccess) e = cudaEventRecord(pass_copied_, stream_);
  return e;
}

}  // namespace lragent::cuda
