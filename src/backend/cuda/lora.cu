// LoRA expand for decode steps: every (target, adapter) expand of a projection stage in one launch.
// Per layer, a decode step with q/v adapters used to issue a shrink and an expand GEMV per
// target (4 launches of a few microseconds each, ~0.3 ms of an 8B step); the shrinks now ride in
// the base projection's grouped GEMV (project_with_lora) and the expands are this one kernel.
// One thread per output column o of a job: it keeps b[o, :] (<= 64 values) in registers, loaded
// before griddepcontrol.wait (the weights do not depend on the GEMV before it), then walks the
// job's rows (<= 16). The data is tiny (r·out bf16 per job); what matters is one launch, not many.
#include <cuda_bf16.h>

#include "backend/cuda/lora_expand.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

constexpr int kThreads = 128;

struct LoraArgs {
  LoraJob job[kMaxLoraJobs];
  int64_t block_end[kMaxLoraJobs];  // prefix sums of the jobs' block counts
  int n_jobs;
};

__global__ void __launch_bounds__(kThreads) lora_expand_kernel(const LoraArgs a) {
  int j = 0;
  while (j + 1 < a.n_jobs && blockIdx.x >= a.block_end[j]) ++j;
  const LoraJob& jb = a.job[j];
  const int64_t o = (blockIdx.x - (j > 0 ? a.block_end[j - 1] : 0)) * int64_t{kThreads} + threadIdx.x;
  const bool live = o < jb.out;
  float bv[kMaxLoraRank];  // [rank] row o of b
  if (live) {
    lora_b_row(jb, o, bv);
  } else {
#pragma unroll
    for (int k = 0; k < kMaxLoraRank; ++k) bv[k] = 0.f;
  }
  pdl_wait();  // xa, y and base come from earlier kernels
  pdl_release();
  if (!live) return;
  for (int r = 0; r < jb.rows; ++r) jb.y[r * jb.ldy + o] = lora_expand_value(jb, r, o, [&](int k) { return bv[k]; });
}

}  // namespace

cudaError_t lora_expand(const LoraJob* jobs, int n_jobs, cudaStream_t s) {
  if (n_jobs < 1 || n_jobs > kMaxLoraJobs) return cudaErrorInvalidValue;
  LoraArgs a{};
  a.n_jobs = n_jobs;
  int64_t blocks = 0;
  for (int i = 0; i < n_jobs; ++i) {
    const LoraJob& jb = jobs[i];
    if (jb.rows < 0 || jb.rows > kLoraExpandMaxRows || jb.rank < 0 || jb.rank > kMaxLoraRank || !jb.y ||
        (!jb.xa && !jb.base) || (jb.xa && !jb.b))
      return cudaErrorInvalidValue;
    a.job[i] = jb;
    blocks += (jb.out + kThreads - 1) / kThreads;
    a.block_end[i] = blocks;
  }
  if (blocks == 0) return cudaSuccess;
  return launch_pdl(lora_expand_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, s, a);
}

}  // namespace lragent::cuda
