#include "model/lora_apply.h"

#include <cstring>

namespace lragent {
namespace {

const LoraModule* module_of(const LoraAdapter* a, int layer, LoraTarget t) {
  if (!a) return nullptr;
  const auto& m = a->layers[static_cast<size_t>(layer)][static_cast<size_t>(t)];
  return m ? &*m : nullptr;
}

bool same_a(const LoraModule& x, const LoraModule& y) {
  if (&x == &y) return true;
  if (x.rank != y.rank || x.a_hash != y.a_hash || x.a.numel() != y.a.numel()) return false;
  return std::memcmp(x.a.view().data, y.a.view().data, x.a.view().nbytes()) == 0;
}

}  // namespace

void apply_lora(Backend& be, int layer, LoraTarget target, const TensorView& x, TensorView* y,
                const std::vector<LoraSegment>& segs, std::vector<Tensor>* lr_out, ForwardStats& stats) {
  const int64_t in = x.dim(1);
  if (lr_out) {
    lr_out->clear();
    lr_out->resize(segs.size());
  }
  std::vector<bool> done(segs.size(), false);
  for (size_t s = 0; s < segs.size(); ++s) {
    const LoraModule* lead = module_of(segs[s].adapter, layer, target);
    if (done[s] || !lead) continue;
    // The group: this segment and every later one whose A is bit-identical (shared-A adapters).
    std::vector<size_t> members;
    int64_t rows = 0;
    for (size_t u = s; u < segs.size(); ++u) {
      const LoraModule* m = module_of(segs[u].adapter, layer, target);
      if (!done[u] && m && same_a(*lead, *m)) {
        members.push_back(u);
        done[u] = true;
        rows += segs[u].n_rows;
      }
    }
    if (rows == 0) continue;
    // The group's rows as one matrix so x·A is one GEMM for the whole group: a row range of x
    // when they are consecutive (one segment, or neighbours: a decode step's usual case, where a
    // gather was one more kernel per adapted projection), else gathered.
    std::vector<int32_t> row_ids;  // [rows] batch rows of the group's members
    for (size_t u : members)
      for (int64_t r = 0; r < segs[u].n_rows; ++r) row_ids.push_back(static_cast<int32_t>(segs[u].row_begin + r));
    const bool consecutive = row_ids.back() - row_ids.front() + 1 == rows;
    Tensor xg;  // [rows, in] when gathered
    if (!consecutive) {
      xg = be.alloc(DType::kF32, {rows, in});
      be.gather_rows(x, row_ids.data(), rows, xg.view());
    }
    const TensorView xs = consecutive ? x.rows(row_ids.front(), row_ids.front() + rows) : xg.view();
    int64_t off = 0;
    Tensor xa = be.alloc(DType::kF32, {rows, lead->rank});  // [rows, rank]
    assert((be.device() == Device::kCpu || lead->a_dev.view().data) && "adapter not uploaded: call upload_adapter");
    be.matmul(xs, lead->a_use(), nullptr, xa.view());
    stats.lora_shrink_calls += 1;
    stats.lora_shrink_rows += rows;
    for (size_t u : members) {
      const LoraModule* m = module_of(segs[u].adapter, layer, target);
      TensorView xa_seg = xa.view().rows(off, off + segs[u].n_rows);
      if (y) {
        TensorView y_seg = y->rows(segs[u].row_begin, segs[u].row_begin + segs[u].n_rows);
        be.matmul(xa_seg, m->b_use(), nullptr, y_seg, m->scale, 1.0f);
      }
      if (lr_out && members.size() == 1) {
        (*lr_out)[u] = std::move(xa);  // the whole of x·A is this segment's: no copy (last use of xa)
      } else if (lr_out) {
        Tensor keep = be.alloc(DType::kF32, {segs[u].n_rows, m->rank});
        be.copy(xa_seg, keep.view());
        (*lr_out)[u] = std::move(keep);
      }
      off += segs[u].n_rows;
    }
  }
}

}  // namespace lragent
