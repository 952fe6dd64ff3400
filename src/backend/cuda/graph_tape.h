// CUDA graphs for small forward passes (decode steps), without changing the model code.
//
// A decode step of an 8B model is ~650 small kernels; launched one by one their host cost and
// the gaps between them make the step ~1.7x slower than its bytes allow. While a pass is being
// recorded, every op of the CudaBackend appends (a) a closure that launches it and (b) the
// bytes of every parameter it launches with (pointers, sizes, scalars) to this tape. At the
// end of the pass the tape is run:
//   - first sight of this exact signature: eagerly (warms lazy module loads and cuBLASLt);
//   - second sight: captured into a CUDA graph, instantiated, launched;
//   - later: the cached graph is launched (one launch for the whole step).
// A signature whose *shape* (the signature without its pointer values) matches a cached graph
// skips the eager run and the instantiation: it is captured and written into that graph with
// cudaGraphExecUpdate (same kernels and launch shapes, new addresses). That is the case of a
// multi-agent trace, where each agent's decode steps differ from the others' only in the
// adapter and cache addresses: instantiating a ~650-node graph costs milliseconds, an update
// less (H100, Llama-3.1-8B traces of 3.0k and 9.1k tokens: ~5 ms per instantiation, ~1 ms per
// update; graph building 200-218 ms -> 139-166 ms, trace throughput +1-3%, within run-to-run
// noise). Up to LRAGENT_CUDA_GRAPHS_PER_SHAPE (default 2: two agents decoding in alternation
// both stay cached; 1 and 4 measured alike in the traces) graphs of one shape stay cached; a new
// signature past that reuses the least recently launched one. LRAGENT_CUDA_GRAPH_UPDATE=0 turns
// this off.
// A pass may be run in segments (run_segment, called by the backend once a pass that starts on an
// idle GPU has recorded a few ops): the GPU starts on the first ops while the host records the
// rest, so a step not recorded ahead (no decode lookahead) no longer waits out its whole
// recording. Each segment is looked up, captured and replayed like a pass, keyed by the
// signature of the whole pass up to its end (earlier segments included, then a split mark), so
// a segment's key determines every op before it as well as its own.
// Step-varying inputs never enter the signature by value: host arrays (token ids, positions,
// slots, block tables) go through a fixed argument region copied to the device before every
// run, and the attention context length is read on the device (grid sizes use a bucketed
// maximum). Activations come from a bump arena reset every pass, so every replay of a
// signature sees the same addresses.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace lragent::cuda {

struct TapeStats {
  int64_t passes = 0;        // passes run from a tape
  int64_t eager = 0;         // ... run op by op (first sight, not graphable, capture failed)
  int64_t captured = 0;      // ... captured into a new graph
  int64_t updated = 0;       // ... captured and written into a cached graph of the same shape
  int64_t replayed = 0;      // ... run as a cached graph
  int64_t capture_failures = 0;
  int64_t segments = 0;      // passes' earlier segments run before the pass ended (run_segment)
  double build_ms = 0;       // host time spent capturing, instantiating and updating graphs
  double record_ms = 0;      // host time from begin() to run(): the forward pass's own code (the
                             // GPU idles through it when the pass waits on the previous one)
};

class GraphTape {
 public:
  explicit GraphTape(cudaStream_t stream);
  ~GraphTape();
  GraphTape(const GraphTape&) = delete;
  GraphTape& operator=(const GraphTape&) = delete;

  bool recording() const { return recording_; }
  // Ops recorded since the pass (or its last segment) began.
  size_t size() const { return ops_.size(); }
  void begin() {
    begin_time_ = std::chrono::steady_clock::now();
    recording_ = true;
    graphable_ = true;
    clear_ops();
    sig_.clear();
    shape_.clear();
  }
  // Stops recording and drops the recorded ops unrun (an op of the pass failed on the host side).
  void discard() {
    recording_ = false;
    clear_ops();
    sig_.clear();
    shape_.clear();
  }
  // This pass cannot become a graph (e.g. an allocation fell outside the arena); it still runs.
  void mark_not_graphable() { graphable_ = false; }

