// Learning-rate schedule: linear warmup, then a decay down to min_lr_ratio * lr.
//   steps are 0-based; step s of warmup W uses lr * (s + 1) / W, so the first step is not 0
//   and step W - 1 reaches the full lr.
//   cosine:   lr * (r + (1 - r) * 0.5 * (1 + cos(pi * p)))  with p = (s - W) / (S - W)
//   linear:   lr * (1 - (1 - r) * p)
//   wsd:      warmup, stable at lr, then linear to r*lr over the final cooldown_fraction of steps
//   constant: lr after warmup
// where S = total_steps and r = min_lr_ratio. p reaches 1 at the last step (S - 1), so the
// final step runs at exactly r * lr.
#pragma once
#include "core/config/run_config.h"

namespace pt {

double lr_at(const OptimSection& optim, const ScheduleSection& schedule, int step);

}  // namespace pt
