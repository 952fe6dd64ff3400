// The argmax of logit rows (greedy decoding's pick, see ops.cuh): one block per row, or a
// cluster of blocks per wide row (a 128k-word vocabulary) that merge through shared memory.
#include <cooperative_groups.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/ops.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

// (value, index) pairs: the larger value wins, on equal values the lower index; NaN loses.
__device__ __forceinline__ bool arg_better(float v, int64_t i, float bv, int64_t bi) {
  if (v != v) return false;
  if (bv != bv) return true;
  return v > bv || (v == bv && i < bi);
}
// The best (value, index) of row[begin, end) over one block: thread 0 returns it (the other
// threads their own warp's). The scalar loop has one logit load in flight per thread (over a
// 128,256-wide Llama-3 row, 125 dependent L2 round trips per thread); with kVec (begin and end
// multiples of 4, the row 16-byte aligned) each thread keeps kBatch float4 loads in flight.
struct ArgBest {
  float v;
  int64_t i;
};
template <bool kVec, int kBatch>
__device__ ArgBest argmax_block(const float* row, int64_t begin, int64_t end) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float bv = __int_as_float(0x7fc00000);  // NaN: loses to any number
  int64_t bi = 0;
  auto take = [&](float v, int64_t i) {
    if (arg_better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  };
  if constexpr (kVec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t e4 = end / 4;
    for (int64_t j0 = begin / 4 + threadIdx.x; j0 < e4; j0 += int64_t{kBatch} * blockDim.x) {
      float4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t j = j0 + int64_t{b} * blockDim.x;
        v[b] = j < e4 ? r4[j] : make_float4(NAN, NAN, NAN, NAN);  // NaN: never picked
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t i = 4 * (j0 + int64_t{b} * blockDim.x);
        take(v[b].x, i);
        take(v[b].y, i + 1);
        take(v[b].z, i + 2);
        take(v[b].w, i + 3);
      }
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) take(row[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t i = __shfl_xor_sync(0xffffffffu, bi, o);
    take(v, i);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < n_warps; ++w) take(sv[w], si[w]);
  return {bv, bi};
}

// One block per row.
template <bool kVec>
__global__ void __launch_bounds__(1024) argmax_rows_kernel(const float* x, int64_t ldx, int64_t cols, int32_t* out) {
  const ArgBest best = argmax_block<kVec, 8>(x + blockIdx.x * ldx, 0, cols);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(best.i);
}

// Wide rows (a vocabulary): one thread-block cluster of kArgmaxCluster blocks per row, each block
// one slice of the row; block 0 merges the slices' winners from its peers' shared memory. One
// block walked a 128,256-wide Llama-3 row in 22 us on an H200 (four rounds of loads per thread);
// a slice is one round. The same pick as argmax_rows_kernel: arg_better orders (value, index)
// pairs totally (NaN last), so the merge order does not matter.
constexpr int kArgmaxCluster = 8;
constexpr int64_t kArgmaxClusterMinCols = 8192;  // narrower rows: one block (argmax_rows_kernel)
template <bool kVec>
__global__ void __cluster_dims__(kArgmaxCluster, 1, 1) __launch_bounds__(1024)
    argmax_rows_cluster_kernel(const float* x, int64_t ldx, int64_t cols, int32_t* out) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int part = static_cast<int>(cluster.block_rank());
  __shared__ float win_v;  // this block's winner, read by block 0
  __shared__ int64_t win_i;
  // Slice p: [p·n/K, (p+1)·n/K) of the row's float4s (kVec) or columns.
  const int64_t units = kVec ? cols / 4 : cols, scale = kVec ? 4 : 1;
  const ArgBest best = argmax_block<kVec, 4>(x + blockIdx.y * ldx, scale * (part * units / kArgmaxCluster),
                                             scale * ((part + 1) * units / kArgmaxCluster));
  if (threadIdx.x == 0) {
    win_v = best.v;
    win_i = best.i;
  }
  cluster.sync();  // every block's winner is in its shared memory
  if (part == 0 && threadIdx.x == 0) {
    float bv = best.v;
    int64_t bi = best.i;
    for (int p = 1; p < kArgmaxCluster; ++p) {
      const float v = *cluster.map_shared_rank(&win_v, p);
      const int64_t i = *cluster.map_shared_rank(&win_i, p);
      if (arg_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    out[blockIdx.y] = static_cast<int32_t>(bi);
  }
  cluster.sync();  // peers' shared memory stays alive until block 0 has read it
}

}  // namespace

cudaError_t argmax_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  const bool vec = cols % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  // LRAGENT_CUDA_ARGMAX_CLUSTER=0: one block per row at every width (for measuring).
  static const bool cluster_on = [] {
    const char* v = std::getenv("LRAGENT_CUDA_ARGMAX_CLUSTER");
    return !v || std::atoi(v) != 0;
  }();
  if (cluster_on && cols >= kArgmaxClusterMinCols && rows <= 65535) {  // a cluster per row (grid.y <= 65535)
    const dim3 grid(kArgmaxCluster, static_cast<unsigned>(rows));
    if (vec)
      argmax_rows_cluster_kernel<true><<<grid, 1024, 0, s>>>(x, ldx, cols, out);
    else
      argmax_rows_cluster_kernel<false><<<grid, 1024, 0, s>>>(x, ldx, cols, out);
    return cudaGetLastError();
  }
  if (vec)
    argmax_rows_kernel<true><<<static_cast<unsigned>(rows), 1024, 0, s>>>(x, ldx, cols, out);
  else
    argmax_rows_kernel<false><<<static_cast<unsigned>(rows), 1024, 0, s>>>(x, ldx, cols, out);
  return cudaGetLastError();
}

}  // namespace lragent::cuda
