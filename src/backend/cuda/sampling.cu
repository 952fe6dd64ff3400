// Device-side token pick (sampling.cuh): the rules of backend/sampling_ref.h, no sorting, each
// logits row split over `blocks` blocks (layout_of below: about two blocks per SM in all, a
// share of at least kMinChunk ids each) so that one row does not wait on one SM. Every call
// launches the same 8 kernels (programmatic dependent launches, so each is scheduled while the
// previous one drains); a kernel whose step a row does not need returns at once for that row:
//   1. stats_kernel: per block, the largest and smallest finite logit, the finite count and the
//      greedy pick (argmax_rows_kernel's rule); it also zeroes the row's shared histogram and
//      arrival counter, so nothing is assumed of the workspace.
//   2-4. radix_kernel, steps kTopK0..2: the k-th largest finite logit by a radix select over an
//      order-preserving u32 key of the logit, 11 + 11 + 10 bits: each block counts the keys
//      that match the bits chosen so far by their next digit, and the row's last block to
//      arrive picks the digit where the count from the top reaches k. Step kTopK0 first reduces
//      the row's stats partials (every block the same way) and ends greedy rows and rows
//      without a finite logit (their pick is the argmax).
//   5-7. radix_kernel, steps kTopP0..2: the same select over the kept ids (finite, >= the top-k
//      logit) with each key weighted by its mass: the largest key z whose mass at and above z
//      reaches top_p · W (W = the kept mass, the sum of step kTopP0's histogram) is the lowest
//      logit top-p keeps; every key above it has S < top_p · W, z itself too, none below.
//   8. pick_kernel: per block the kept mass of its chunk of ids; the last block takes the
//      exclusive prefix over the blocks in id order, finds the block whose range holds u · W',
//      and scans that chunk (one contiguous run of ids per thread) for the smallest id whose
//      inclusive prefix exceeds u · W'. None (u · W' rounds to W' or more): the last kept id with
//      a positive weight.
// Masses are 64-bit fixed point: ceil(w · 2^F) with F = 64 - bit_width(vocab) (47 for a 128,256
// vocab), so a row's sum cannot overflow and every id with w > 0 (f32) has a mass >= 1. Integer
// sums are exact in any order: the histograms use integer atomics and the result is the same
// bits for any schedule or block count (a replayed graph picks what the eager launch picked).
// Comparisons against top_p · W and u · W' convert the integer sums to f64, so the error is one
// unit in 2^-F per id plus f64 rounding: rounding-boundary differences from the reference only.
// Logits are compared as floats (the keys only order them; -0 is keyed as +0).
// Workspace (caller-provided, layout_of): [rows, blocks] stats and pick partials, [rows] states,
// and for rows split over several blocks a [rows, 2048] u64 histogram and an arrival counter.
#include "backend/cuda/sampling.cuh"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>

#include "backend/cuda/device_props.h"
#include "backend/cuda/pdl.cuh"

namespace lragent::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kBins = 2048;                 // radix digits: bits 31..21, 20..10 (2048), 9..0 (1024)
constexpr int64_t kMinChunk = 2048;         // ids a block of a split row scans at least
constexpr int kMaxBlocksPerRow = kThreads;  // the pick's last block holds one partial per thread

// What a row needs next (RowState::next); radix_kernel runs one of the kTopK / kTopP steps.
enum Step : int32_t { kTopK0, kTopK1, kTopK2, kTopP0, kTopP1, kTopP2, kPick, kDone };

// One row's progress, written by one thread (the row's last block) for the next kernel.
struct RowState {
  double need;      // radix select: the count (k) or mass (top_p · W) the keys >= the answer reach
  uint64_t above;   // radix select: count / mass of the selected keys above the current digit
  uint32_t prefix;  // radix select: the key bits chosen so far
  int32_t next;     // Step
  float max;        // m, the largest finite logit
  float lowest;     // kept: finite and >= lowest
};
struct BlockStats {  // stats_kernel's result for one block's chunk
  float max, min;    // finite logits (-0 counted as +0)
  float arg_v;       // greedy pick: its value (NaN: none yet) and id
  int32_t n_finite, arg_i;
};
struct BlockPick {    // pick_kernel's result for one block's chunk
  uint64_t mass;      // fixed-point kept mass
  int64_t last;       // the last kept id with w > 0 (-1: none)
};

