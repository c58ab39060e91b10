#include "core/train/optimizer.h"

#include <cmath>

namespace pt {

OptimizerStats adamw_step(Ops& ops, ParamStore& store, const OptimSection& o, double lr, int t, Comm* shard_group,
                          const NormScope& scope) {
  OptimizerStats s;
  // Each element of the model lies in exactly one rank's shard (padding is zero), and HSDP
  // replicas hold copies of the same shard: summing squares over the shard group only counts
  // every element once. A stage's parameters lie in that stage only, except a tied copy, which
  // is left out here and counted where its original lives.
  const Tensor grads = store.grad_shard();
  const auto& specs = store.table().specs();
  double sum_sq = 0;
  if (scope.not_counted.empty()) {
    sum_sq = ops.sum_squares(grads, grads.numel);
  } else {
    for (const ShardPiece& piece : store.layout().my_pieces())
      if (!scope.not_counted[piece.param])
        sum_sq += ops.sum_squares(grads.slice(piece.shard_offset, piece.numel()), piece.numel());
  }
  if (shard_group && !store.holds_whole_shard()) shard_group->all_reduce(&sum_sq, 1);
  if (scope.pipeline) scope.pipeline->all_reduce(&sum_sq, 1);
  if (scope.tensor) scope.tensor->all_reduce(&sum_sq, 1);
  s.grad_norm = std::sqrt(sum_sq);
  if (o.grad_clip > 0 && s.grad_norm > o.grad_clip) s.clip_scale = o.grad_clip / s.grad_norm;
  for (const ShardPiece& piece : store.layout().my_pieces()) {
    const float wd = specs[piece.param].weight_decay ? static_cast<float>(o.weight_decay) : 0.0f;
    const size_t off = piece.shard_offset, n = piece.numel();
    ops.adamw_update(store.param_piece(piece), store.master_shard().slice(off, n), grads.slice(off, n),
                     store.adam_m_shard().slice(off, n), store.adam_v_shard().slice(off, n), n,
                     static_cast<float>(lr), static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                     static_cast<float>(o.eps), wd, t, static_cast<float>(s.clip_scale));
  }
  return s;
}

}  // namespace pt
