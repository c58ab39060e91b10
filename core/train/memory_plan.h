// The "will it fit?" arithmetic for one rank: bytes of parameters, gradients, master weights,
// optimizer state and activations under a ZeRO layout, from the ParamTable (through the
// ShardLayout) and the micro-batch shape alone, allocating nothing. The trainer prints it at
// start; a `plan` command can print it for layouts it never runs.
//
// Per parameter, with Ψ elements, S shard ranks, compute dtype size c (2 for bf16, 4 for fp32):
//   ZeRO-0  params cΨ, grads 4Ψ, master 4Ψ (0 when c = 4: the params are the master), Adam 8Ψ
//   ZeRO-1  params cΨ, grads 4Ψ (+ 4Ψ/S, the reduced shard), master 4Ψ/S, Adam 8Ψ/S
//   ZeRO-2  params cΨ, grads 4Ψ/S (+ working layers), master 4Ψ/S, Adam 8Ψ/S
//   ZeRO-3  params cΨ/S (+ working layers; 0 extra when c = 4: the shard is the master),
//           grads 4Ψ/S (+ working layers), master 4Ψ/S, Adam 8Ψ/S
// With S = 1 every stage is ZeRO-0's line: the shard is the whole arena, so ParamStore keeps no
// second copy of it (no reduced shard, no f32 master beside f32 params) and ZeRO-2/3 use each
// layer in place in the shard (no working layers).
// "Working layers" are the layers ZeRO-2/3 hold in full at the peak: the embeddings (the tied
// LM head keeps them from the end of forward to the start of backward, and their gradient
// lives through all of backward) plus the largest other layer. Ψ/S is padded up to whole
// elements per bucket, so every rank of a layout holds the same number of bytes.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/decoder_stage.h"
#include "core/model/model_parallel.h"
#include "core/model/pipeline_stages.h"
#include "core/model/shard_layout.h"
#include "core/tensor/tensor.h"

namespace pt {

struct MemoryPlan {
  int zero_stage = 0;
  int shard_count = 1;
  size_t params = 0;          // compute dtype, held for the whole run (arena or shard)
  size_t params_working = 0;  // ZeRO-3: layers gathered at the peak
  size_t grads = 0;           // fp32, held for the whole run (arena and/or shard)
  size_t grads_working = 0;   // ZeRO-2/3: layer gradient buffers at the peak, + one reduced piece
  size_t master = 0;          // fp32 master weights (0 when they are the params)
  size_t optimizer = 0;       // Adam m and v
  size_t activations = 0;     // every micro-batch in flight, what the recompute mode keeps (decoder_stage.h)
  size_t experts = 0;         // expert parallel: of the above, the store of this rank's routed experts
  size_t total() const;
  // "params 0.1 MiB, grads ..., total ...": one line for the start-up log.
  std::string describe() const;
};

// "12.34 MiB": how the memory lines of the log write a size (the plan's and the measured).
std::string format_mib(size_t bytes);

// What a backend really holds next to the plan's total for the same rank, e.g. "allocated
// 10.01 MiB, peak 12.50 MiB (plan 12.50 MiB); GPU used 1200.00 MiB of 81559.00 MiB" (the GPU
// part only where the backend knows the device's figures).
std::string describe_memory_use(const MemoryUse& use, size_t plan_total);

MemoryPlan plan_memory(const ShardLayout& layout, DType compute_dtype, size_t activation_bytes);
// Expert parallel: adds the store of a rank's routed experts (core/model/expert_split.h), laid out
// by `experts` over its own shard group, to `plan` (the dense store's), and records it in
// plan.experts. ZeRO-2/3 hold one of its layers in full at a time (it has no embeddings).
void add_expert_memory(MemoryPlan& plan, const ShardLayout& experts, DType compute_dtype);

// Bytes of the activations (and backward scratch) of a decoder stage (any architecture) running the blocks and ends
// of `layers` with `slots` micro-batches in flight under `recompute`, each of the per-rank shape
// `dims` (tensor, sequence and context parallel: model_parallel.h), from the shapes: the
// buffers DecoderStage allocates (see its header for what each mode keeps), and the context-
// parallel attention's scratch (cp_impl).
size_t decoder_activation_bytes(const StageDims& dims, CpImpl cp_impl, DType compute_dtype, const StageLayers& layers,
                             StageSlots slots, Recompute recompute, const Fp8Recipe& fp8 = {});
// Of the above, the FP8 products' scratch (core/parallel/fp8_linear.h) for the layers `fp8`
// puts in FP8, and delayed scaling's state (fp8_delayed.h, merged over dims.dp_cp ranks): 0 when
// it puts none.
size_t fp8_scratch_bytes(const StageDims& dims, const StageLayers& layers, const Fp8Recipe& fp8, DType compute_dtype);
// The FP8 sites of a pipeline chunk running `layers` of `arch` under `fp8` (Fp8Sites' numbering;
// none when `fp8` puts no layer of the chunk in FP8).
Fp8Sites fp8_sites(const Fp8Recipe& fp8, const StageLayers& layers, const Architecture& arch);
// The shapes of the layers `fp8` puts in FP8, as this rank's products see them (per tp rank; the
// LM head's with the rows of one chunk of its logits in `compute_dtype`).
std::vector<Fp8Linear::Shape> fp8_layer_shapes(const StageDims& dims, const StageLayers& layers, const Fp8Recipe& fp8,
                                               DType compute_dtype);
// B x T micro-batches on one rank (no tensor or context parallel).
size_t decoder_activation_bytes(const ModelSection& model, int B, int T, DType compute_dtype, const StageLayers& layers,
                             StageSlots slots, Recompute recompute);
// The whole model, one micro-batch, no recompute.
size_t decoder_activation_bytes(const ModelSection& model, int B, int T, DType compute_dtype);

}  // namespace pt
