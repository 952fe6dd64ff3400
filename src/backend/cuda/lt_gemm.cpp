#include "backend/cuda/lt_gemm.h"

#include <fmt/core.h>

namespace lragent::cuda {
namespace {

cudaDataType_t cuda_type_of(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

bool LtGemm::init(cudaStream_t stream) {
  stream_ = stream;
  if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) return false;
  return cudaMallocAsync(&workspace_, kWorkspaceBytes, stream_) == cudaSuccess;
}

LtGemm::~LtGemm() {
  for (auto& [k, p] : plans_) {
    cublasLtMatmulDescDestroy(p.desc);
    for (auto* l : {p.a, p.b, p.c}) cublasLtMatrixLayoutDestroy(l);
  }
  if (workspace_) cudaFreeAsync(workspace_, stream_);
  if (lt_) cublasLtDestroy(lt_);
}

// Column-major view: Y^T[out, n] = W (k=in x m=out, op T) x X^T (in x n).
const LtGemm::Plan* LtGemm::plan(DType wt, int64_t n, int64_t in, int64_t out, int64_t ldw, int64_t ldx, int64_t ldy,
                                 uint32_t align, std::string* error) {
  const Key key{n, in, out, ldw, ldx, ldy, static_cast<int>(wt), align};
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  Plan p;
  const cudaDataType_t ab = cuda_type_of(wt);
  cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof(tr));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt));
  cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(in), static_cast<uint64_t>(out), ldw);
  cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(in), static_cast<uint64_t>(n), ldx);
  cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<uint64_t>(out), static_cast<uint64_t>(n), ldy);
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) pref = nullptr;  // the heuristic then fails
  const uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = pref ? cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &found)
                                 : CUBLAS_STATUS_ALLOC_FAILED;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatmulDescDestroy(p.desc);
    for (auto* l : {p.a, p.b, p.c}) cublasLtMatrixLayoutDestroy(l);
    if (error)
      *error = fmt::format("cuBLASLt has no algorithm for [{}x{}]·[{}x{}]^T ({}; alignment {})", n, in, out, in,
                           dtype_name(wt), align);
    return nullptr;
  }
  p.algo = res.algo;
  return &plans_.emplace(key, p).first->second;
}

cublasStatus_t LtGemm::run(const Plan* p, float alpha, const void* w, const void* x, float beta, void* y) const {
  return cublasLtMatmul(lt_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo, workspace_,
                        kWorkspaceBytes, stream_);
}

}  // namespace lragent::cuda
