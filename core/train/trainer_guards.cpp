// The trainer's guards against training on garbage (core/train/run_guard.h decides, this file
// acts): the corruption check's replay inside step(), and after each step the non-finite skip's
// log and limit and the loss-spike rollback.
#include <chrono>
#include <cmath>

#include "core/common/console.h"
#include "core/common/format.h"
#include "core/dist/comm_wait.h"
#include "core/metrics/process_clock.h"
#include "core/train/trainer.h"

namespace pt {

void Trainer::replay_check(StepResult& r) {
  const auto t0 = std::chrono::steady_clock::now();
  timeline_.enter(StepPhase::forward);
  std::vector<uint64_t> again;
  executor_->forward_only(inputs_.data(), targets_.data(), &again);  // micro-batch 0, as step() read it
  if (faults_.flip_replay_bit.erase(step_ + 1) && !again.empty()) again[0] ^= 1;
  const bool differs = again != executor_->recorded_fingerprints();
  // Every rank learns which ranks differ (one small reduction, every replay_every_steps steps).
  std::vector<double> flags(static_cast<size_t>(world_.size), 0.0);
  flags[static_cast<size_t>(world_.rank)] = differs ? 1.0 : 0.0;
  groups_.world->all_reduce(flags.data(), flags.size());
  r.replayed = true;
  for (int rank = 0; rank < world_.size; rank++)
    if (flags[static_cast<size_t>(rank)] > 0) r.replay_mismatches.push_back(rank);
  r.replay_s = seconds_since(t0);
  if (r.replay_mismatches.empty()) return;
  // Name the hosts (gathered at start-up): a faulty GPU is found by its machine.
  std::string who;
  for (int rank : r.replay_mismatches) who += (who.empty() ? "rank " : ", rank ") + rank_and_host(rank);
  const std::string what =
      format("corruption check: step %d's first micro-batch gave other bits when its forward ran again on %s, "
             "with the same weights and data: that device computes wrongly (a faulty GPU, its memory or driver)",
             step_ + 1, who.c_str());
  if (cfg_.run.replay_mismatch == "stop") {
    const std::string saved = ckpt_->path_on_disk();
    throw RuntimeError(what + "; the step was not applied. " +
                       (saved.empty() ? std::string("No checkpoint was saved yet.")
                                      : "The newest checkpoint is " + saved + ".") +
                       " Leave that host out and resume (checkpoint.resume=auto), or set run.replay_mismatch=warn "
                       "to train on and count");
  }
  if (world_.rank == 0) print_warning(what + " (run.replay_mismatch=warn: training goes on)");
}

std::string Trainer::describe_step_data(uint64_t first_token) const {
  const uint64_t tokens = tokens_per_step();
  return format("tokens %llu..%llu of data.train (%lld sequences of %d)", static_cast<unsigned long long>(first_token),
                static_cast<unsigned long long>(first_token + tokens - 1), static_cast<long long>(sequences_per_step()),
                cfg_.batch.seq_len);
}

bool Trainer::guard_step(const StepResult& r, RunSummary& summary) {
  const bool lead = world_.rank == 0;
  const auto& run = cfg_.run;
  if (r.skipped) {
    const bool ends = r.skip_ends_run;
    const ckpt::HealthRecord& h = guard_->record();
    summary.skipped_steps++;
    const std::string what = format("step %d: the %s is not finite (loss %g, gradient norm %g); its data: %s",
                                    step_, std::isfinite(r.loss) ? "gradient norm" : "loss", r.loss, r.grad_norm,
                                    describe_step_data(r.first_token).c_str());
    summary.guard_events.push_back("skipped " + what);
    if (lead)
      print_linef(Stream::out, "skipped   | %s: nothing updated (weights, master weights, Adam moments); %d in a row, "
                  "%d in the run (run.max_skipped_steps=%d)", what.c_str(), h.skipped_in_a_row, h.skipped_steps,
                  run.max_skipped_steps);
    if (ends) {
      // The state is the last good one (skips change nothing) and its cursor is past the bad
      // batches: saved, so that a resume with other settings goes on from here.
      if (ckpt_->step_on_disk() != step_) save_checkpoint();
      throw RuntimeError(format("%d steps in a row had a non-finite loss or gradient (run.max_skipped_steps=%d), the "
                                "last %s. The weights were never updated with them. The newest checkpoint is %s "
                                "(the state before them, its data past them): lower optim.lr or check the data "
                                "there, and resume with checkpoint.resume=auto",
                                h.skipped_in_a_row, run.max_skipped_steps, what.c_str(),
                                ckpt_->path_on_disk().c_str()));
    }
    return false;
  }
  std::optional<double> z = guard_->spike(r.loss);
  if (guard_->detects_spikes() && world_.size > 1) {
    // Rank 0's verdict for all (the comparison could tip differently on a rank whose reduced
    // loss rounded otherwise): one broadcast of one number.
    double verdict = lead ? (z ? *z : 0.0) : 0.0;
    groups_.world->all_reduce(&verdict, 1);
    z = verdict > 0 ? std::optional<double>(verdict) : std::nullopt;
  }
  if (!z) {
    guard_->accept_loss(r.loss);
    return false;
  }
  const int spike_step = step_;
  const uint64_t step_tokens = tokens_per_step();
  const std::string spike = format("step %d: loss %.4f is %.1f standard deviations above the mean of the last %d "
                                   "(run.spike=%g)", spike_step, r.loss, *z, run.spike_window, run.spike);
  if (guard_->record().rollbacks >= run.spike_max_rollbacks)
    throw RuntimeError(format("a loss spike at %s came after %d rollbacks (run.spike_max_rollbacks=%d): the run "
                              "keeps diverging. Lower optim.lr or raise run.spike, and resume from %s",
                              spike.c_str(), guard_->record().rollbacks, run.spike_max_rollbacks,
                              ckpt_->path_on_disk().c_str()));
  // Loads the master weights whole on every rank, which gives every rank its resident parameters.
  const std::optional<ckpt::TrainState> st = ckpt_->reload(*store_, ops_, train_data_->total_tokens());
  if (!st) {
    // Nothing to go back to yet: the spike is recorded and training goes on (it stays out of
    // the window, so it does not make the next one look normal).
    summary.guard_events.push_back("spike at " + spike + ", no checkpoint yet to roll back to");
    if (lead) print_linef(Stream::out, "spike     | %s; no checkpoint yet to roll back to: training goes on", spike.c_str());
    return false;
  }
  // Back to the checkpoint's weights, moments, step and health; the data skips what was read
  // since it, the spike's batch included, and run.spike_skip_steps batches more.
  const uint64_t resume_token = (cursor_ + step_tokens * static_cast<uint64_t>(run.spike_skip_steps)) %
                                train_data_->total_tokens();
  const uint64_t skipped_tokens = step_tokens * static_cast<uint64_t>(spike_step - st->step + run.spike_skip_steps);
  step_ = st->step;
  cursor_ = resume_token;
  summary.rollbacks++;
  const std::string back = format("rolled back to the checkpoint of step %d (%s), skipping %llu tokens of data "
                                  "(the %d batches since it and run.spike_skip_steps=%d more): step %d reads from "
                                  "token %llu",
                                  step_, ckpt_->path_on_disk().c_str(), static_cast<unsigned long long>(skipped_tokens),
                                  spike_step - step_, run.spike_skip_steps, step_ + 1,
                                  static_cast<unsigned long long>(cursor_));
  summary.guard_events.push_back("spike at " + spike + "; " + back);
  if (lead) print_linef(Stream::out, "spike     | %s; %s", spike.c_str(), back.c_str());
  guard_->rolled_back(st->health);
  return true;
}

}  // namespace pt
