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
//
// ZeRO-3 with FP8 layers (enable_fp8: precision.fp8 tensorwise, precision.fp8_weight_gather):
// the layers' FP8 weights travel as e4m3 codes, one byte a value (a quarter of fp32's, half of
// bf16's): each rank casts its piece of each weight with the whole weight's scale (its amax
// gathered over the shard and tensor-parallel groups: the scale Fp8Linear takes), the codes are
// all-gathered, and decoded into the working buffer; the layer's other parameters (norms,
// biases) travel in the compute dtype, packed. The decoded weights are exactly the values the FP8
// layer would quantise the weights to, and it quantises them again to the same values (at the
// same scale, or twice it when rounding brought the largest value down to half the format's
// range, where every value doubles exactly): the products equal those of a bf16 gather bit for
// bit, with half the bytes on the wire.
#pragma once
#include <vector>

#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/ops/ops.h"

namespace pt {

// Which parameters of `table` ZeRO-3 gathers in FP8 (ParamGather::enable_fp8) under `cfg`: the
// weights of the layers precision.fp8_layers names (the LM head's when untied: a tied head is the
// token embedding, whose lookup reads the values), when precision.fp8 is "tensorwise",
// precision.fp8_weight_gather is on and parallel.zero_stage is 3; all false otherwise (rowwise
// and delayed scales are not the gather's one scale per weight, so those weights travel in the
// compute dtype).
std::vector<bool> fp8_gathered_params(const ParamTable& table, const RunConfig& cfg);

class ParamGather {
 public:
  ParamGather(ParamStore& store, Ops& ops, Comm& shard);  // not owned
  ~ParamGather();
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  // The weights flagged in `fp8` (indexed like the store's table specs) travel in FP8 under
  // ZeRO-3 over several shards (no-op otherwise); `tp`: the group their tensor-parallel parts
  // are split over (not owned). Before the first acquire.
  void enable_fp8(const std::vector<bool>& fp8, Comm& tp);
  // Bytes enable_fp8's buffers take (the memory plan counts them): the largest layer's codes
  // gathered and this rank's piece of them, its other parameters packed (this rank's and
  // everyone's), and the amaxes and scales.
  static size_t fp8_scratch_bytes(const ShardLayout& layout, const ParamTable& table, const std::vector<bool>& fp8,
                                  DType compute, int tp);

  void acquire(int layer);  // idempotent while held
  void release(int layer);  // idempotent
  void gather_updated();

 private:
  // A layer's FP8 weights and other parameters, as ranges of its bucket (padded positions).
  struct Range {
    size_t begin = 0, end = 0;
  };
  struct Fp8Plan {
    std::vector<Range> weights, others;
    size_t packed = 0;  // the most non-FP8 elements any rank's piece holds
  };
  static std::vector<Fp8Plan> plan_fp8(const ShardLayout& layout, const ParamTable& table, const std::vector<bool>& fp8);
  // The buffers' sizes: the largest layer's (padded) bucket and piece, packed others and weights.
  struct Fp8Sizes {
    size_t codes = 0, piece = 0, packed = 0, weights = 0;
  };
  static Fp8Sizes fp8_sizes(const ShardLayout& layout, const std::vector<Fp8Plan>& plans);
  // The FP8 gather of `layer` into `w` from this rank's `piece` of it.
  void gather_fp8(int layer, const Fp8Plan& plan, Tensor piece, Tensor w);

  ParamStore& store_;
  Ops& ops_;
  Comm& shard_;
  const ShardLayout& layout_;
  std::vector<Tensor> working_;  // per layer, while gathered (ZeRO-3; with one shard a view of the shard)
  // enable_fp8: per layer (empty: none), the tp group, and the buffers (allocated once, at the
  // largest layer's size).
  std::vector<Fp8Plan> fp8_;
  Comm* tp_ = nullptr;
  Tensor codes_, own_codes_, packed_, own_packed_, amaxes_, scales_;
};

}  // namespace pt
