// Decode GEMV, version 2: y[r, o] = alpha · Σ_k x[r, k] · w[o, k] + beta · y[r, o] for rows <= 8,
// bf16 weights, f32 activations; the entry points hand 2-8 rows to version 3 (gemv_v3_mma.cu,
// tensor cores), version 2 keeps one row. Version 1 (ops.cu, gemv_bf16_v1) is one warp per output row with
// two 16-byte loads in flight per lane: on an H100 it moved 2.1 TB/s of weights (0.71 of the
// copy ceiling) in an 8B decode step, worst on the narrow k/v projections (1024 rows: 256 blocks
// of 4 warps, too few bytes in flight to cover HBM latency).
// Version 2 keeps the warp-per-row layout but
//   - splits a row's reduction over 1, 2, 4 or 8 warps of one block (chosen so the grid holds
//     about two waves of fully occupied SMs), summed through shared memory;
//   - keeps two batches of U = 4 independent 16-byte weight loads per lane in flight;
//   - is launched with programmatic dependent launch (PDL): its first weight loads overlap the
//     tail of the previous kernel, which lets it start early (griddepcontrol.launch_dependents);
//   - streams weights past L1 (ld.global.nc.L1::no_allocate): they are read once per step, and
//     L1 then keeps the activations x that every warp of the SM re-reads;
//   - takes up to kMaxSegs weight matrices that read the same x (q/k/v, gate/up) in one launch:
//     their rows are numbered one after the other, so the narrow k/v projections ride in the
//     same waves as q instead of under-filling a launch of their own;
//   - SwiGLU mode (gemv_bf16_swiglu): the gate and up rows of the same index o are computed in
//     the same block (the first half of its warps take gate rows, the second half the matching
//     up rows), and the block writes silu(gate) · up: the separate SwiGLU kernel and its launch
//     gap (32 per 8B decode step) are gone, and the gate/up outputs never reach memory;
//   - norm mode (GemvNorm; gemv_norm_kernel): x is the residual stream h and the products read
//     its RMSNorm, (h / rms(h) · g) · w^T, without the normed rows ever reaching memory: the
//     RMSNorm kernel before each GEMV group (65 per 8B decode step) and its launch gap are gone.
//     Each block norms h into shared memory once, then each warp streams whole rows one after
//     another (k or k - 1 rows each, the grid at most the blocks that fit at once), its next
//     row's first weights in flight while it finishes the current one. Tried first and dropped (H200, 8B decode step with
//     lookahead, against 4.72 ms without folding):
//       - summing h² while streaming and scaling each chunk's weights by g read from L1: 6.47 ms
//         (the extra L1 traffic of g);
//       - the v2 kernel's tiles of 8 rows looped over by resident blocks: 5.04 ms (every tile
//         ends in two block barriers with no weights in flight).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "backend/cuda/bf16x8.cuh"
#include "backend/cuda/device_props.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

constexpr int kWarps = 8;  // per block
constexpr int kUnroll = 4;

// Weights are read once per step: past L1, which then keeps the activations every warp re-reads.
// (Version 3 copies them with cp.async instead.)
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

