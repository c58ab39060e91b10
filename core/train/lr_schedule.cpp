#include "core/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace pt {

namespace {
// Progress in [0, 1] through a decay that starts at `begin` and ends at the last step.
double progress(int step, int begin, int total_steps) {
  const int span = total_steps - 1 - begin;
  if (span <= 0) return 1.0;
  return std::clamp(static_cast<double>(step - begin) / span, 0.0, 1.0);
}
}  // namespace

double lr_at(const OptimSection& optim, const ScheduleSection& s, int step) {
  const double lr = optim.lr, r = s.min_lr_ratio;
  if (step < s.warmup_steps) return lr * (step + 1) / s.warmup_steps;
  if (s.decay == "constant") return lr;
  if (s.decay == "cosine") {
    const double p = progress(step, s.warmup_steps, s.total_steps);
    return lr * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * p)));
  }
  if (s.decay == "linear") return lr * (1.0 - (1.0 - r) * progress(step, s.warmup_steps, s.total_steps));
  // wsd: stable until the cooldown begins, then linear.
  const int cooldown_begin =
      std::max(s.warmup_steps, s.total_steps - static_cast<int>(std::lround(s.cooldown_fraction * s.total_steps)));
  if (step < cooldown_begin) return lr;
  return lr * (1.0 - (1.0 - r) * progress(step, cooldown_begin, s.total_steps));
}

}  // namespace pt
