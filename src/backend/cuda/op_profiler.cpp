#include "backend/cuda/op_profiler.h"

#include <fmt/core.h>

namespace lragent::cuda {

OpProfiler::~OpProfiler() {
  for (auto& [name, s, e] : pending_) {
    cudaEventDestroy(s);
    cudaEventDestroy(e);
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::event() {
  if (free_.empty()) {
    cudaEvent_t e;
    cudaEventCreate(&e);
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

OpProfiler::Scope::Scope(OpProfiler& p, const char* name, cudaStream_t stream) : p_(p), name_(name), stream_(stream) {
  if (!p_.enabled_) return;
  t0_ = std::chrono::steady_clock::now();
  start_ = p_.event();
  cudaEventRecord(start_, stream_);
}

OpProfiler::Scope::~Scope() {
  if (!p_.enabled_) return;
  cudaEvent_t end = p_.event();
  cudaEventRecord(end, stream_);
  p_.pending_.push_back({name_, start_, end});
  p_.host_ms_[name_] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  // A generation loop never synchronizes the backend: fold the timings in every so many ops, so
  // the pending events (and their handles) stay bounded.
  if (p_.pending_.size() >= 8192) {
    cudaEventSynchronize(end);
    p_.flush();
  }
}

void OpProfiler::flush() {
  for (auto& [name, s, e] : pending_) {
    float ms = 0;
    cudaEventElapsedTime(&ms, s, e);
    auto& t = totals_[name];
    t.first += 1;
    t.second += ms;
    free_.push_back(s);
    free_.push_back(e);
  }
  pending_.clear();
}

void OpProfiler::print() const {
  fmt::print(stderr, "CUDA op profile (LRAGENT_CUDA_PROFILE=1; events around every op, so totals include gaps):\n");
  double all = 0;
  for (const auto& [name, t] : totals_) all += t.second;
  for (const auto& [name, t] : totals_) {
    const auto h = host_ms_.find(name);
    fmt::print(stderr, "  {:<24} {:>8} calls {:>10.3f} ms {:>5.1f}%  host {:>9.3f} ms\n", name, t.first, t.second,
               all > 0 ? 100 * t.second / all : 0.0, h == host_ms_.end() ? 0.0 : h->second);
  }
}

}  // namespace lragent::cuda