template <int R, bool kSwiGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_v2_kernel(const GemvArgs a) {
  __shared__ float part[kWarps][R];  // [warp][row] partial sums
  __shared__ float res[kSwiGLU ? kWarps : 1][R];  // SwiGLU: [block row][batch row] finished dots
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rpb = kWarps / a.wpr;  // output rows per block
  const int br = warp / a.wpr;     // this warp's row within the block
  const int piece = warp % a.wpr;
  int seg = 0;
  int64_t o, og;  // row within the segment; global row (its liveness)
  if constexpr (kSwiGLU) {
    const int half = rpb / 2;
    seg = br / half;
    o = blockIdx.x * int64_t{half} + br % half;
    og = o;  // live while o < the segments' common height
  } else {
    og = blockIdx.x * int64_t{rpb} + br;
    while (seg + 1 < a.n_segs && og >= a.end[seg]) ++seg;
    o = og - (seg > 0 ? a.end[seg - 1] : 0);
  }
  const int64_t chunks = a.in / 8;  // 16-byte chunks of a weight row
  const int64_t per = (chunks + a.wpr - 1) / a.wpr;
  const int64_t c0 = piece * per, c1 = min(chunks, c0 + per);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  const bool live = og < (kSwiGLU ? a.end[0] : a.out);
  const uint4* wr = live ? reinterpret_cast<const uint4*>(a.w[seg] + o * a.ldw[seg]) : nullptr;
  auto load = [&](uint4 (&wv)[kUnroll], int64_t c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t cc = c + 32 * u;
      wv[u] = cc < c1 ? ld_stream(wr + cc) : make_uint4(0, 0, 0, 0);
    }
  };
  int64_t c = c0 + lane;
  uint4 cur[kUnroll], nxt[kUnroll];
  // The first weights do not depend on the previous kernel: with programmatic dependent launch
  // they are in flight while it finishes; x is read only after griddepcontrol.wait.
  if (live) load(cur, c);
  pdl_wait();
  pdl_release();
  while (live && c < c1) {
    const int64_t cn = c + 32 * kUnroll;
    if (cn < c1) load(nxt, cn);  // the next batch in flight while this one is used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t cc = c + 32 * u;
      if (cc >= c1) break;
      float wf[8];
      bf16x8_to_float(cur[u], wf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 p = __ldg(reinterpret_cast<const float4*>(a.x + r * a.ldx + cc * 8));
        const float4 q = __ldg(reinterpret_cast<const float4*>(a.x + r * a.ldx + cc * 8 + 4));
        acc[r] += dot8(wf, p, q);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nxt[u];
    c = cn;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  if constexpr (kSwiGLU) {
    // Row results to shared memory, then one thread per (gate row, batch row) pair.
    if (piece == 0 && lane < R) {
      float v = 0.f;
      for (int p = 0; p < a.wpr; ++p) v += part[warp + p][lane];
      res[br][lane] = v;
    }
    __syncthreads();
    const int half = rpb / 2;
    const int t = threadIdx.x;
    if (t < half * R) {
      const int j = t / R, r = t % R;
      const int64_t oj = blockIdx.x * int64_t{half} + j;
      if (oj < a.end[0]) {
        const float g = res[j][r], u = res[half + j][r];
        a.y[0][r * a.ldy[0] + oj] = g / (1.0f + expf(-g)) * u;  // silu_mul_kernel's expression
      }
    }
  } else {
    // The first warp of each row: lane r sums the row's pieces for batch row r.
    if (piece == 0 && lane < R && og < a.out) {
      float v = 0.f;
      for (int p = 0; p < a.wpr; ++p) v += part[warp + p][lane];
      float* yo = a.y[seg] + lane * a.ldy[seg] + o;
      *yo = a.beta == 0.f ? a.alpha * v : a.alpha * v + a.beta * *yo;
    }
  }
}

// Norm mode's staged row: x's values of 16-byte weight chunk cc are 8 floats, two float4 halves.
// In each group of 32 chunks the first halves come first, then the second halves, so that lane k
// reading chunk 32·i + k reads float4s k and 32 + k of the group: a warp's shared-memory request
// is 512 contiguous bytes (4 wavefronts), where the plain layout's 32-byte lane stride takes 8.
// A row takes gemv_norm_row_floats(in) floats.
__device__ __forceinline__ int staged_float4(int j) {  // float4 j of the row (j = 2 · chunk + half)
  const int cc = j >> 1;
  return (cc >> 5) * 64 + (j & 1) * 32 + (cc & 31);
}

// Norm mode's staging: x's R rows normed into shared memory, xs[r][j] = g[j] · (x[r][j] / rms(x[r])),
// the RMSNorm kernels' expression, laid out as above; stream mode (no norm_w) stages x as it is.
// Every thread of the block takes part (it has barriers).
template <int R>
__device__ void stage_normed(const GemvArgs& a, float* xs, float (&red)[kWarps][R]) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n4 = static_cast<int>(a.in / 4);
  const int row4 = static_cast<int>(gemv_norm_row_floats(a.in) / 4);  // float4s per staged row
  float4* xs4 = reinterpret_cast<float4*>(xs);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float ss = 0.f;
    for (int j = tid; j < n4; j += blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(a.x + r * a.ldx) + j);
      xs4[r * row4 + staged_float4(j)] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (!a.norm_w) continue;
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) red[warp][r] = ss;
  }
  __syncthreads();
  if (!a.norm_w) return;
  float inv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float t = 0.f;
    for (int w = 0; w < kWarps; ++w) t += red[w][r];
    inv[r] = 1.0f / sqrtf(t / static_cast<float>(a.in) + a.norm_eps);
  }
  for (int j = tid; j < n4; j += blockDim.x) {
    float4 g;
    if (a.norm_bf16) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(a.norm_w) + j);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      g = make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      g = __ldg(reinterpret_cast<const float4*>(a.norm_w) + j);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int k = r * row4 + staged_float4(j);
      const float4 v = xs4[k];
      xs4[k] = make_float4(g.x * (v.x * inv[r]), g.y * (v.y * inv[r]), g.z * (v.z * inv[r]), g.w * (v.w * inv[r]));
    }
  }
  __syncthreads();
}

