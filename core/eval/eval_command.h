// picotrain eval: scores a trained model (a picotrain checkpoint, or a Hugging Face folder
// imported for the run into a temporary checkpoint) on
//   - llm.c token shards: the mean loss and the perplexity over --tokens tokens (Trainer::evaluate);
//   - a multiple-choice task in HellaSwag's JSONL format (core/eval/mc_task.h, mc_score.h): acc
//     and acc_norm, as llm.c scores HellaSwag.
// The model runs through the trainer's own machinery (an evaluation-only Trainer: no training
// data, the checkpoint as checkpoint.resume), so every layout of `picotrain train` works: under
// mpirun the layout comes from --config and --set as for train (parallel.*, batch.micro_batch_size,
// batch.seq_len: default the model's max_seq_len), and the examples are split over the
// data-parallel ranks with a result that does not depend on the layout. The model's shape is the
// checkpoint's, whatever the config says.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/dist/world.h"
#include "core/ops/ops.h"

namespace pt {

struct EvalCommand {
  std::string checkpoint;  // a step_N directory, a checkpoint directory (its latest) or a Hugging Face folder
  std::string shards;      // glob of llm.c token shards; "": no loss
  int64_t tokens = 0;      // of the shards, rounded down to whole batches; 0: all of them
  std::string task;        // HellaSwag-format JSONL; "": none
  int64_t max_examples = 0;  // the task's first examples; 0: all
  std::string config;        // a run config for the layout and batch; "": the defaults
  std::vector<std::string> overrides;  // --set, after the config
  std::string tokenizer, tokenizer_dir;  // as sample's; "": the checkpoint's
  std::string scores;  // write each example's token ids and ending losses here (JSONL); "": no
};

// The model a command scores: its checkpoint step directory, a Hugging Face folder first
// imported into a temporary one of this rank, removed with this object.
class EvalModel {
 public:
  EvalModel(const std::string& path, int rank);
  ~EvalModel();
  EvalModel(const EvalModel&) = delete;
  EvalModel& operator=(const EvalModel&) = delete;
  const std::string& step_dir() const { return step_dir_; }
  const ModelSection& model() const { return model_; }

 private:
  std::string step_dir_, temp_dir_;
  ModelSection model_;
};

// The evaluation-only run config (see the file comment). Throws ConfigError.
RunConfig eval_run_config(const EvalCommand& c, const EvalModel& model, int world_size);

// Runs the evaluation on every rank (collective); rank 0 prints the results and writes the scores
// file. Throws ConfigError for a command that names nothing to score, a bad task file, or a
// tokenizer that does not fit.
void run_eval_command(const EvalCommand& c, const EvalModel& model, const RunConfig& cfg, const World& world,
                      Ops& ops);

}  // namespace pt
