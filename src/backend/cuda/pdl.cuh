// Programmatic dependent launch (Hopper; sm_90): a kernel launched with launch_pdl may be
// scheduled while the previous kernel in the stream is still running, and waits for it (its
// completion and memory) at griddepcontrol.wait. Captured into CUDA graphs as programmatic edges.
// Used by the decode GEMV (gemv.cu), whose first weight loads do not depend on the previous
// kernel: an 8B decode step went from 6.96 to 6.74 ms on an H100. The kernels that precede the
// GEMVs (norm, SwiGLU, attention combine) call pdl_release() first thing. The v4 decode
// attention is PDL-launched too (its first page-table lookups overlap the K/V store before it,
// which releases it), and so are the sampling kernels. Launching the small
// kernels themselves with PDL (wait as their first instruction) measured no gain (6.61 vs 6.56 ms).
//
// Rules for a kernel launched with launch_pdl: pdl_wait() comes before it reads anything an
// earlier kernel wrote and before it writes anything (an earlier kernel may still read it).
// pdl_release() lets the next PDL kernel be scheduled; calling it early is safe because that
// kernel waits for this one's completion in turn.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace lragent::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;"); }

template <class... KArgs, class... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace lragent::cuda
