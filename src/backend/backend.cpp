// Backend pieces that do not depend on the device: the host fallbacks of the row picks
// (argmax_rows, sample_rows) and the CUDA entry point of builds without CUDA (the CUDA build
// defines it in cuda/cuda_backend.cpp).
#include "backend/backend.h"

#include <algorithm>
#include <vector>

#include <cassert>

namespace lragent {

namespace {

// x [rows, cols] f32 in host memory (a host copy for a device backend) and its row stride.
struct HostRows {
  Tensor copy;  // empty on the CPU
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
};
HostRows host_rows(Backend& be, const TensorView& x) {
  HostRows h;
  if (be.device() != Device::kCpu) h.copy = be.to_host(x);
  const TensorView v = be.device() == Device::kCpu ? x : h.copy.view();
  h.data = v.f32();
  h.rows = v.dim(0);
  h.cols = v.dim(1);
  h.ld = v.strides.empty() ? h.cols : v.strides[0];
  return h;
}

}  // namespace

void Backend::argmax_rows(const TensorView& x, int32_t* out) {
  assert(x.rank() == 2 && x.dtype == DType::kF32 && "argmax_rows takes f32 [rows, cols]");
  const HostRows h = host_rows(*this, x);
  for (int64_t r = 0; r < h.rows; ++r) out[r] = argmax_row(h.data + r * h.ld, h.cols);
}

void Backend::sample_rows(const TensorView& logits, std::span<const RowSampling> params, int32_t* out) {
  assert(logits.rank() == 2 && logits.dtype == DType::kF32 && "sample_rows takes f32 [rows, vocab]");
  assert(params.size() == static_cast<size_t>(logits.dim(0)) && "sample_rows takes one RowSampling per row");
  const HostRows h = host_rows(*this, logits);
  for (int64_t r = 0; r < h.rows; ++r) out[r] = sample_row(h.data + r * h.ld, h.cols, params[static_cast<size_t>(r)]);
}

void Backend::sample_rows_deferred(const TensorView& logits, std::span<const RowSampling> params) {
  assert(deferred_picks_.size() < kMaxDeferredPicks && "take_picks before queueing more passes");
  std::vector<int32_t> ids(static_cast<size_t>(logits.dim(0)));
  sample_rows(logits, params, ids.data());
  latest_picks_ = ids;
  deferred_picks_.push_back(std::move(ids));
}

void Backend::take_picks(int32_t* out, int64_t rows) {
  assert(!deferred_picks_.empty() && static_cast<int64_t>(deferred_picks_.front().size()) == rows &&
         "take_picks: no queued pass of that many rows");
  std::copy(deferred_picks_.front().begin(), deferred_picks_.front().end(), out);
  deferred_picks_.pop_front();
}

void Backend::embedding_fed(const TensorView& table, const int32_t* ids, const int32_t* feed, int n, TensorView& out) {
  embedding_from_host_picks(table, ids, feed, n, latest_picks_, out);
}

void Backend::embedding_from_host_picks(const TensorView& table, const int32_t* ids, const int32_t* feed, int n,
                                        const std::vector<int32_t>& picks, TensorView& out) {
  std::vector<int32_t> resolved(ids, ids + n);  // [n]
  for (int i = 0; i < n; ++i)
    if (feed[i] >= 0) {
      assert(static_cast<size_t>(feed[i]) < picks.size() && "embedding_fed: no deferred pick for that row");
      resolved[static_cast<size_t>(i)] = picks[static_cast<size_t>(feed[i])];
    }
  embedding(table, resolved.data(), n, out);
}

#ifndef LRAGENT_HAVE_CUDA
bool cuda_compiled() { return false; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error(ErrorCode::kUnsupported,
                    "--device cuda: this lragent was built without CUDA; rebuild with "
                    "`cmake -DLRAGENT_CUDA=ON` (needs nvcc) or use --device cpu");
}
#endif

}  // namespace lragent