// Norm mode: each warp streams whole output rows (SwiGLU: the gate row, then the up row of the
// same index) as one flat sequence of weight batches, rows blockIdx.x · kWarps + warp + k · stride;
// the batch after the current one, of this row or of the next, is always in flight. Rows and
// chunks are 32-bit (the host checks). Stream mode is the same kernel without the norm: plain
// GEMVs whose x fits the staging (see launch_grouped for why).
template <int R, bool kSwiGLU>
__global__ void __launch_bounds__(kWarps * 32, R == 1 ? 4 : 1) gemv_norm_kernel(const GemvArgs a) {
  extern __shared__ float4 xs_dyn[];  // [R][gemv_norm_row_floats(in)] x's normed rows (f32), staged layout
  __shared__ float red[kWarps][R];
  static_assert(sizeof(red) <= kGemvStaticSmemBytes, "the staging's limit (gemv_stage_fits) leaves room for red");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = static_cast<int>(kSwiGLU ? a.end[0] : a.out);  // rows (SwiGLU: row pairs)
  const int stride = gridDim.x * kWarps;
  const int chunks = static_cast<int>(a.in / 8);  // 16-byte chunks of a weight row
  constexpr int kSub = kSwiGLU ? 2 : 1;           // rows per unit
  const float4* xs = xs_dyn;
  const int row4 = static_cast<int>(gemv_norm_row_floats(a.in) / 4);
  // Unit u's segment and row within it (SwiGLU: sub picks gate or up).
  auto locate = [&](int u, int sub, int& seg, int& o) {
    if constexpr (kSwiGLU) {
      seg = sub;
      o = u;
    } else {
      seg = 0;
      while (seg + 1 < a.n_segs && u >= a.end[seg]) ++seg;
      o = u - (seg > 0 ? static_cast<int>(a.end[seg - 1]) : 0);
    }
  };
  auto row_ptr = [&](int u, int sub) {
    int seg, o;
    locate(u, sub, seg, o);
    return reinterpret_cast<const uint4*>(a.w[seg] + int64_t{o} * a.ldw[seg]);
  };
  // A batch is chunks cb + lane + 32·u of a row, cb warp-uniform: every lane of the warp reaches
  // a row's end (and its shuffles) in the same iteration.
  auto load = [&](uint4 (&wv)[kUnroll], const uint4* wr, int cb) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int cc = cb + lane + 32 * u;
      wv[u] = cc < chunks ? ld_stream(wr + cc) : make_uint4(0, 0, 0, 0);
    }
  };
  int unit = blockIdx.x * kWarps + warp, sub = 0, cb = 0;  // the batch in `cur`
  const uint4* wr = unit < units ? row_ptr(unit, 0) : nullptr;
  uint4 cur[kUnroll], nxt[kUnroll];
  // The first weights do not depend on the previous kernel: with programmatic dependent launch
  // they are in flight while it finishes; h is read only after griddepcontrol.wait.
  if (wr) load(cur, wr, cb);
  pdl_wait();
  pdl_release();
  stage_normed<R>(a, reinterpret_cast<float*>(xs_dyn), red);
  float acc[R], gate[R];  // gate: SwiGLU's finished gate dot of the unit
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = gate[r] = 0.f;
  while (unit < units) {
    // The next batch: further along this row, or the first of the next row (or unit).
    int nunit = unit, nsub = sub, nc = cb + 32 * kUnroll;
    const bool row_ends = nc >= chunks;
    if (row_ends) {
      nc = 0;
      if (++nsub == kSub) nsub = 0, nunit += stride;
    }
    const uint4* nwr = !row_ends ? wr : (nunit < units ? row_ptr(nunit, nsub) : nullptr);
    if (nwr) load(nxt, nwr, nc);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int cc = cb + lane + 32 * u;
      if (cc >= chunks) break;
      float wf[8];
      bf16x8_to_float(cur[u], wf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Chunk cc = 32·i + lane: its halves are float4s lane and 32 + lane of group i.
        const float4* xp = xs + r * row4 + (cc >> 5) * 64 + lane;
        const float4 p = xp[0], q = xp[32];
        acc[r] += dot8(wf, p, q);
      }
    }
    if (row_ends) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (kSwiGLU && sub == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) gate[r] = acc[r];
      } else {
        int seg, o;
        locate(unit, sub, seg, o);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (lane != r) continue;
          if constexpr (kSwiGLU) {
            a.y[0][r * a.ldy[0] + o] = gate[r] / (1.0f + expf(-gate[r])) * acc[r];  // silu_mul_kernel's expression
          } else {
            float* yo = a.y[seg] + r * a.ldy[seg] + o;
            *yo = a.beta == 0.f ? a.alpha * acc[r] : a.alpha * acc[r] + a.beta * *yo;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nxt[u];
    unit = nunit, sub = nsub, cb = nc, wr = nwr;
  }
}

