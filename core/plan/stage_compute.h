// The compute time of one micro-batch on each pipeline stage, kernel by kernel, from a table of
// measured kernel speeds (core/plan/kernel_table.h): every call one rank makes, as the trainer's
// stage makes it (core/model/decoder_stage.cpp; bench/kernel_bench_model.cpp times the same
// list), at the shapes this layout gives it. For a block, with N = micro_batch_size x seq_len /
// cp tokens on the rank, C = d_model, split by tp:
//   forward   2 norms (residual + layernorm; on N/tp tokens under sequence parallel), the q|k|v
//             matmul (C -> qkv_width/tp), attention (n_heads/tp heads, causal over seq_len, 1/cp
//             of the queries), the output projection (q_width/tp -> C), the MLP's up matmul
//             (C -> up_width/tp), its activation (GELU: read + write, SwiGLU: 2 reads + write
//             of the hidden) and the down matmul (hidden/tp -> C). A sparse block's MLP is the
//             router (C -> n_experts) and top_k x N rows through the experts' up and down.
//   backward  each matmul's backward (dinp and dW), attention's, the activation's (GELU 3
//             tensors, SwiGLU 5) and 2 norm backwards.
//   recompute selective: attention's forward again; full: the block's whole forward again.
// The first stage adds the embedding lookups and their backward (and the zeroing of the
// residual gradient); the last the final norm, the LM head (C -> padded vocab/tp) and the
// vocab-parallel cross-entropy.
// FP8 (precision.fp8, core/parallel/fp8_linear.h): each FP8 layer's product (qkv, attn_out, the
// dense MLP's or shared experts' up and down, the LM head and the routed experts, as fp8_layers
// says) takes the kernel table's
// measured FP8 time where it has the shape, else the same shape's bf16 time / fp8_speedup (the
// GPU's FP8 peak over its bf16 peak): no FP8 kernels are measured yet, so this is the documented
// fallback. Its casts add memory traffic at the table's memory-bound rate: forward, x and w each
// read twice (amax, then the cast) in the compute dtype and written as 1-byte codes; backward the
// same for dout, w^T, dout^T and x^T (the LM head casts its weight once per chunk of rows). The
// tiny amax all-gathers are not counted. The router stays bf16. Attention in FP8 (fp8_layers
// names attention; core/common/fp8_attention.h): its forward at bf16's time / fp8_speedup after
// a cast of q, k, v (read twice, written as codes); its backward bf16's after the same cast and
// a dequantised copy. Per step, outside the micro-batches: the optimizer's gradient
// norm, AdamW update and gradient zeroing over the rank's ZeRO shard of fp32 state.
#pragma once
#include <vector>

#include "core/config/run_config.h"
#include "core/plan/kernel_table.h"

namespace pt {

struct StageCompute {
  double forward_s = 0, backward_s = 0, recompute_s = 0;  // one micro-batch
  double fp8_casts_s = 0;  // of the three: the FP8 layers' casts
  double total_s() const { return forward_s + backward_s + recompute_s; }
};

// One entry per pipeline rank (all its chunks together), in rank order. fp8_speedup: the GPU's
// FP8 peak over its bf16 peak (Hardware::fp8_speedup); with precision.fp8 on it must be > 0
// (else ConfigError).
std::vector<StageCompute> stage_compute(const RunConfig& cfg, const KernelTable& kernels, double fp8_speedup = 0);

// The optimizer step of one rank holding `optimizer_params` parameters' fp32 state (its ZeRO
// shard): gradient norm, AdamW, zeroing the gradients.
double optimizer_step_s(const KernelTable& kernels, double optimizer_params);

}  // namespace pt
