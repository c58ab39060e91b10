#include "core/train/optimizer.h"

#include <cmath>

namespace pt {

OptimizerStats adamw_step(Ops& ops, ParamStore& store, const OptimSection& o, double lr, int t) {
  OptimizerStats s;
  const Tensor grads = store.all_grads();
  s.grad_norm = std::sqrt(ops.sum_squares(grads, grads.numel));
  if (o.grad_clip > 0 && s.grad_norm > o.grad_clip) s.clip_scale = o.grad_clip / s.grad_norm;
  for (const auto& p : store.table().specs()) {
    const float wd = p.weight_decay ? static_cast<float>(o.weight_decay) : 0.0f;
    ops.adamw_update(store.param(p), store.master(p), store.grad(p), store.adam_m(p), store.adam_v(p), p.numel,
                     static_cast<float>(lr), static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                     static_cast<float>(o.eps), wd, t, static_cast<float>(s.clip_scale));
  }
  return s;
}

}  // namespace pt
