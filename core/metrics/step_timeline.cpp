#include "core/metrics/step_timeline.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace pt {

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::forward: return "forward";
    case StepPhase::backward: return "backward";
    case StepPhase::pp_comm: return "pp_comm";
    case StepPhase::grad_sync: return "grad_sync";
    case StepPhase::optimizer: return "optimizer";
  }
  return "?";
}

double PhaseTimes::total_ms() const { return std::accumulate(ms.begin(), ms.end(), 0.0); }

std::string describe_phases(const PhaseTimes& t, double step_ms, double data_ms) {
  const double share = step_ms > 0 ? 100.0 / step_ms : 0.0;
  std::string s;
  char buf[128];
  for (int p = 0; p < kStepPhases; p++) {
    const double ms = t.ms[static_cast<size_t>(p)];
    if (ms <= 0) continue;
    std::snprintf(buf, sizeof buf, "%s %.1f ms (%.0f%%), ", step_phase_name(static_cast<StepPhase>(p)), ms, ms * share);
    s += buf;
  }
  const double outside = std::max(0.0, step_ms - t.total_ms());
  std::snprintf(buf, sizeof buf, "outside the device timeline %.1f ms (%.0f%%: data %.1f ms)", outside, outside * share,
                data_ms);
  return s + buf;
}

void StepTimeline::start(StepPhase first) {
  ops_.clear_time_marks();
  marks_.clear();
  running_ = true;
  current_ = first;
  marks_.push_back({ops_.record_time_mark(), first});
}

void StepTimeline::enter(StepPhase p) {
  if (!running_ || p == current_) return;
  current_ = p;
  marks_.push_back({ops_.record_time_mark(), p});
}

PhaseTimes StepTimeline::finish() {
  PhaseTimes t;
  if (!running_) return t;
  running_ = false;
  const int end = ops_.record_time_mark();
  ops_.synchronize();
  for (size_t i = 0; i < marks_.size(); i++)
    t[marks_[i].opens] += ops_.ms_between_marks(marks_[i].id, i + 1 < marks_.size() ? marks_[i + 1].id : end);
  return t;
}

}  // namespace pt