// Everything a kernel of one call needs.
struct Pass {
  const float* logits;  // [rows, ld]
  int64_t ld, vocab;
  const RowSampling* params;  // [rows]
  int32_t* out;               // [rows]
  int blocks;                 // per row
  int64_t chunk;              // ids per block (a multiple of 4: 16-byte loads stay aligned)
  float scale;                // 2^F, the fixed-point unit of a weight
  int step;                   // radix_kernel: its Step
  BlockStats* stats;          // [rows, blocks] stats_kernel's partials
  BlockPick* picks;           // [rows, blocks] pick_kernel's partials
  RowState* state;            // [rows]
  uint64_t* hist;             // [rows, kBins] radix counts / masses summed over blocks (blocks > 1)
  unsigned* arrived;          // [rows] blocks done with the current kernel (blocks > 1)
};

// Order-preserving u32 key of a float (sign flipped for positives, all bits for negatives);
// -0 becomes +0 first, so equal logits have one key.
__device__ __forceinline__ uint32_t radix_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.f);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t k) { return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k); }

// A sampled row's kept test and weights.
struct RowWeights {
  float lowest, max, temperature, scale;  // scale: 2^F
  __device__ bool kept(float v) const { return isfinite(v) && v >= lowest; }
  // The host reference's f32 expression (accurate expf: this file is built without fast math).
  __device__ float weight(float v) const { return expf((v - max) / temperature); }
  // Fixed point: w · 2^F is exact; rounded up, so w > 0 gives a mass >= 1 and w <= 1 one <= 2^F.
  __device__ uint64_t mass(float w) const { return __float2ull_ru(w * scale); }
};

// (value, index) pairs, argmax_rows_kernel's rule: the larger value wins, on equal values the
// lower index; NaN loses.
__device__ __forceinline__ bool arg_better(float v, int64_t i, float bv, int64_t bi) {
  if (v != v) return false;
  if (bv != bv) return true;
  return v > bv || (v == bv && i < bi);
}

template <class T>
__device__ __forceinline__ T shfl_xor(T v, int o) { return __shfl_xor_sync(kFull, v, o); }
template <>
__device__ __forceinline__ BlockStats shfl_xor(BlockStats v, int o) {
  return {shfl_xor(v.max, o), shfl_xor(v.min, o), shfl_xor(v.arg_v, o), shfl_xor(v.n_finite, o), shfl_xor(v.arg_i, o)};
}
struct Combine {
  __device__ BlockStats operator()(BlockStats a, const BlockStats& o) const {
    a.max = fmaxf(a.max, o.max);
    a.min = fminf(a.min, o.min);
    a.n_finite += o.n_finite;
    if (arg_better(o.arg_v, o.arg_i, a.arg_v, a.arg_i)) {
      a.arg_v = o.arg_v;
      a.arg_i = o.arg_i;
    }
    return a;
  }
};
struct Sum {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T> __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <class T> __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};
// Stats of no ids (arg_v NaN: loses to any number).
__device__ __forceinline__ BlockStats no_stats() { return {-INFINITY, INFINITY, __int_as_float(0x7fc00000), 0, 0}; }

// Block-wide reduction; every thread gets the result (lanes by butterfly, warps in index order:
// the same inputs always give the same bits). The leading barrier waits for earlier readers.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kWarps];  // [kWarps] per-warp partials
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, part[w]);
  return r;
}

// Exclusive prefix sum of v over the threads in index order; *total = the sum of all.
__device__ uint64_t block_exclusive_sum(uint64_t v, uint64_t* total) {
  __shared__ uint64_t part[kWarps];  // [kWarps] per-warp totals
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) part[warp] = incl;
  __syncthreads();
  uint64_t base = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) base = all;
    all += part[w];
  }
  *total = all;
  return base + incl - v;
}

// hist[bin] += x for each lane with ok. Lanes of a warp with the same bin add their sum once
// (radix digits bunch up: one shared atomic per lane would serialise), the sum formed as a tree
// over the group's lanes (log2(32) rounds at most). Every lane of the warp calls it.
__device__ __forceinline__ void warp_add(uint64_t* hist, bool ok, uint32_t bin, uint64_t x) {
  if (!__any_sync(kFull, ok)) return;
  const unsigned lane = threadIdx.x % 32;
  unsigned peers = __match_any_sync(kFull, ok ? bin : 0xffffffffu);  // lanes without a value: their own group
  const unsigned first = __ffs(peers) - 1;
  unsigned rank = __popc(peers & ((1u << lane) - 1));  // position among the group's lanes
  peers &= 0xfffffffeu << lane;                        // the group's higher lanes
  while (__any_sync(kFull, peers)) {
    // Each remaining lane adds its next remaining peer's sum; then the odd positions drop out.
    const int next = __ffs(peers);
    const uint64_t y = __shfl_sync(kFull, x, (next + 31) % 32);
    if (next) x += y;
    peers &= __ballot_sync(kFull, !(rank & 1));
    rank >>= 1;
  }
  if (ok && lane == first) atomicAdd(reinterpret_cast<unsigned long long*>(hist + bin), x);
}

