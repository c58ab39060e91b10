#include "core/report/run_summary.h"

#include <algorithm>

namespace pt {

double TimeBreakdown::compute() const { return std::max(0.0, steps - comm - bubble - data); }

double TimeBreakdown::other() const { return std::max(0.0, wall - steps - checkpoint - eval - sample); }

std::vector<double> TimeBreakdown::to_vector() const {
  std::vector<double> v = {wall, steps, comm, bubble, data, checkpoint, eval, sample, double(step_count), double(checkpoints)};
  v.insert(v.end(), phases.begin(), phases.end());
  return v;
}

TimeBreakdown TimeBreakdown::from_vector(const std::vector<double>& v) {
  TimeBreakdown t;
  t.wall = v.at(0);
  t.steps = v.at(1);
  t.comm = v.at(2);
  t.bubble = v.at(3);
  t.data = v.at(4);
  t.checkpoint = v.at(5);
  t.eval = v.at(6);
  t.sample = v.at(7);
  t.step_count = static_cast<int>(v.at(8) + 0.5);
  t.checkpoints = static_cast<int>(v.at(9) + 0.5);
  for (size_t i = 0; i < t.phases.size(); i++) t.phases[i] = v.at(10 + i);
  return t;
}

std::vector<Stall> find_stalls(const std::vector<Stall>& step_ms, double factor, double* median_ms) {
  std::vector<Stall> stalls;
  if (median_ms) *median_ms = 0;
  if (step_ms.size() < 3) return stalls;
  std::vector<double> ms;
  for (size_t i = 1; i < step_ms.size(); i++) ms.push_back(step_ms[i].ms);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  const double median = ms[ms.size() / 2];
  if (median_ms) *median_ms = median;
  for (size_t i = 1; i < step_ms.size(); i++)
    if (step_ms[i].ms > factor * median) stalls.push_back(step_ms[i]);
  return stalls;
}

}  // namespace pt
