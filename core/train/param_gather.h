// ParamGather: brings sharded parameters back together over the ZeRO shard group.
//  ZeRO-1/2  every rank updates only its piece of each bucket (in the resident parameter
//            arena); gather_updated() all-gathers the buckets in place after the optimizer step.
//  ZeRO-3    parameters stay sharded: acquire(layer) all-gathers one layer into a working buffer
//            just before the Stage uses it, release(layer) frees it right after, in forward and
//            again in backward. At most two layers are gathered at once (the embeddings, which
//            the tied LM head reads at the end of forward and the start of backward, and one
//            other), which is what the memory plan counts.
//  ZeRO-0    nothing is sharded; every call is a no-op.
//  One shard (any stage over a shard group of one rank): nothing is gathered either; ZeRO-3's
//            acquire attaches the layer's range of the parameter shard (the whole layer) instead
//            of a gathered copy, so no working buffer is allocated.
// Blocking on the CPU backend; the NCCL backend will prefetch the next layer while one computes.
#pragma once
#include <vector>

#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

class ParamGather {
 public:
  ParamGather(ParamStore& store, Ops& ops, Comm& shard);  // not owned
  ~ParamGather();
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  void acquire(int layer);  // idempotent while held
  void release(int layer);  // idempotent
  void gather_updated();

 private:
  ParamStore& store_;
  Ops& ops_;
  Comm& shard_;
  const ShardLayout& layout_;
  std::vector<Tensor> working_;  // per layer, while gathered (ZeRO-3; with one shard a view of the shard)
};

}  // namespace pt
