#include "backend/cuda/graph_tape.h"

namespace lragent::cuda {

GraphTape::~GraphTape() { clear_graphs(); }

void GraphTape::clear_graphs() {
  for (auto& [k, e] : cache_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  cache_.clear();
}

cudaError_t GraphTape::run_eager() {
  cudaError_t first = cudaSuccess;
  for (Op& op : ops_) {
    const cudaError_t e = op();
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  }
  return first;
}

cudaError_t GraphTape::run() {
  recording_ = false;
  ++stats_.passes;
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
  if (e.exec) {
    ++stats_.replayed;
    return cudaGraphLaunch(e.exec, stream_);
  }
  // First sight, or capture failed before: run op by op. The first eager run also performs the
  // one-time work (module loads, kernel attributes, cuBLASLt internals) that must not happen
  // inside a capture.
  if (e.seen < 2 || e.failed) {
    ++stats_.eager;
    return run_eager();
  }
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  cudaError_t launch_err = cudaSuccess;
  if (err == cudaSuccess) {
    launch_err = run_eager();
    err = cudaStreamEndCapture(stream_, &graph);
  }
  if (err == cudaSuccess && launch_err == cudaSuccess && graph)
    err = cudaGraphInstantiate(&e.exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (err != cudaSuccess || launch_err != cudaSuccess || !e.exec) {
    // Not capturable (an op did something a capture forbids): remember, run eagerly.
    cudaGetLastError();
    e.exec = nullptr;
    e.failed = true;
    ++stats_.capture_failures;
    ++stats_.eager;
    return run_eager();
  }
  ++stats_.captured;
  return cudaGraphLaunch(e.exec, stream_);
}

}  // namespace lragent::cuda