// Calls f(value, id, ok) for the ids [lo, hi) of row: 16-byte loads of four logits when they are
// aligned, then the rest one by one. Every lane of a warp makes the same calls (ok false past
// the end), so f may use warp collectives.
template <class F>
__device__ __forceinline__ void for_ids(const float* row, int64_t lo, int64_t hi, F&& f) {
  const int lane = threadIdx.x % 32;
  int64_t done = lo;
  if ((reinterpret_cast<uintptr_t>(row + lo) & 15) == 0) {
    const int64_t n4 = (hi - lo) / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row + lo);
#pragma unroll 2
    for (int64_t j0 = threadIdx.x - lane; j0 < n4; j0 += kThreads) {
      const int64_t j = j0 + lane, i = lo + 4 * j;
      const bool ok = j < n4;
      const float4 q = ok ? r4[j] : float4{};
      f(q.x, i, ok);
      f(q.y, i + 1, ok);
      f(q.z, i + 2, ok);
      f(q.w, i + 3, ok);
    }
    done = lo + 4 * n4;
  }
  for (int64_t i0 = done + threadIdx.x - lane; i0 < hi; i0 += kThreads) {
    const int64_t i = i0 + lane;
    f(i < hi ? row[i] : 0.f, i, i < hi);
  }
}

// Loads another block's write (from L2: L1 is not coherent between blocks).
__device__ __forceinline__ uint64_t l2_load(const uint64_t* a) { return __ldcg(reinterpret_cast<const unsigned long long*>(a)); }
__device__ __forceinline__ int64_t l2_load(const int64_t* a) { return __ldcg(reinterpret_cast<const long long*>(a)); }

struct Block {  // this block's row and its share of the ids
  int64_t row;
  int b;  // index within the row
  int64_t lo, hi;
};
__device__ __forceinline__ Block block_of(const Pass& p) {
  Block k;
  k.row = blockIdx.x / p.blocks;
  k.b = static_cast<int>(blockIdx.x % p.blocks);
  k.lo = k.b * p.chunk;
  k.hi = min(k.lo + p.chunk, p.vocab);
  return k;
}

