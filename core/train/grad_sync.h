// GradSync: turns each rank's gradients of one step into the gradient of the whole global
// batch, reduced over the dp x cp group in fp32, in the form the optimizer reads
// (ParamStore::grad_shard()). The loss gradient is already scaled by 1 / (global tokens), so
// a plain sum over ranks is the mean.
//
//  ZeRO-0  all-reduce each bucket of the full gradient over dp x cp.
//  ZeRO-1  reduce-scatter each bucket over the shard group: every rank receives the sum of its
//          own piece; with HSDP that piece is then all-reduced across the replicas.
//  ZeRO-2/3  the gradient never exists in full: each layer's gradient lives in a working buffer
//          during that layer's backward, is reduce-scattered into the rank's fp32 shard
//          accumulator as soon as the layer is done (every micro-step) and freed. Replicas
//          all-reduce the accumulated shard once, after the last micro-step.
//  One shard (a shard group of one rank) under ZeRO 1-3: the shard is the whole gradient
//          (ShardLayout::single_shard), so nothing is scattered or copied. ZeRO-1 reduces like
//          ZeRO-0 (the arena is the shard); ZeRO-2/3 attach each layer's range of the shard
//          itself as its working buffer. Every stage then holds ZeRO-0's buffers and computes
//          its bits.
//
// Order and overlap. Buckets are whole layers filled from the last layer down (ShardLayout),
// and each is launched the moment backward reports its last layer final (LayerHooks::
// grads_ready), i.e. in the order backward fills them. Under ZeRO 0-1 only the last micro-step
// of a step launches anything (earlier ones just accumulate locally). A ZeRO 0-1 bucket is
// started (Comm::start_all_reduce / start_reduce_scatter) and finish_step() waits for them all:
// on the CPU backend MPI collectives block, so each runs to completion inside backward; NCCL
// queues it on its communication stream and backward overlaps it. HSDP's second reduction and
// ZeRO-2/3's per-layer reduce-scatter (its working buffer is freed right after) complete in
// order. ZeRO-2/3 take a fresh working buffer per layer and micro-step from Ops::alloc; a GPU
// backend pools them.
#pragma once
#include <vector>

#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

class GradSync {
 public:
  // dp_cp: the gradient-reduction group (ZeRO-0); shard and replicate: the ZeRO groups
  // (shard = dp_cp without HSDP). Not owned.
  GradSync(ParamStore& store, Ops& ops, Comm& dp_cp, Comm& shard, Comm& replicate);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  void start_step();                 // this step's gradients start from zero
  void start_micro_step(bool last);  // last: this micro-step's backward completes the step
  void acquire_grads(int layer);     // ZeRO-2/3: a zeroed working buffer for the layer's gradient
  void grads_ready(int layer);       // the layer's gradient of this micro-step is final
  // After the last backward of the step: completes whatever is outstanding. From here on
  // store.grad_shard() holds the reduced gradient of this rank's shard.
  void finish_step();
  // Whether its reductions reach other ranks (a group of more than one): then the micro-steps
  // in which grads_ready reduces (the last one under ZeRO 0-1, every one under ZeRO 2-3) issue
  // collectives from inside backward.
  bool reduces_across_ranks() const { return dp_cp_.size() > 1 || shard_.size() > 1 || replicate_.size() > 1; }

 private:
  void reduce_bucket(size_t b);  // ZeRO 0-1
  void reduce_layer(int layer);  // ZeRO 2-3
  size_t bucket_index(int layer) const;
  Tensor& working(int layer);
  void drop_working(int layer);  // detaches the layer's gradient buffer and frees it if it is ours

  ParamStore& store_;
  Ops& ops_;
  Comm &dp_cp_, &shard_, &replicate_;
  const ShardLayout& layout_;
  bool last_micro_ = false;
  std::vector<int> layers_left_;  // per bucket: layers not yet final in this micro-step
  std::vector<bool> launched_;    // per bucket: reduced in this step (ZeRO 0-1)
  std::vector<Tensor> working_;   // per layer: its gradient buffer while attached (ZeRO 2-3)
  Tensor piece_sum_;              // ZeRO 2-3 over S > 1: one reduce-scatter's result before it is accumulated
};

}  // namespace pt
