// One optimizer step over the parameters this rank updates (its shard: every parameter under
// ZeRO-0): the global gradient norm (each element counted once whatever the sharding),
// clipping to optim.grad_clip, and AdamW with decoupled weight decay on matrices only.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

struct OptimizerStats {
  double grad_norm = 0;   // before clipping; NaN when a rank's loss was not finite (NonFiniteGuard)
  double clip_scale = 1;  // the factor gradients were multiplied by (1: not clipped)
  bool updated = true;    // false: the guard skipped the update (nothing was changed)
};

// The non-finite guard's part in the step (core/train/run_guard.h). `enabled`: a global gradient
// norm that is not finite skips the update on every rank, leaving the weights, the master
// weights and the Adam moments untouched. `loss_nonfinite`: this rank saw a non-finite loss; it
// makes this rank's squared norm NaN, which the norm's own reductions carry to every rank (the
// norm is agreed everywhere, so the flag costs no collective of its own).
struct NonFiniteGuard {
  bool enabled = false;
  bool loss_nonfinite = false;
};

// Beyond the shard group, where the rest of the global gradient norm lives: the other pipeline
// stages (their squared norms are summed over `pipeline`), and parameters held twice whose
// second copy must not count again (`not_counted`, by index into the store's table: the LM
// head's copy of the tied wte on the last stage; empty: every parameter counts).
// The tensor-parallel group (`tensor`) holds the other pieces of split parameters (their squares
// are summed over it); its replicated parameters are counted on tp rank 0 only (not_counted on
// the others).
struct NormScope {
  Comm* pipeline = nullptr;
  Comm* tensor = nullptr;
  std::vector<bool> not_counted;
};

// Expert parallel: the store of this rank's routed experts (core/model/expert_split.h), updated
// in the same step under the same clipping. Its squared norm adds up over its own shard group
// and over the ep group (each rank holds other experts) before it joins the dense part's.
struct ExpertOptimizerPart {
  ParamStore* store = nullptr;
  Comm* shard_group = nullptr;
  Comm* ep_group = nullptr;
  std::vector<bool> not_counted;  // like NormScope's, by index into the experts' table
};

// The update's kernels (one AdamW launch per parameter piece: about 150 for GPT-2 124M) as CUDA
// graphs (run.cuda_graphs): each store's launches recorded at its first update and replayed
// after, one launch a step. What changes from step to step (the learning rate, the bias
// corrections, the clip scale) goes to a device buffer before each replay (Ops::adamw_update's
// `step`); the norm and the guard's decision stay on the host, before. A recording the backend
// refuses turns them off, says why (take_fallback) and the update runs op by op.
class OptimizerGraphs {
 public:
  explicit OptimizerGraphs(Ops& ops) : ops_(ops) {}
  ~OptimizerGraphs();
  OptimizerGraphs(const OptimizerGraphs&) = delete;
  OptimizerGraphs& operator=(const OptimizerGraphs&) = delete;
  void use(bool on);  // off: the recordings are dropped
  bool on() const { return on_; }
  int recorded() const { return static_cast<int>(graphs_.size()); }
  long long replays() const { return replays_; }
  std::string take_fallback() { return std::exchange(fallback_, std::string()); }
  // AdamW over `store`'s shard, its gradient scaled by clip_scale.
  void update(ParamStore& store, const OptimSection& o, double lr, int t, double clip_scale);

 private:
  Ops& ops_;
  bool on_ = false;
  Tensor step_;  // AdamwStepScalars (f32 [4]), made when first turned on
  std::vector<std::pair<const ParamStore*, std::unique_ptr<RecordedWork>>> graphs_;
  long long replays_ = 0;
  std::string fallback_;
};

// t: the 1-based AdamW step (bias correction: the updates done so far, plus one). Reads
// store.grad_shard() (reduced by GradSync).
// shard_group: the ranks the shard is split over, whose squared norms add up to the global one
// (nullptr, or any group when the store holds one shard: nothing to add).
// graphs (optional): runs the updates (OptimizerGraphs::update).
OptimizerStats adamw_step(Ops& ops, ParamStore& store, const OptimSection& optim, double lr, int t,
                          Comm* shard_group = nullptr, const NormScope& scope = {},
                          const ExpertOptimizerPart* experts = nullptr, NonFiniteGuard guard = {},
                          OptimizerGraphs* graphs = nullptr);

}  // namespace pt
