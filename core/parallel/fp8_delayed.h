// Delayed scaling (precision.fp8 = "delayed"), as Transformer Engine's DelayedScaling recipe with
// the "max" amax algorithm: each FP8 operand's one scale comes from the largest magnitude it had
// over the last `history` optimizer steps, not from the tensor at hand. That saves, per product,
// the amax pass over each operand before its cast and, under tp/cp, the small all-gather of the
// parts' amaxes (Fp8Linear's dynamic path); the cast records the operand's amax as it reads it
// (Ops::fp8_quantize's record_amax), and one reduction per step merges what every rank recorded.
// The price: a tensor that grew past its history's amax saturates (satfinite) until the next
// step's scale catches up.
//
// One Fp8Delayed holds one pipeline chunk's state: for each of its FP8 layers ("sites", numbered
// by the chunk) and each scaled operand (x, w, dout) a record of this step and a history of
// `history` steps. A step:
//   begin_step()   zeroes the records (whatever evaluation between steps recorded is dropped);
//   the products   quantise with scale_amax() and max their operands' amaxes into record();
//   end_step()     takes the max of every rank's records over the stage's tp group and its
//                  dp x cp group, pushes it into the history (the oldest row goes) and takes the
//                  history's max as the next step's scale amaxes. A skipped step (non-finite)
//                  pushes nothing.
// Every rank of a stage ends each step with the same history (the max is exact and order-free),
// and it is the max over all the step's micro-batches, so it does not depend on the layout: dp,
// tp, cp, pp and gradient accumulation all scale exactly as one rank does, from the second step
// on. The first step has no history and scales dynamically, per product (has_history()).
//
// Checkpoints save each site's history oldest row first (histories) and restore it (restore),
// so a resumed run scales as the uninterrupted one would; a checkpoint without it (an earlier
// run without delayed scaling) starts the history afresh.
#pragma once
#include <vector>

#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class Fp8Delayed {
 public:
  enum Operand { kX, kW, kDout, kOperands };

  // `sites` FP8 layers, `history` steps (>= 1) of amaxes each, merged at the end of a step over
  // `tp` and `dp_cp` (the stage's tensor-parallel and data x context-parallel groups; nullptr:
  // a group of one). Neither is owned.
  Fp8Delayed(Ops& ops, int sites, int history, Comm& tp, Comm* dp_cp);
  // Bytes it allocates (the memory plan counts them): records, history and scale amaxes, and
  // the rows end_step gathers from the larger group.
  static size_t bytes(int sites, int history, int tp, int dp_cp);
  ~Fp8Delayed();
  Fp8Delayed(const Fp8Delayed&) = delete;
  Fp8Delayed& operator=(const Fp8Delayed&) = delete;

  int sites() const { return sites_; }
  int history() const { return history_; }
  // Whether some step has been recorded; until then the products scale dynamically.
  bool has_history() const { return recorded_; }
  // The amax the site's operand scales by (one f32): the largest of its history.
  Tensor scale_amax(int site, Operand o) const;
  // The step's running amax of the site's operand (one f32), for fp8_quantize's record_amax.
  Tensor record(int site, Operand o) const;

  void begin_step();
  // Collective over tp and dp_cp (each rank of both calls it, for each chunk in the same order)
  // when `keep`; a skipped step (keep false, on every rank alike) only discards.
  void end_step(bool keep);

  // Every site's history, [history, kOperands] floats each, oldest step first (rows never
  // recorded are zero and come first): one download for them all.
  std::vector<std::vector<float>> histories() const;
  // Sets every site's history from a checkpoint: `rows[site]` holds [n, kOperands] floats, oldest
  // first (n may differ from history(): the newest rows are kept, the missing ones are zero);
  // empty `rows` (a checkpoint without any): no history, the next step scales dynamically.
  void restore(const std::vector<std::vector<float>>& rows);

 private:
  size_t slot(int site, Operand o) const;
  void recompute_scale_amaxes();

  Ops& ops_;
  int sites_, history_;
  Comm& tp_;
  Comm* dp_cp_;
  bool recorded_ = false;  // a step pushed (or a history restored) since the history was (re)set
  int next_ = 0;   // the history row the next step overwrites (its oldest)
  Tensor records_;      // [sites * kOperands]
  Tensor history_rows_;  // [history, sites * kOperands]: row next_ the oldest
  Tensor scale_amaxes_;  // [sites * kOperands]: the max over the history's rows
  Tensor gathered_;      // [the larger group's size, sites * kOperands] for end_step; null for groups of one
};

}  // namespace pt
