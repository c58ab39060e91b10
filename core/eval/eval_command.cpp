#include "core/eval/eval_command.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/manifest.h"
#include "core/common/console.h"
#include "core/common/error.h"
#include "core/eval/mc_score.h"
#include "core/eval/mc_task.h"
#include "core/model/model_tokenizer.h"
#include "core/train/trainer.h"

namespace pt {

namespace fs = std::filesystem;
using json = nlohmann::json;

EvalModel::EvalModel(const std::string& path, int rank) {
  if (ckpt::is_hf_model_folder(path)) {
    // Each rank imports its own copy: no rank waits on another's file system before start-up.
    temp_dir_ = (fs::temp_directory_path() /
                 ("picotrain_eval_" + std::to_string(::getpid()) + "_" + std::to_string(rank)))
                    .string();
    fs::remove_all(temp_dir_);
    step_dir_ = ckpt::import_hf(path, temp_dir_);
  } else {
    step_dir_ = ckpt::resolve_checkpoint_path(path, "eval --checkpoint");
  }
  const ckpt::CheckpointReader reader(step_dir_);
  model_ = ckpt::model_from_manifest(reader.manifest(), step_dir_);
}

EvalModel::~EvalModel() {
  std::error_code ec;
  if (!temp_dir_.empty()) fs::remove_all(temp_dir_, ec);
}

RunConfig eval_run_config(const EvalCommand& c, const EvalModel& m, int world_size) {
  if (c.shards.empty() && c.task.empty())
    throw ConfigError("eval: nothing to score: give --shards (token shards: loss and perplexity) and/or --task "
                      "(a multiple-choice task: accuracy)");
  json j = c.config.empty() ? json::object() : read_config_file(c.config);
  // The model is the checkpoint's (its moe section included); a training config's derived and
  // step-shaped keys would only conflict with an evaluation's layout.
  RunConfig shape;
  shape.model = m.model();
  const json resolved = config_to_json(shape);
  j["model"] = resolved["model"];
  j["moe"] = resolved["moe"];
  if (j.contains("parallel")) j["parallel"].erase("dp");
  if (!j.contains("batch") || !j["batch"].contains("seq_len")) j["batch"]["seq_len"] = m.model().max_seq_len;
  j["batch"]["global_batch_tokens"] = 0;
  j["batch"].erase("grad_accum_steps");
  // data.train must name something to pass the rules; the evaluation-only trainer reads none.
  j["data"] = {{"train", c.shards.empty() ? std::string("(none)") : c.shards}, {"val", c.shards},
               {"val_tokens", c.tokens}};
  j["eval"] = json::object();  // the task is this command's, scored with the checkpoint's tokenizer
  j["checkpoint"] = {{"resume", m.step_dir()}, {"dir", fs::path(m.step_dir()).parent_path().string()}};
  RunConfig cfg = config_from_json(j, c.overrides, world_size);
  cfg.data.train.clear();
  return cfg;
}

namespace {

// One line of the scores file per scored example: what the PyTorch reference recomputes.
void write_scores(const std::string& path, const McLayout& layout, const McScores& s) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw ConfigError("eval --scores " + path + ": cannot be written");
  for (size_t x = 0; x < s.examples.size(); x++) {
    const McExampleScore& e = s.examples[x];
    const McRow& first = layout.rows[layout.first_row[x]];
    json endings = json::array();
    for (int k = 0; k < layout.endings[x]; k++) {
      const McRow& row = layout.rows[layout.first_row[x] + static_cast<size_t>(k)];
      endings.push_back(std::vector<int32_t>(row.tokens.begin() + static_cast<std::ptrdiff_t>(row.context), row.tokens.end()));
    }
    const json line = {{"example", e.example},
                       {"label", e.label},
                       {"context", std::vector<int32_t>(first.tokens.begin(),
                                                        first.tokens.begin() + static_cast<std::ptrdiff_t>(first.context))},
                       {"endings", endings},
                       {"loss_sum", e.loss_sum},
                       {"loss_mean", e.loss_mean},
                       {"pred", e.pred},
                       {"pred_norm", e.pred_norm}};
    out << line.dump() << '\n';
  }
  out.flush();
  check(out.good(), "writing " + path + " failed (disk full?)");
}

}  // namespace

void run_eval_command(const EvalCommand& c, const EvalModel& m, const RunConfig& cfg, const World& world, Ops& ops) {
  const bool lead = world.rank == 0;
  const ModelSection& model = m.model();
  // The task's tokens, on every rank alike (before the trainer, so a bad file stops every rank
  // before its first collective).
  std::unique_ptr<McLayout> layout;
  std::string tokenizer_name;
  if (!c.task.empty()) {
    const std::unique_ptr<Tokenizer> tok = tokenizer_for_checkpoint(c.checkpoint, model, c.tokenizer, c.tokenizer_dir);
    tokenizer_name = tok->name();
    layout = std::make_unique<McLayout>(
        layout_mc_rows(tokenize_mc_task(read_mc_task(c.task, c.max_examples), *tok), cfg.batch.seq_len));
  }
  Trainer trainer(cfg, world, ops);
  const auto& p = cfg.parallel;
  if (lead)
    print_linef(Stream::out,
                "eval      | %s%s: %s, %d layers, d_model %d, %d heads, vocab %d; dp %d x tp %d x pp %d x cp %d, batches "
                "of %d x %d tokens; %s",
                c.checkpoint.c_str(), m.step_dir() == c.checkpoint ? "" : (" (" + m.step_dir() + ")").c_str(),
                model.arch.c_str(), model.n_layers, model.d_model, model.n_heads, model.vocab_size,
                p.dp, p.tp, p.pp, p.cp, cfg.batch.micro_batch_size, cfg.batch.seq_len,
                ops.device_description().c_str());
  if (!c.shards.empty()) {
    const double loss = trainer.evaluate();
    const int64_t tokens = trainer.val_batches() * cfg.batch.micro_batch_size * cfg.batch.seq_len;
    if (lead)
      print_linef(Stream::out, "shards    | %s: %lld tokens%s: loss %.6f, perplexity %.4f", c.shards.c_str(),
                  static_cast<long long>(tokens), c.tokens == 0 ? " (all, in whole batches)" : "", loss, std::exp(loss));
  }
  if (layout) {
    const McScores s = score_mc(*layout, trainer.mc_row_losses(*layout));
    if (lead) {
      print_linef(Stream::out,
                  "task      | %s (%s tokenizer): %lld examples scored, %lld skipped (an ending longer than "
                  "batch.seq_len=%d), %lld with the context cut from the left: acc %.4f (%lld), acc_norm %.4f (%lld)",
                  c.task.c_str(), tokenizer_name.c_str(), static_cast<long long>(s.count()),
                  static_cast<long long>(s.skipped), cfg.batch.seq_len, static_cast<long long>(s.truncated), s.acc(),
                  static_cast<long long>(s.correct), s.acc_norm(), static_cast<long long>(s.correct_norm));
      if (!c.scores.empty()) write_scores(c.scores, *layout, s);
    }
  }
}

}  // namespace pt
