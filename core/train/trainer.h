// Trainer: the training loop. Each step consumes one global batch
// (batch.global_batch_tokens tokens from the global cursor) as grad_accum_steps micro-batches,
// sums their gradients, clips, updates with AdamW at the scheduled learning rate, and logs.
// Validation runs every data.val_every_steps steps and at the last step.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/config/run_config.h"
#include "core/data/data_loader.h"
#include "core/dist/world.h"
#include "core/metrics/metrics_log.h"
#include "core/model/gpt2_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace pt {

struct StepResult {
  double loss = 0;  // token-weighted mean over the global batch
  double grad_norm = 0;
  double lr = 0;
};

class Trainer {
 public:
  Trainer(const RunConfig& cfg, const World& world, Ops& ops);
  ~Trainer();

  // One optimizer step on the next global batch.
  StepResult step();
  // Mean loss over the validation tokens (data.val_tokens; 0 = the whole val set).
  double evaluate();
  // The whole run: start-up report, steps with logging and validation, final summary.
  void run();

  int steps_done() const { return step_; }
  uint64_t cursor() const { return cursor_; }
  ParamStore& params() { return *store_; }

 private:
  void print_startup() const;
  int64_t sequences_per_step() const;

  RunConfig cfg_;
  World world_;
  Ops& ops_;
  ParamTable table_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Gpt2Stage> stage_;
  std::unique_ptr<DataLoader> train_data_, val_data_;
  std::vector<int32_t> inputs_, targets_;  // host staging for one micro-batch
  int step_ = 0;         // optimizer steps done
  uint64_t cursor_ = 0;  // global token position of the next step's first token
};

}  // namespace pt
