// The trainer's multiple-choice scoring (trainer.h: mc_row_losses, eval.task): the forward pass
// of validation (PipelineExecutor::forward_only) with targets only on the endings' tokens, whose
// per-token losses are summed per row. core/eval/mc_score.h lays out the rows and scores them.
#include <algorithm>

#include "core/common/error.h"
#include "core/eval/mc_task.h"
#include "core/model/model_tokenizer.h"
#include "core/train/trainer.h"

namespace pt {

void Trainer::load_eval_task() {
  const EvalSection& ev = cfg_.eval;
  if (ev.task.empty()) return;
  const std::string name = run_tokenizer_name(cfg_);
  if (name.empty())
    throw ConfigError("eval.task=" + ev.task + " needs a tokenizer: set data.tokenizer (model.vocab_size=" +
                      std::to_string(cfg_.model.vocab_size) + " implies none)");
  const std::vector<McTokens> tokens =
      tokenize_mc_task(read_mc_task(ev.task, ev.max_examples), *shared_tokenizer(name));
  eval_task_ = std::make_unique<McLayout>(layout_mc_rows(tokens, cfg_.batch.seq_len));
  if (eval_task_->rows.empty())
    throw ConfigError("eval.task=" + ev.task + ": every example has an ending longer than batch.seq_len=" +
                      std::to_string(cfg_.batch.seq_len) + " tokens, so none can be scored");
}

std::string Trainer::eval_task_name() const {
  return cfg_.eval.name.empty() ? mc_task_name(cfg_.eval.task) : cfg_.eval.name;
}

bool Trainer::scores_task_after(int step) const {
  if (!eval_task_) return false;
  const int every = cfg_.eval.every_steps;
  return step == cfg_.schedule.total_steps || (every > 0 && step % every == 0);
}

std::optional<McScores> Trainer::score_eval_task() {
  if (!eval_task_) return std::nullopt;
  return score_mc(*eval_task_, mc_row_losses(*eval_task_));
}

std::vector<double> Trainer::mc_row_losses(const McLayout& layout) {
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len, cp = cfg_.parallel.cp;
  const int64_t rows = static_cast<int64_t>(layout.rows.size());
  const int64_t batches = (rows + B - 1) / B;
  // As in evaluate(): DP rank d takes batches d, d + dp, ...; every rank runs the same number of
  // forwards (ZeRO-3 gathers collectively), a rank past the end repeats batch 0 unused.
  const int64_t dp = cfg_.parallel.dp, rounds = (batches + dp - 1) / dp;
  const bool reads = executor_->has_embedding() || executor_->has_head();
  const size_t n = static_cast<size_t>(B) * T;
  global_inputs_.resize(n);
  global_targets_.resize(n);
  // Each row's loss lands in one slot, written by the one rank that scored it (its cp ranks'
  // parts added); the others add zeros, so the sum over ranks is exact and layout-independent.
  std::vector<double> sums(static_cast<size_t>(rows), 0.0);
  const int local_T = T / cp;
  for (int64_t round = 0; round < rounds; round++) {
    const int64_t i = round * dp + coord_.dp;
    const bool counted = i < batches;
    if (reads) {
      fill_mc_batch(layout, (counted ? i : 0) * B, B, T, global_inputs_.data(), global_targets_.data());
      take_cp_part(inputs_.data(), targets_.data());
    }
    executor_->forward_only(inputs_.data(), targets_.data());
    if (!counted || !executor_->has_head()) continue;
    const std::vector<float> losses = executor_->head_token_losses();
    for (int r = 0; r < B && i * B + r < rows; r++) {
      double s = 0;
      for (int t = 0; t < local_T; t++) s += losses[static_cast<size_t>(r) * local_T + t];
      sums[static_cast<size_t>(i * B + r)] = s;
    }
  }
  if (rows > 0) {
    groups_.dp_cp->all_reduce(sums.data(), sums.size());
    if (cfg_.parallel.pp > 1) groups_.pp->all_reduce(sums.data(), sums.size());
  }
  return sums;
}

}  // namespace pt
