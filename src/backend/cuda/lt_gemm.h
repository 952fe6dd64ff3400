// cuBLASLt GEMMs of the CUDA backend: y[n, out] (f32, row stride ldy) = alpha · x[n, in] · w[out, in]^T
// + beta · y, with x in w's type (bf16/f16 operands, or f32 with CUBLAS_COMPUTE_32F: no TF32) and
// f32 accumulation. One plan (descriptors + the heuristic's first algorithm) per shape, strides,
// dtype and alignment, made once and kept (plans are never freed while the backend lives, so a
// Plan* stays valid for recorded passes).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "core/dtype.h"

namespace lragent::cuda {

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  LtGemm() = default;
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Creates the handle and the workspace (stream-ordered on `stream`); false on failure.
  bool init(cudaStream_t stream);
  // The plan for these operands; null with *error set when cuBLASLt has no algorithm.
  const Plan* plan(DType wt, int64_t n, int64_t in, int64_t out, int64_t ldw, int64_t ldx, int64_t ldy, uint32_t align,
                   std::string* error);
  // Enqueues y = alpha · x · w^T + beta · y with a plan from plan().
  cublasStatus_t run(const Plan* p, float alpha, const void* w, const void* x, float beta, void* y) const;

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t>;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;  // [kWorkspaceBytes]
  std::map<Key, Plan> plans_;  // std::map: stable addresses
};

}  // namespace lragent::cuda
