// RunGuard: the training loop's decisions that keep a run from training on garbage, apart from
// the loop so they can be tested alone. Its state is the checkpoint's HealthRecord, so a resumed
// run decides exactly as the uninterrupted one would.
//
//   Non-finite guard (run.max_skipped_steps > 0, the default): a step whose loss or global
//   gradient norm is a NaN or an infinity updates nothing (the trainer skips the optimizer);
//   the guard counts it, and max_skipped_steps of them in a row end the run.
//   Spike rollback (run.spike > 0): a loss more than run.spike standard deviations above the
//   mean of the last run.spike_window losses is a spike; the trainer reloads the newest
//   checkpoint and skips ahead in the data (PaLM's recipe). A spike's loss never joins the window.
//
// Every rank holds a guard and feeds it the same reduced values. A non-finite value is
// non-finite on every rank; whether a loss is a spike is a comparison that rounding could tip,
// so the trainer takes rank 0's answer (a one-number broadcast, only when run.spike is on).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/ckpt/manifest.h"
#include "core/config/run_config.h"

namespace pt {

// The z-score of `loss` against `recent` (mean and sample standard deviation); nullopt while
// fewer than `window` losses are known or when they are all equal (no spread to measure against).
std::optional<double> loss_zscore(const std::vector<double>& recent, int window, double loss);

class RunGuard {
 public:
  // `start`: the record of the checkpoint the run continues from (default: a fresh run). The
  // stretch towards the next checkpoint starts clean, as it did after that save.
  RunGuard(const RunSection& run, ckpt::HealthRecord start = {});

  bool guards_nonfinite() const { return run_.max_skipped_steps > 0; }
  bool detects_spikes() const { return run_.spike > 0; }

  // A step was skipped as non-finite. True when it ends the run: run.max_skipped_steps in a row.
  bool record_skip();
  // A step updated the weights: a run of skips, if any, is over.
  void record_update() { h_.skipped_in_a_row = 0; }
  // The z-score of a step's loss when it is a spike to roll back from (run.spike), else nullopt.
  std::optional<double> spike(double loss) const;
  // A step updated the weights with this loss, which was no spike: it joins the window.
  void accept_loss(double loss);
  // A checkpoint was saved: the stretch its successor covers starts clean.
  void saved() { h_.skipped_since_save = 0; }
  // The state after a rollback: the checkpoint's own, with this rollback counted.
  void rolled_back(const ckpt::HealthRecord& from_checkpoint);

  // The optimizer updates done after `steps` steps (AdamW's bias correction counts these).
  int updates(int steps) const { return steps - h_.skipped_steps; }
  const ckpt::HealthRecord& record() const { return h_; }

 private:
  RunSection run_;
  ckpt::HealthRecord h_;
};

}  // namespace pt
