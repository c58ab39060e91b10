// One optimizer step over every parameter: the global gradient norm (each element counted
// once), clipping to optim.grad_clip, and AdamW with decoupled weight decay on matrices only.
#pragma once
#include "core/config/run_config.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

struct OptimizerStats {
  double grad_norm = 0;   // before clipping
  double clip_scale = 1;  // the factor gradients were multiplied by (1: not clipped)
};

// t: the 1-based AdamW step (bias correction).
OptimizerStats adamw_step(Ops& ops, ParamStore& store, const OptimSection& optim, double lr, int t);

}  // namespace pt
