#include "model/lora_apply.h"

#include <cassert>

namespace lragent {
namespace {

const LoraModule* module_of(const LoraAdapter* a, int layer, LoraTarget t) {
  if (!a) return nullptr;
  const auto& m = a->layers[static_cast<size_t>(layer)][static_cast<size_t>(t)];
  return m ? &*m : nullptr;
}

// Segments of one target whose adapters share a bit-identical A: one x·A for all of them.
struct ShrinkGroup {
  size_t target = 0;  // index into the stage's targets
  const LoraModule* lead = nullptr;
  std::vector<size_t> members;   // segment indices
  std::vector<int32_t> row_ids;  // [rows] the members' batch rows, in member order
  bool folded = false;           // x·A over all n rows, in the stage's matmul_group
  size_t xa = 0;                 // index into keep: [n or rows, rank]
};

}  // namespace

Status project_with_lora(Backend& be, int layer, const TensorView& x, std::span<const Backend::MatmulOut> base_outs,
                       std::span<const LoraTargetOut> targets, const std::vector<LoraSegment>& segs,
                       std::vector<Tensor>& keep, ForwardStats& stats, const NormedInput* norm) {
  const int64_t n = x.dim(0), in = x.dim(1);
  TensorView x_scratch = x;  // with `norm`: where the normed rows go when they are written
  // The products of x (with `norm`: of rms_norm(h)).
  auto products = [&](std::span<const Backend::MatmulOut> outs) {
    if (norm)
      be.rms_norm_matmul_group(*norm->h, *norm->weight, norm->eps, x_scratch, outs);
    else
      be.matmul_group(x, outs);  // one output: a plain matmul on every backend
  };
  // Segment s's module for target t, or null where its adapter does not adapt it or nothing reads
  // the result (LoraTargetOut::unused).
  auto module_at = [&](size_t t, size_t s) -> const LoraModule* {
    const LoraTargetOut& to = targets[t];
    if (to.unused && (*to.unused)[s]) return nullptr;
    return module_of(segs[s].adapter, layer, to.target);
  };
  // No segment adapts any target (a base-model batch, or an adapter without these modules): the
  // base projections only (every decode step of a base model passes here 4 times a layer).
  bool any = false;
  for (size_t t = 0; t < targets.size(); ++t)
    for (size_t s = 0; s < segs.size(); ++s) any = any || module_at(t, s) != nullptr;
  if (!any) {
    for (const LoraTargetOut& to : targets)
      if (to.lr_out) to.lr_out->assign(segs.size(), TensorView{});
    if (!base_outs.empty()) products(base_outs);
    return Status::Ok();
  }
  std::vector<ShrinkGroup> groups;
  for (size_t t = 0; t < targets.size(); ++t) {
    if (targets[t].lr_out) {
      targets[t].lr_out->clear();
      targets[t].lr_out->resize(segs.size());
    }
    std::vector<bool> done(segs.size(), false);
    for (size_t s = 0; s < segs.size(); ++s) {
      const LoraModule* lead = module_at(t, s);
      if (done[s] || !lead) continue;
      ShrinkGroup g;
      g.target = t;
      g.lead = lead;
      for (size_t u = s; u < segs.size(); ++u) {
        const LoraModule* m = module_at(t, u);
        if (done[u] || !m || !lead->same_a_as(*m)) continue;
        done[u] = true;
        g.members.push_back(u);
        for (int64_t r = 0; r < segs[u].n_rows; ++r) g.row_ids.push_back(static_cast<int32_t>(segs[u].row_begin + r));
      }
      const auto rows = static_cast<int64_t>(g.row_ids.size());
      if (rows == 0) continue;
      assert(lead->a.dim(1) == in && "LoRA A does not match the projection's input width");
      assert((be.device() == Device::kCpu || lead->a_dev.view().data) && "adapter not uploaded: call upload_adapter");
      g.folded = rows == n || n <= kLoraFoldRows;
      keep.push_back(be.alloc(DType::kF32, {g.folded ? n : rows, lead->rank}));
      if (!keep.back().view().data)
        return make_error(ErrorCode::kOutOfMemory, "{}: out of memory for a LoRA x·A of {} rows in layer {}", be.name(),
                          g.folded ? n : rows, layer);
      g.xa = keep.size() - 1;
      stats.lora_shrink_calls += 1;
      stats.lora_shrink_rows += g.folded ? n : rows;
      groups.push_back(std::move(g));
    }
  }
  // keep does not grow below: views of its tensors stay valid.
  std::vector<TensorView> xa(groups.size());  // per group: x·A [n or rows, rank]
  for (size_t i = 0; i < groups.size(); ++i) xa[i] = keep[groups[i].xa].view();

  // Shrinks of folded groups join the base projections (one grouped GEMV when decode-sized).
  std::vector<Backend::MatmulOut> outs(base_outs.begin(), base_outs.end());
  bool all_folded = true;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].folded)
      outs.push_back({&groups[i].lead->a_use(), nullptr, &xa[i]});
    else
      all_folded = false;
  }
  if (norm && !all_folded) {  // groups of their own read the normed rows: write them
    be.rms_norm(*norm->h, *norm->weight, norm->eps, x_scratch);
    norm = nullptr;
  }
  if (!outs.empty()) products(outs);
  for (size_t i = 0; i < groups.size(); ++i) {
    const ShrinkGroup& g = groups[i];
    if (g.folded) continue;
    // The group's rows as one matrix: a row range of x when consecutive, else gathered.
    const auto rows = static_cast<int64_t>(g.row_ids.size());
    const bool consecutive = g.row_ids.back() - g.row_ids.front() + 1 == rows;
    Tensor xg;  // [rows, in] when gathered
    if (!consecutive) {
      xg = be.alloc(DType::kF32, {rows, in});
      if (!xg.view().data)
        return make_error(ErrorCode::kOutOfMemory, "{}: out of memory for {} gathered LoRA rows in layer {}", be.name(),
                          rows, layer);
      be.gather_rows(x, g.row_ids.data(), rows, xg.view());
    }
    const TensorView xs = consecutive ? x.rows(g.row_ids.front(), g.row_ids.front() + rows) : xg.view();
    be.matmul(xs, g.lead->a_use(), nullptr, xa[i]);
  }

  // Expands: every (target, segment) of the stage in one call.
  std::vector<Backend::LoraExpandJob> jobs;
  for (size_t t = 0; t < targets.size(); ++t) {
    const LoraTargetOut& to = targets[t];
    assert((!to.defer || !to.base) && "deferred LoRA expands are in place");
    std::vector<int> seg_group(segs.size(), -1);   // group index of each adapted segment
    std::vector<int64_t> seg_off(segs.size(), 0);  // its first row in the group's x·A
    for (size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].target != t) continue;
      int64_t off = 0;
      for (size_t u : groups[i].members) {
        seg_group[u] = static_cast<int>(i);
        seg_off[u] = groups[i].folded ? segs[u].row_begin : off;
        off += segs[u].n_rows;
      }
    }
    for (size_t u = 0; u < segs.size(); ++u) {
      const LoraSegment& sg = segs[u];
      const bool adapted = seg_group[u] >= 0;
      TensorView xa_u;  // [n_rows, rank]
      if (adapted) xa_u = xa[static_cast<size_t>(seg_group[u])].rows(seg_off[u], seg_off[u] + sg.n_rows);
      if (to.lr_out) (*to.lr_out)[u] = xa_u;
      if (!to.y || sg.n_rows == 0 || (!adapted && !to.base)) continue;
      Backend::LoraExpandJob j;
      j.y = to.y->rows(sg.row_begin, sg.row_begin + sg.n_rows);
      if (to.base) j.base = to.base->rows(sg.row_begin, sg.row_begin + sg.n_rows);
      if (adapted) {
        const LoraModule* m = module_at(t, u);
        j.xa = xa_u;
        j.b = m->b_use();
        j.scale = m->scale;
      }
      (to.defer ? *to.defer : jobs).push_back(j);
    }
  }
  if (!jobs.empty()) be.lora_expand(jobs);
  return Status::Ok();
}

}  // namespace lragent
