#include "core/train/run_guard.h"

#include <cmath>

namespace pt {

std::optional<double> loss_zscore(const std::vector<double>& recent, int window, double loss) {
  if (window < 2 || static_cast<int>(recent.size()) < window) return std::nullopt;
  double mean = 0;
  for (double x : recent) mean += x;
  mean /= static_cast<double>(recent.size());
  double var = 0;
  for (double x : recent) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / static_cast<double>(recent.size() - 1));
  if (!(sd > 0)) return std::nullopt;
  return (loss - mean) / sd;
}

RunGuard::RunGuard(const RunSection& run, ckpt::HealthRecord start) : run_(run), h_(std::move(start)) {
  h_.skipped_since_save = 0;
}

bool RunGuard::record_skip() {
  h_.skipped_steps++;
  h_.skipped_in_a_row++;
  h_.skipped_since_save++;
  return guards_nonfinite() && h_.skipped_in_a_row >= run_.max_skipped_steps;
}

std::optional<double> RunGuard::spike(double loss) const {
  if (!detects_spikes()) return std::nullopt;
  const auto z = loss_zscore(h_.recent_losses, run_.spike_window, loss);
  return z && *z > run_.spike ? z : std::nullopt;
}

void RunGuard::accept_loss(double loss) {
  if (!detects_spikes()) return;
  h_.recent_losses.push_back(loss);
  const size_t window = static_cast<size_t>(run_.spike_window);
  if (h_.recent_losses.size() > window)
    h_.recent_losses.erase(h_.recent_losses.begin(), h_.recent_losses.end() - static_cast<std::ptrdiff_t>(window));
}

void RunGuard::rolled_back(const ckpt::HealthRecord& from_checkpoint) {
  const int rollbacks = h_.rollbacks + 1;
  h_ = from_checkpoint;
  h_.skipped_since_save = 0;
  h_.rollbacks = rollbacks;
}

}  // namespace pt