// Tuning knobs, read once (for measuring alternatives on the device without rebuilding):
//   LRAGENT_GEMV_WAVES    fraction of an SM's 64 resident warps the split aims for (default 0.25:
//                         a row is split over several warps only while the rows give fewer than 16
//                         warps per SM. Whole rows per warp stream without gaps, while short pieces
//                         end in waves of blocks that each wait out one DRAM latency: H200, 8B
//                         decode step with lookahead 4.72 ms against 4.91 at the earlier 2 waves
//                         (3 interleaved rounds each); 4096-row GEMVs 0.75 of copy instead of 0.68,
//                         down 0.96 instead of 0.88, the 1024-row k projection alone still split)
//   LRAGENT_GEMV_MINCHUNK 16-byte chunks a piece keeps at least (default 128: an 8B decode step
//                         measured 6.56 ms against 6.74 with 64 and 6.66 with 256, H100, at 2 waves)
//   LRAGENT_GEMV_PDL      0: plain launches instead of programmatic dependent launch
//   LRAGENT_GEMV_NORM_PDL 1: norm mode launched with PDL too (default 0: H200, 8B decode step with
//                         lookahead 4.83 ms with it against 4.60 without, 3 interleaved rounds;
//                         the unfolded step 4.74. Its blocks, resident while the previous GEMV
//                         drains, fill every slot the persistent grid was sized for)
//   LRAGENT_GEMV_STREAM   0: plain GEMVs always run v2 (default 1: stream mode where it applies,
//                         see launch_grouped; in the 8B step that is the o projection)
//   LRAGENT_GEMV_V3_ROWS  rows of x from which launches take version 3 (gemv_v3_mma.cu; default 2;
//                         past 8 rows always version 3, the CUDA-core kernels' most; 17 = never,
//                         and then passes of more than 8 rows take cuBLASLt)
//   LRAGENT_GEMV_NORM_ROWS rows up to which norm mode (RMSNorm folded in; version 2) takes the
//                         launches whose x fits its staging although version 3 takes that many
//                         rows otherwise (default 2; see gemv_norm_max_rows: only 2 rows of 4096
//                         fit). H200, 8B shapes at 4k, 3 interleaved rounds: an ICaRus step
//                         4.81-4.82 ms against 5.02-5.06 with version 3 and the RMSNorm kernels,
//                         a 2-sequence decode step 4.92-4.94 against 5.18-5.23; every 2-row
//                         product in version 2 (LRAGENT_GEMV_V3_ROWS=3) 5.81-5.87 and 5.94-5.96
//   LRAGENT_GEMV_STREAM_ROWS the same for stream mode (default 1: at 2 rows with norm mode on,
//                         4.82-4.85 and 4.93-4.94 ms, no gain)
//   LRAGENT_GEMV_STREAM_PDL 0: stream mode launched without PDL (default 1). H200, 8B decode step
//                         at 4k with lookahead, 3 interleaved rounds: v2 4.463-4.471 ms, stream
//                         mode with PDL 4.441-4.443, without 4.497-4.500 (the o projection then
//                         waits for the attention before its first weights are in flight)
double env_or(const char* name, double def) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : def;
}
struct Knobs {
  double waves = env_or("LRAGENT_GEMV_WAVES", 0.25);
  int64_t min_chunk = static_cast<int64_t>(env_or("LRAGENT_GEMV_MINCHUNK", 128));
  bool pdl = env_or("LRAGENT_GEMV_PDL", 1) != 0;
  bool norm_pdl = env_or("LRAGENT_GEMV_NORM_PDL", 0) != 0;
  bool norm_balance = env_or("LRAGENT_GEMV_NORM_BALANCE", 1) != 0;
  bool stream = env_or("LRAGENT_GEMV_STREAM", 1) != 0;
  bool stream_pdl = env_or("LRAGENT_GEMV_STREAM_PDL", 1) != 0;
  int64_t v3_rows = static_cast<int64_t>(env_or("LRAGENT_GEMV_V3_ROWS", 2));
  int64_t norm_rows = static_cast<int64_t>(env_or("LRAGENT_GEMV_NORM_ROWS", 2));
  int64_t stream_rows = static_cast<int64_t>(env_or("LRAGENT_GEMV_STREAM_ROWS", 1));
};
const Knobs& knobs() {
  static const Knobs k;
  return k;
}

}  // namespace

