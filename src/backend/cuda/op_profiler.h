// LRAGENT_CUDA_PROFILE=1: CUDA events around every op the backend launches eagerly, summed per op
// name (GPU milliseconds between the events, so idle gaps count, and host milliseconds spent
// enqueuing). Recorded passes (CUDA graphs) are not profiled: the backend turns graphs off.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace lragent::cuda {

class OpProfiler {
 public:
  explicit OpProfiler(bool enabled) : enabled_(enabled) {}
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  bool enabled() const { return enabled_; }

  // Brackets one op on `stream` (a no-op when disabled).
  class Scope {
   public:
    Scope(OpProfiler& p, const char* name, cudaStream_t stream);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler& p_;
    const char* name_;
    cudaStream_t stream_;
    cudaEvent_t start_ = nullptr;
    std::chrono::steady_clock::time_point t0_;
  };

  // Reads the events of finished ops into the totals (after a stream synchronisation).
  void flush();
  // Prints the totals to stderr.
  void print() const;

 private:
  cudaEvent_t event();
  bool enabled_;
  std::vector<std::tuple<const char*, cudaEvent_t, cudaEvent_t>> pending_;
  std::map<std::string, std::pair<int64_t, double>> totals_;  // calls, GPU ms between the events
  std::map<std::string, double> host_ms_;                     // host ms inside the op (enqueue cost)
  std::vector<cudaEvent_t> free_;
};

}  // namespace lragent::cuda