// Whether this block is the last of its row to get here (blocks > 1): the others' writes are
// then visible to it. Resets the counter for the next kernel (stream order).
__device__ bool arrive_last(unsigned* arrived, int blocks) {
  __shared__ bool last;
  __threadfence();  // this block's writes before its arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrived, 1u) == static_cast<unsigned>(blocks - 1);
    if (last) *arrived = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

__global__ void __launch_bounds__(kThreads) stats_kernel(const Pass p) {
  pdl_wait();
  pdl_release();
  const Block k = block_of(p);
  if (p.blocks > 1) {  // the radix steps add into these: start from zero
    for (int i = k.b * kThreads + threadIdx.x; i < kBins; i += p.blocks * kThreads) p.hist[k.row * kBins + i] = 0;
    if (k.b == 0 && threadIdx.x == 0) p.arrived[k.row] = 0;
  }
  BlockStats s = no_stats();
  for_ids(p.logits + k.row * p.ld, k.lo, k.hi, [&](float v, int64_t i, bool ok) {
    if (!ok) return;
    if (arg_better(v, i, s.arg_v, s.arg_i)) {
      s.arg_v = v;
      s.arg_i = static_cast<int32_t>(i);
    }
    if (isfinite(v)) {
      s.max = fmaxf(s.max, v + 0.f);  // + 0: -0 as +0, so the result does not depend on the order
      s.min = fminf(s.min, v + 0.f);
      ++s.n_finite;
    }
  });
  s = block_reduce(s, Combine());
  if (threadIdx.x == 0) p.stats[k.row * p.blocks + k.b] = s;
}

// Step kTopK0's start: the row's stats from its blocks' partials (every block reduces them the
// same way). Returns whether the row needs top-k; otherwise block 0 records what comes next
// (the pick of a greedy row or a row without a finite logit: the argmax).
__device__ bool begin_row(const Pass& p, const Block& k, const RowSampling& sp, RowState& st) {
  const BlockStats row =
      block_reduce(threadIdx.x < p.blocks ? p.stats[k.row * p.blocks + threadIdx.x] : no_stats(), Combine());
  const bool first = k.b == 0 && threadIdx.x == 0;
  if (!(sp.temperature > 0.f) || row.n_finite == 0) {
    if (first) {
      p.out[k.row] = row.arg_i;
      p.state[k.row].next = kDone;
    }
    return false;
  }
  st = {static_cast<double>(sp.top_k), 0, 0, kTopK0, row.max, row.min};
  if (sp.top_k > 0 && sp.top_k < row.n_finite) return true;
  st.next = sp.top_p < 1.f ? kTopP0 : kPick;
  if (first) p.state[k.row] = st;
  return false;
}

// The highest digit d of hist [bins] whose value at and above it, plus `above`, reaches need,
// and the value above d (the next round's `above`). Thread t owns the digits
// [bins - (t + 1) · per, bins - t · per), so the exclusive sum over the threads is the value
// above its digits.
struct Digit {
  uint32_t d;
  uint64_t above;
};
__device__ Digit select_digit(const uint64_t* hist, int bins, uint64_t above, double need) {
  __shared__ Digit found;
  const int per = bins / kThreads, top = bins - static_cast<int>(threadIdx.x) * per;
  uint64_t own = 0, total = 0;
  for (int d = top - per; d < top; ++d) own += hist[d];
  uint64_t run = above + block_exclusive_sum(own, &total);
  if (threadIdx.x == 0) found = {0, above};  // unreachable fallback: the caller keeps need reachable
  int best = -1;
  uint64_t best_above = 0;
  for (int d = top - 1; d >= top - per; --d) {  // the value from the top grows as d falls
    if (static_cast<double>(run + hist[d]) >= need) {
      best = d;
      best_above = run;
      break;
    }
    run += hist[d];
  }
  const int d = block_reduce(best, Max());
  if (d >= 0 && best == d) found = {static_cast<uint32_t>(d), best_above};
  __syncthreads();
  return found;
}

// One radix round (p.step): top-k counts keys, top-p weighs them by their mass. The invariant:
// the selected keys at and above the current prefix's range reach need, so a digit is found.
__global__ void __launch_bounds__(kThreads) radix_kernel(const Pass p) {
  __shared__ uint64_t hist[kBins];  // [kBins] count / mass per digit: this block's, then the row's
  pdl_wait();
  pdl_release();
  const Block k = block_of(p);
  const RowSampling sp = p.params[k.row];
  RowState st;
  if (p.step == kTopK0) {
    if (!begin_row(p, k, sp, st)) return;
  } else {
    st = p.state[k.row];
    if (st.next != p.step) return;
  }
  const bool mass = p.step >= kTopP0;
  const int round = p.step % 3, shift = round == 0 ? 21 : round == 1 ? 10 : 0, bits = round == 2 ? 10 : 11;
  const int bins = 1 << bits;
  if (round == 0) {
    st.prefix = 0;
    st.above = 0;
  }
  const RowWeights rw{st.lowest, st.max, sp.temperature, p.scale};
  const uint32_t chosen = shift + bits == 32 ? 0u : ~0u << (shift + bits);  // the key bits set by earlier rounds
  for (int i = threadIdx.x; i < bins; i += kThreads) hist[i] = 0;
  __syncthreads();
  for_ids(p.logits + k.row * p.ld, k.lo, k.hi, [&](float v, int64_t, bool ok) {
    const uint32_t key = radix_key(v);
    ok = ok && rw.kept(v) && (key & chosen) == st.prefix;
    const uint64_t x = !mass ? 1 : ok ? rw.mass(rw.weight(v)) : 0;
    warp_add(hist, ok, (key >> shift) & (bins - 1), x);
  });
  __syncthreads();
  if (p.blocks > 1) {  // the row's histogram: every block adds in, the last one reads it out
    uint64_t* g = p.hist + k.row * kBins;
    for (int i = threadIdx.x; i < bins; i += kThreads)
      if (hist[i]) atomicAdd(reinterpret_cast<unsigned long long*>(g + i), hist[i]);
    if (!arrive_last(p.arrived + k.row, p.blocks)) return;
    for (int i = threadIdx.x; i < bins; i += kThreads) {
      hist[i] = l2_load(g + i);
      g[i] = 0;  // for the next round
    }
    __syncthreads();
  }
  if (p.step == kTopP0) {  // W: the kept mass, this histogram's total
    uint64_t w = 0;
    for (int i = threadIdx.x; i < bins; i += kThreads) w += hist[i];
    st.need = static_cast<double>(sp.top_p) * static_cast<double>(block_reduce(w, Sum()));
    if (!(st.need > 0.0)) {  // top_p <= 0: only the largest logit(s)
      st.lowest = st.max;
      st.next = kPick;
      if (threadIdx.x == 0) p.state[k.row] = st;
      return;
    }
  }
  const Digit d = select_digit(hist, bins, st.above, st.need);
  st.prefix |= d.d << shift;
  st.above = d.above;
  st.next = p.step + 1;
  if (round == 2) {
    st.lowest = key_value(st.prefix);
    if (p.step == kTopK2 && !(sp.top_p < 1.f)) st.next = kPick;
  }
  if (threadIdx.x == 0) p.state[k.row] = st;
}

// The pick within chunk [lo, hi): the smallest id whose inclusive kept-mass prefix (starting at
// base, the mass before lo) exceeds cut. Each thread owns a contiguous run of ids; the thread
// whose run crosses cut walks it. The first id that crosses has a mass >= 1, hence w > 0.
__device__ int64_t find_in_chunk(const float* row, int64_t lo, int64_t hi, const RowWeights& rw, uint64_t base,
                                 uint64_t cut) {
  const int64_t per = (hi - lo + kThreads - 1) / kThreads;
  const int64_t i0 = min(lo + threadIdx.x * per, hi), i1 = min(i0 + per, hi);
  uint64_t own = 0, total = 0;
  for (int64_t i = i0; i < i1; ++i)
    if (rw.kept(row[i])) own += rw.mass(rw.weight(row[i]));
  uint64_t run = base + block_exclusive_sum(own, &total);
  int64_t found = INT64_MAX;
  if (run <= cut && cut < run + own) {
    for (int64_t i = i0; i < i1; ++i) {
      if (rw.kept(row[i])) run += rw.mass(rw.weight(row[i]));
      if (run > cut) {
        found = i;
        break;
      }
    }
  }
  return block_reduce(found, Min());
}

__global__ void __launch_bounds__(kThreads) pick_kernel(const Pass p) {
  pdl_wait();
  pdl_release();
  const Block k = block_of(p);
  const RowState st = p.state[k.row];
  if (st.next != kPick) return;
  const RowSampling sp = p.params[k.row];
  const RowWeights rw{st.lowest, st.max, sp.temperature, p.scale};
  const float* row = p.logits + k.row * p.ld;
  BlockPick own{0, -1};
  for_ids(row, k.lo, k.hi, [&](float v, int64_t i, bool ok) {
    if (!ok || !rw.kept(v)) return;
    const float w = rw.weight(v);
    own.mass += rw.mass(w);
    if (w > 0.f) own.last = max(own.last, i);
  });
  own.mass = block_reduce(own.mass, Sum());
  own.last = block_reduce(own.last, Max());
  BlockPick* parts = p.picks + k.row * p.blocks;  // [blocks] of this row
  if (threadIdx.x == 0) parts[k.b] = own;
  if (p.blocks == 1)
    __syncthreads();  // thread 0's partial
  else if (!arrive_last(p.arrived + k.row, p.blocks))
    return;

  // The row's last block: thread j holds block j's partial.
  __shared__ uint64_t chunk_base;  // the kept mass before the chosen chunk
  const bool holder = threadIdx.x < p.blocks;
  const BlockPick q = holder ? BlockPick{l2_load(&parts[threadIdx.x].mass), l2_load(&parts[threadIdx.x].last)}
                             : BlockPick{0, -1};
  uint64_t total = 0;
  const uint64_t before = block_exclusive_sum(q.mass, &total);
  const int64_t last = block_reduce(q.last, Max());
  const double target = static_cast<double>(sp.u) * static_cast<double>(total);
  int64_t id = -1;
  if (target < static_cast<double>(total)) {  // else (rounding, or u >= 1 or NaN): none exceeds it
    // Integer prefixes: prefix > target exactly when prefix > floor(target).
    const uint64_t cut = target > 0.0 ? static_cast<uint64_t>(target) : 0;
    const bool crosses = holder && before <= cut && cut < before + q.mass;
    if (crosses) chunk_base = before;
    const int j = block_reduce(crosses ? static_cast<int>(threadIdx.x) : INT_MAX, Min());  // barrier: chunk_base
    if (j != INT_MAX) {
      const int64_t lo = j * p.chunk, hi = min(lo + p.chunk, p.vocab);
      id = find_in_chunk(row, lo, hi, rw, chunk_base, cut);
    }
  }
  if (id < 0 || id == INT64_MAX) id = last;  // the largest logit has weight 1: last >= 0
  if (threadIdx.x == 0) p.out[k.row] = static_cast<int32_t>(id);
}

// How a call splits its rows and lays out its workspace (256-byte aligned arrays).
struct Layout {
  int blocks = 1;
  int64_t chunk = 0;
  size_t stats = 0, picks = 0, state = 0, hist = 0, arrived = 0, bytes = 0;  // offsets, total size
};
Layout layout_of(int64_t rows, int64_t vocab) {
  Layout l;
  const int64_t fill = std::max<int64_t>(1, 2 * sm_count() / std::max<int64_t>(rows, 1));
  const int64_t blocks = std::min({std::max<int64_t>(1, vocab / kMinChunk), fill, int64_t{kMaxBlocksPerRow}});
  l.chunk = ((vocab + blocks - 1) / blocks + 3) / 4 * 4;
  l.blocks = static_cast<int>((vocab + l.chunk - 1) / l.chunk);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const size_t parts = static_cast<size_t>(rows) * static_cast<size_t>(l.blocks);
  const size_t split = l.blocks > 1 ? static_cast<size_t>(rows) : 0;  // rows with a shared histogram
  l.stats = take(parts * sizeof(BlockStats));
  l.picks = take(parts * sizeof(BlockPick));
  l.state = take(static_cast<size_t>(rows) * sizeof(RowState));
  l.hist = take(split * kBins * sizeof(uint64_t));
  l.arrived = take(split * sizeof(unsigned));
  l.bytes = at;
  return l;
}

}  // namespace