  // Appends scalar parameters (arithmetic, enum or pointer) to the signature.
  template <class... T>
  void sig(const T&... v) {
    (sig_one(v), ...);
  }
  void sig_bytes(const void* p, size_t n) {
    sig_.append(static_cast<const char*>(p), n);
    shape_.append(static_cast<const char*>(p), n);
  }
  // Appends an op: a closure returning cudaError_t, kept in the tape's own memory until the next
  // begin(). A replayed pass never calls its closures, so making them must cost little: no heap
  // allocation per op (a std::function of a launch's parameters allocated every time).
  // `name` (a string of static storage, or null) names the op in failed_op().
  template <class F>
  void push(const char* name, F&& f) {
    using Fn = std::decay_t<F>;
    void* mem = op_memory(sizeof(Fn), alignof(Fn));
    Fn* fn = ::new (mem) Fn(std::forward<F>(f));
    ops_.push_back(Op{fn, [](void* o) { return (*static_cast<Fn*>(o))(); },
                      std::is_trivially_destructible_v<Fn> ? nullptr : +[](void* o) { static_cast<Fn*>(o)->~Fn(); },
                      name});
  }
  template <class F>
  void push(F&& f) {
    push(nullptr, std::forward<F>(f));
  }
  // The name of the op whose launch failed the last run() or run_segment(), when it ran op by op
  // (eagerly or while captured); null when none did or the failure was a graph's (a replay runs
  // no closure). The backend's error names it: "invalid argument" alone does not say which of a
  // step's ~650 launches the GPU refused.
  const char* failed_op() const { return failed_op_; }

  // Stops recording and runs the recorded ops on the stream (see the top of this file). Returns
  // the first launch error; a failed capture is not an error (the ops then run eagerly).
  cudaError_t run();
  // Runs the ops recorded so far as one segment of the pass (as run() does) and goes on
  // recording the pass: the next ops form its next segment, whose key extends this one's.
  cudaError_t run_segment();
  // Forgets every cached graph (addresses they baked in are about to change).
  void clear_graphs();
  const TapeStats& stats() const { return stats_; }

 private:
  template <class T>
  void sig_one(const T& v) {
    static_assert(std::is_scalar_v<T>, "signature values are scalars; expand structs field by field");
    sig_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    if constexpr (!std::is_pointer_v<T>) shape_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  struct Op {
    void* fn;                   // the closure, in chunks_
    cudaError_t (*call)(void*);
    void (*destroy)(void*);     // null: trivially destructible
    const char* name;           // for failed_op(); may be null
  };
  // Room for a closure of `bytes` at `align` in the current chunk (a new chunk when it is full;
  // chunks are kept across passes, so a warm tape allocates nothing).
  void* op_memory(size_t bytes, size_t align);
  void clear_ops();
  cudaError_t run_eager();
  // Captures the recorded ops into a new graph (null on failure; the ops did not run). *op_error:
  // the error an op of the pass reported while captured (cudaSuccess when the capture itself failed).
  cudaGraph_t capture(cudaError_t* op_error);
  // run()'s body for the recorded ops: replay, capture, update or run eagerly, by sig_.
  cudaError_t run_ops();

  struct Entry {
    int seen = 0;                     // times this signature ran
    cudaGraphExec_t exec = nullptr;   // null until captured (or after its graph was reused)
    bool failed = false;              // capture failed once: stay eager
    int64_t last = 0;                 // pass number of its last launch (LRU among its shape)
  };
  // Signatures remembered (with or without a graph) before the cache is cleared: a split pass
  // takes two (ten agents decoding in turn over four context buckets: 80; at 64 the cache was
  // cleared mid-trace and every segment ran eagerly once more).
  static constexpr size_t kMaxGraphs = 128;
  int execs_per_shape_ = 2;  // LRAGENT_CUDA_GRAPHS_PER_SHAPE

  cudaStream_t stream_;
  bool recording_ = false;
  std::chrono::steady_clock::time_point begin_time_;
  bool graphable_ = true;
  bool update_ = true;  // LRAGENT_CUDA_GRAPH_UPDATE (default on)
  std::vector<Op> ops_;
  static constexpr size_t kChunk = 64u << 10;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;  // closures of ops_, each chunk [kChunk] (or one op's size)
  std::vector<size_t> chunk_bytes_;                   // [chunks_] size of each
  size_t chunk_ = 0, used_ = 0;                       // chunk being filled, bytes used in it
  std::string sig_, shape_;
  std::unordered_map<std::string, Entry> cache_;  // keyed by the signature itself
  // shape -> the signatures of that shape holding a graph (at most execs_per_shape_)
  std::unordered_map<std::string, std::vector<std::string>> by_shape_;
  TapeStats stats_;
  const char* failed_op_ = nullptr;  // see failed_op()
};

}  // namespace lragent::cuda