int gemv_bf16_v2_warps_per_row(int64_t in, int64_t out) {
  // Rows split until the grid holds about `waves` x 64 warps per SM, each piece at least
  // min_chunk chunks.
  const int64_t target = static_cast<int64_t>(knobs().waves * sm_count() * 64);
  int wpr = 1;
  while (wpr < kWarps && out * wpr < target && (in / 8) / (wpr * 2) >= knobs().min_chunk) wpr *= 2;
  return wpr;
}

int64_t gemv_v3_min_rows() { return knobs().v3_rows; }
int64_t gemv_norm_max_rows() {
  return std::clamp<int64_t>(std::max(knobs().norm_rows, knobs().v3_rows - 1), 1, kGemvMaxRows);
}
int64_t gemv_stream_max_rows() {
  return std::clamp<int64_t>(std::max(knobs().stream_rows, knobs().v3_rows - 1), 1, kGemvMaxRows);
}

namespace {
// The launch both entry points share: `swiglu` selects the kernel's SwiGLU mode.
// v3_ok false: version 2 at every row count (gemv_bf16_v2, for the benchmark).
cudaError_t launch_grouped(GemvArgs& a, int64_t rows, bool swiglu, cudaStream_t s, bool v3_ok = true) {
  // SwiGLU: the split counts both segments' rows, but a block must hold at least one pair.
  const int wpr = std::min(gemv_bf16_v2_warps_per_row(a.in, a.out), swiglu ? kWarps / 2 : kWarps);
  // Stream mode (see below why), but for the row count.
  const bool stream = !a.norm_w && !swiglu && knobs().stream && wpr == 1 && gemv_stage_fits(rows, a.in) &&
                        a.out <= INT32_MAX;
  // Version 3 from v3_rows rows, but for norm mode (set_norm took a.norm_w only where
  // gemv_norm_ok) and for stream mode up to gemv_stream_max_rows().
  const bool v2_staged = a.norm_w || (stream && rows <= gemv_stream_max_rows());
  if (v3_ok && !v2_staged && (rows >= knobs().v3_rows || rows > kGemvMaxRows))
    return gemv_v3_launch(a, rows, swiglu, knobs().pdl, s);
  a.wpr = wpr;
  const int64_t rows_per_block = kWarps / a.wpr;
  const int64_t units = swiglu ? a.end[0] : a.out;  // rows (pairs) the grid covers
  const int64_t per_block = swiglu ? rows_per_block / 2 : rows_per_block;
  unsigned grid = static_cast<unsigned>((units + per_block - 1) / per_block);
  // Norm mode: x's normed rows in shared memory; a warp per row, the grid at most the blocks that
  // fit at once (each warp then loops over rows).
  // Stream mode, the same kernel for a plain GEMV whose x fits the staging: v2 gives each warp
  // one row and ends, so a short row (the 8B o projection's 8 KB: four batches) is all ramp and
  // tail, where the persistent warps keep the next row's weights in flight. Only where v2 would
  // not split rows over warps (wpr 1): narrower GEMVs need the split to fill the GPU.
  const size_t staged = static_cast<size_t>(rows * gemv_norm_row_floats(a.in)) * 4;
  const bool persistent = a.norm_w || stream;
  const size_t smem = persistent ? staged : 0;
  // Programmatic dependent launch: the kernel may start while the previous one finishes (it waits
  // on it before reading x; see the kernel). Captured into graphs as a programmatic edge.
  const bool pdl = a.norm_w ? knobs().norm_pdl : stream ? knobs().stream_pdl : knobs().pdl;
  auto go = [&](auto kernel) -> cudaError_t {
    if (persistent) {
      // Resident blocks per SM for this kernel at this shared-memory size: asked once per pair
      // and thread (eager and captured passes launch ~100 of these a step; a handful of pairs).
      struct Occ {
        const void* fn;
        size_t smem;
        int per_sm;
      };
      static thread_local std::vector<Occ> occ;
      const void* fn = reinterpret_cast<const void*>(kernel);
      int per_sm = -1;
      for (const Occ& o : occ)
        if (o.fn == fn && o.smem == smem) per_sm = o.per_sm;
      if (per_sm < 0) {
        const cudaError_t e =
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, static_cast<int>(smem));
        if (e != cudaSuccess) return e;
        occ.push_back({fn, smem, per_sm});
      }
      // Every warp streams k or k - 1 rows, k the fewest that the resident warps allow: a grid of
      // all resident blocks would leave a few warps a row more than the rest (6144 q/k/v rows on
      // 4224 warps: half take two rows, half one, and the kernel lasts two).
      const int64_t slots = std::max(per_sm, 1) * int64_t{sm_count()} * kWarps;
      const int64_t k = knobs().norm_balance ? (units + slots - 1) / slots : 1;
      grid = static_cast<unsigned>(std::min<int64_t>((units + kWarps * k - 1) / (kWarps * k), slots / kWarps));
    }
    if (pdl) return launch_pdl(kernel, dim3(grid), dim3(kWarps * 32), smem, s, a);
    kernel<<<grid, kWarps * 32, smem, s>>>(a);
    return cudaGetLastError();
  };
  // Four kernels per row count (SwiGLU or not, norm mode or not), chosen at run time.
  auto pick = [&](auto r) -> cudaError_t {
    constexpr int R = decltype(r)::value;
    if (persistent) return swiglu ? go(gemv_norm_kernel<R, true>) : go(gemv_norm_kernel<R, false>);
    return swiglu ? go(gemv_v2_kernel<R, true>) : go(gemv_v2_kernel<R, false>);
  };
  switch (rows) {
#define LRA_GEMV2_CASE(R) \
  case R:                 \
    return pick(std::integral_constant<int, R>{});
    LRA_GEMV2_CASE(1) LRA_GEMV2_CASE(2) LRA_GEMV2_CASE(3) LRA_GEMV2_CASE(4)
    LRA_GEMV2_CASE(5) LRA_GEMV2_CASE(6) LRA_GEMV2_CASE(7) LRA_GEMV2_CASE(8)
#undef LRA_GEMV2_CASE
  }
  return cudaErrorInvalidValue;
}
}  // namespace