size_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab) {
  return rows > 0 && vocab > 0 ? layout_of(rows, vocab).bytes : 0;
}

cudaError_t sample_rows(const SampleRowsParams& sp, cudaStream_t s) {
  if (sp.rows == 0) return cudaSuccess;
  if (sp.vocab < 1 || sp.vocab > INT32_MAX || sp.rows < 0 || sp.ld < sp.vocab || !sp.logits || !sp.params || !sp.out)
    return cudaErrorInvalidValue;
  const Layout l = layout_of(sp.rows, sp.vocab);
  if (!sp.workspace || sp.workspace_bytes < l.bytes || sp.rows * l.blocks > INT32_MAX) return cudaErrorInvalidValue;
  auto* ws = static_cast<char*>(sp.workspace);
  Pass p{};
  p.logits = sp.logits;
  p.ld = sp.ld;
  p.vocab = sp.vocab;
  p.params = sp.params;
  p.out = sp.out;
  p.blocks = l.blocks;
  p.chunk = l.chunk;
  p.scale = std::ldexp(1.f, 64 - std::bit_width(static_cast<uint64_t>(sp.vocab)));  // F: vocab · 2^F < 2^64
  p.stats = reinterpret_cast<BlockStats*>(ws + l.stats);
  p.picks = reinterpret_cast<BlockPick*>(ws + l.picks);
  p.state = reinterpret_cast<RowState*>(ws + l.state);
  p.hist = reinterpret_cast<uint64_t*>(ws + l.hist);
  p.arrived = reinterpret_cast<unsigned*>(ws + l.arrived);
  const dim3 grid(static_cast<unsigned>(sp.rows * l.blocks));
  cudaError_t e = launch_pdl(stats_kernel, grid, dim3(kThreads), 0, s, p);
  for (int step = kTopK0; step < kPick && e == cudaSuccess; ++step) {
    p.step = step;
    e = launch_pdl(radix_kernel, grid, dim3(kThreads), 0, s, p);
  }
  if (e == cudaSuccess) e = launch_pdl(pick_kernel, grid, dim3(kThreads), 0, s, p);
  return e;
}

}  // namespace lragent::cuda
