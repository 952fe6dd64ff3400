#include "backend/cuda/graph_tape.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

namespace lragent::cuda {

GraphTape::GraphTape(cudaStream_t stream) : stream_(stream) {
  const char* u = std::getenv("LRAGENT_CUDA_GRAPH_UPDATE");
  update_ = !(u && std::string_view(u) == "0");
  if (const char* n = std::getenv("LRAGENT_CUDA_GRAPHS_PER_SHAPE"); n && std::atoi(n) > 0) execs_per_shape_ = std::atoi(n);
}

GraphTape::~GraphTape() {
  clear_ops();
  clear_graphs();
}

void* GraphTape::op_memory(size_t bytes, size_t align) {
  for (;; ++chunk_, used_ = 0) {
    if (chunk_ == chunks_.size()) {  // every chunk is full: one more, kept for later passes
      const size_t n = std::max(kChunk, bytes + align);
      chunks_.push_back(std::make_unique<std::byte[]>(n));
      chunk_bytes_.push_back(n);
    }
    const auto base = reinterpret_cast<uintptr_t>(chunks_[chunk_].get());
    const size_t at = (base + used_ + align - 1) / align * align - base;
    if (at + bytes <= chunk_bytes_[chunk_]) {
      used_ = at + bytes;
      return chunks_[chunk_].get() + at;
    }
  }
}

void GraphTape::clear_ops() {
  for (Op& op : ops_)
    if (op.destroy) op.destroy(op.fn);
  ops_.clear();
  chunk_ = 0;
  used_ = 0;
}

void GraphTape::clear_graphs() {
  for (auto& [k, e] : cache_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  cache_.clear();
  by_shape_.clear();
}

cudaError_t GraphTape::run_eager() {
  // Ops after a failed one would read its garbage outputs (and store K/V rows from them): stop.
  for (Op& op : ops_)
    if (const cudaError_t e = op.call(op.fn); e != cudaSuccess) {
      failed_op_ = op.name ? op.name : "(unnamed)";
      return e;
    }
  return cudaSuccess;
}

cudaGraph_t GraphTape::capture(cudaError_t* op_error) {
  cudaGraph_t graph = nullptr;
  *op_error = cudaSuccess;
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return nullptr;
  const cudaError_t launch_err = run_eager();
  const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (err != cudaSuccess || launch_err != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    // An op that reported a failure (e.g. a cuBLASLt error) failed the pass; a capture error
    // alone means the pass is not capturable.
    if (err == cudaSuccess) *op_error = launch_err;
    return nullptr;
  }
  return graph;
}

cudaError_t GraphTape::run() {
  recording_ = false;
  ++stats_.passes;
  stats_.record_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin_time_).count();
  return run_ops();
}

cudaError_t GraphTape::run_segment() {
  // The mark ends this segment's key; sig_ and shape_ go on growing, so the next segment's key
  // holds this one's too. A pass not split never has the mark: its key differs from every
  // segment's.
  static const char kSplitMark = 0;
  sig(&kSplitMark);
  shape_.append("|split|");
  ++stats_.segments;
  const cudaError_t e = run_ops();
  clear_ops();  // graphable_ stays: what made a segment ungraphable may be read by later ones
  return e;
}

cudaError_t GraphTape::run_ops() {
  failed_op_ = nullptr;
  if (ops_.empty()) return cudaSuccess;
  if (!graphable_) {
    ++stats_.eager;
    return run_eager();
  }
  auto it = cache_.find(sig_);
  if (it == cache_.end()) {
    if (cache_.size() >= kMaxGraphs) clear_graphs();  // a workload that keeps changing shape
    it = cache_.emplace(sig_, Entry{}).first;
  }
  Entry& e = it->second;
  ++e.seen;
  e.last = stats_.passes;
  if (e.exec) {
    ++stats_.replayed;
    return cudaGraphLaunch(e.exec, stream_);
  }
  if (e.failed) {
    ++stats_.eager;
    return run_eager();
  }
  std::vector<std::string>& same = by_shape_[shape_];
  // First sight of a shape: run op by op. The first eager run also performs the one-time work
  // (module loads, kernel attributes, cuBLASLt internals) that must not happen inside a capture.
  if (e.seen < 2 && (!update_ || same.empty())) {
    ++stats_.eager;
    return run_eager();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto built = [&] {
    stats_.build_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  cudaError_t op_error = cudaSuccess;
  cudaGraph_t graph = capture(&op_error);
  if (!graph && op_error != cudaSuccess) {
    // An op failed while captured: the pass failed (its outputs are garbage) and nothing of it is
    // cached; the shape is captured again when it next comes (the failure may not recur).
    ++stats_.capture_failures;
    built();
    return op_error;
  }
  if (!graph) {  // not capturable (an op did something a capture forbids): remember, run eagerly
    e.failed = true;
    ++stats_.capture_failures;
    ++stats_.eager;
    built();
    return run_eager();
  }
  // A full set of graphs of this shape: take over the least recently launched one's graph.
  if (update_ && static_cast<int>(same.size()) >= execs_per_shape_) {
    size_t victim = 0;
    for (size_t i = 1; i < same.size(); ++i)
      if (cache_[same[i]].last < cache_[same[victim]].last) victim = i;
    Entry& old = cache_[same[victim]];
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(old.exec, graph, &info) == cudaSuccess) {
      e.exec = old.exec;
      old.exec = nullptr;
      same[victim] = sig_;
      cudaGraphDestroy(graph);
      ++stats_.updated;
      built();
      return cudaGraphLaunch(e.exec, stream_);
    }
    cudaGetLastError();  // topology differs after all: instantiate a graph of its own below
  }
  const cudaError_t err = cudaGraphInstantiate(&e.exec, graph, 0);
  cudaGraphDestroy(graph);
  built();
  if (err != cudaSuccess || !e.exec) {
    cudaGetLastError();
    e.exec = nullptr;
    e.failed = true;
    ++stats_.capture_failures;
    ++stats_.eager;
    return run_eager();
  }
  if (static_cast<int>(same.size()) < execs_per_shape_) same.push_back(sig_);
  ++stats_.captured;
  return cudaGraphLaunch(e.exec, stream_);
}

}  // namespace lragent::cuda