namespace {
// The segments' rows numbered one after another into a (false: an operand the kernel cannot take).
bool fill_segments(const GemvSeg* segs, int n_segs, const float* x, int64_t ldx, int64_t rows, int64_t in,
                   GemvArgs& a, const void* x16) {
  if (n_segs < 1 || n_segs > kMaxGemvSegs) return false;
  a.n_segs = n_segs;
  a.x = x;
  a.ldx = ldx;
  a.x16 = static_cast<const __nv_bfloat16*>(x16);
  a.in = in;
  int64_t end = 0;
  for (int i = 0; i < n_segs; ++i) {
    if (!gemv_bf16_ok(segs[i].w, segs[i].ldw, x, ldx, rows, in)) return false;
    a.w[i] = static_cast<const __nv_bfloat16*>(segs[i].w);
    a.ldw[i] = segs[i].ldw;
    a.y[i] = segs[i].y;
    a.ldy[i] = segs[i].ldy;
    end += segs[i].out;
    a.end[i] = end;
  }
  a.out = end;
  return true;
}

// Norm mode's operands into a (false: a norm the kernel cannot take; norm.w null: no norm).
bool set_norm(const GemvNorm& norm, int64_t rows, GemvArgs& a) {
  if (!norm.w) return true;
  if (!gemv_norm_ok(norm, rows, a.in) || a.out > INT32_MAX) return false;
  a.norm_w = norm.w;
  a.norm_bf16 = norm.t == Elem::kBF16;
  a.norm_eps = norm.eps;
  return true;
}
}  // namespace

