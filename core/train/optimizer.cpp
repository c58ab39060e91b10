#include "core/train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace pt {

namespace {

// The squared norm of the gradient elements of `store`'s shard, over the ranks of `shard_group`
// (each element lies in exactly one rank's shard, padding is zero, and HSDP replicas hold copies
// of the same shard, so summing over the shard group counts every element once), leaving out
// the parameters marked in `not_counted` (empty: none).
double shard_sum_squares(Ops& ops, const ParamStore& store, Comm* shard_group, const std::vector<bool>& not_counted) {
  const Tensor grads = store.grad_shard();
  double sum_sq = 0;
  if (not_counted.empty()) {
    sum_sq = ops.sum_squares(grads, grads.numel);
  } else {
    for (const ShardPiece& piece : store.layout().my_pieces())
      if (!not_counted[piece.param])
        sum_sq += ops.sum_squares(grads.slice(piece.shard_offset, piece.numel()), piece.numel());
  }
  if (shard_group && !store.holds_whole_shard()) shard_group->all_reduce(&sum_sq, 1);
  return sum_sq;
}

// AdamW on every piece of `store`'s shard, its gradient scaled by clip_scale (or with the step's
// scalars read from `step` when given: Ops::adamw_update).
void update_shard(Ops& ops, ParamStore& store, const OptimSection& o, double lr, int t, double clip_scale,
                  Tensor step = {}) {
  const auto& specs = store.table().specs();
  const Tensor grads = store.grad_shard();
  for (const ShardPiece& piece : store.layout().my_pieces()) {
    const float wd = specs[piece.param].weight_decay ? static_cast<float>(o.weight_decay) : 0.0f;
    const size_t off = piece.shard_offset, n = piece.numel();
    ops.adamw_update(store.param_piece(piece), store.master_shard().slice(off, n), grads.slice(off, n),
                     store.adam_m_shard().slice(off, n), store.adam_v_shard().slice(off, n), n,
                     static_cast<float>(lr), static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                     static_cast<float>(o.eps), wd, t, static_cast<float>(clip_scale), step);
  }
}

}  // namespace

OptimizerGraphs::~OptimizerGraphs() {
  graphs_.clear();  // before the buffer they read
  if (step_) ops_.release(step_);
}

void OptimizerGraphs::use(bool on) {
  if (!on) graphs_.clear();
  if (on && !step_) step_ = ops_.alloc(4, DType::f32);
  on_ = on;
}

void OptimizerGraphs::update(ParamStore& store, const OptimSection& o, double lr, int t, double clip_scale) {
  if (!on_) return update_shard(ops_, store, o, lr, t, clip_scale);
  const AdamwStepScalars s = adamw_step_scalars(static_cast<float>(lr), static_cast<float>(o.betas[0]),
                                                static_cast<float>(o.betas[1]), t, static_cast<float>(clip_scale));
  static_assert(sizeof s == 4 * sizeof(float), "AdamwStepScalars is four floats");
  ops_.upload(step_, &s, DType::f32, 4);
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first == &store; });
  if (it == graphs_.end()) {
    std::string why;
    std::unique_ptr<RecordedWork> g = ops_.record([&] { update_shard(ops_, store, o, lr, t, clip_scale, step_); }, &why);
    if (!g) {
      fallback_ = "the optimizer's update could not be recorded: " + why;
      use(false);
      return update_shard(ops_, store, o, lr, t, clip_scale);
    }
    it = graphs_.insert(graphs_.end(), {&store, std::move(g)});
  }
  it->second->replay();
  replays_++;
}

OptimizerStats adamw_step(Ops& ops, ParamStore& store, const OptimSection& o, double lr, int t, Comm* shard_group,
                          const NormScope& scope, const ExpertOptimizerPart* experts, NonFiniteGuard guard,
                          OptimizerGraphs* graphs) {
  OptimizerStats s;
  // A stage's parameters lie in that stage only, except a tied copy, which is left out here and
  // counted where its original lives.
  double sum_sq = shard_sum_squares(ops, store, shard_group, scope.not_counted);
  if (guard.loss_nonfinite) sum_sq = std::nan("");
  if (experts) {
    double expert_sq = shard_sum_squares(ops, *experts->store, experts->shard_group, experts->not_counted);
    if (experts->ep_group) experts->ep_group->all_reduce(&expert_sq, 1);
    sum_sq += expert_sq;
  }
  if (scope.pipeline) scope.pipeline->all_reduce(&sum_sq, 1);
  if (scope.tensor) scope.tensor->all_reduce(&sum_sq, 1);
  s.grad_norm = std::sqrt(sum_sq);
  if (guard.enabled && !std::isfinite(s.grad_norm)) {
    s.updated = false;
    return s;
  }
  if (o.grad_clip > 0 && s.grad_norm > o.grad_clip) s.clip_scale = o.grad_clip / s.grad_norm;
  OptimizerGraphs op_by_op(ops);  // off: allocates nothing
  OptimizerGraphs& updates = graphs ? *graphs : op_by_op;
  updates.update(store, o, lr, t, s.clip_scale);
  if (experts) updates.update(*experts->store, o, lr, t, s.clip_scale);
  return s;
}

}  // namespace pt