cudaError_t gemv_bf16_grouped(const GemvGroupCall& c) {
  GemvArgs a{};
  if (!fill_segments(c.segs, c.n_segs, c.x, c.ldx, c.rows, c.in, a, c.x16) || !set_norm(c.norm, c.rows, a))
    return cudaErrorInvalidValue;
  a.alpha = c.alpha;
  a.beta = c.beta;
  if (a.out == 0) return cudaSuccess;
  return launch_grouped(a, c.rows, false, c.stream);
}

cudaError_t gemv_bf16_swiglu(const GemvSwigluCall& c) {
  // Both segments name y; the kernel's SwiGLU mode writes only y (segment 0's output).
  const GemvSeg segs[2] = {{c.w_gate, c.ldg, c.y, c.ldy, c.out}, {c.w_up, c.ldu, c.y, c.ldy, c.out}};
  GemvArgs a{};
  if (!fill_segments(segs, 2, c.x, c.ldx, c.rows, c.in, a, c.x16) || !set_norm(c.norm, c.rows, a))
    return cudaErrorInvalidValue;
  a.alpha = 1.f;
  if (a.out == 0) return cudaSuccess;
  return launch_grouped(a, c.rows, true, c.stream);
}

namespace {
// One weight matrix's launch through v2 alone (v3 false) or v3 alone (the benchmark's entries).
cudaError_t launch_one(const GemvCall& c, bool v3) {
  const GemvSeg seg{c.w, c.ldw, c.y, c.ldy, c.out};
  GemvArgs a{};
  if (!fill_segments(&seg, 1, c.x, c.ldx, c.rows, c.in, a, v3 ? c.x16 : nullptr)) return cudaErrorInvalidValue;
  a.alpha = c.alpha;
  a.beta = c.beta;
  if (a.out == 0) return cudaSuccess;
  return v3 ? gemv_v3_launch(a, c.rows, false, knobs().pdl, c.stream)
            : launch_grouped(a, c.rows, false, c.stream, /*v3_ok=*/false);
}
}  // namespace

cudaError_t gemv_bf16_v2(const GemvCall& c) { return launch_one(c, false); }

cudaError_t gemv_bf16_v3(const GemvCall& c) { return launch_one(c, true); }

}  // namespace lragent::cuda
