// Model FLOPs per token and the device peak they are measured against (MFU).
//
// Two formulas, selected by logging.flops_formula; both count a forward + backward pass
// (x3 of the forward's 2 FLOPs per multiply-add) and neither counts activation recompute:
//   palm: 6*N + 12*L*d*T  — PaLM appendix B. N = parameters taking part in matmuls: every
//         parameter except the lookups, the position embedding and an untied token embedding
//         (Llama's: its lm_head is counted); a tied token embedding is counted once, as the LM
//         head. Grouped-query attention's smaller K/V projections are in N as they are; the
//         attention term is unchanged (scores and values are computed for every query head of
//         d = n_heads*head_dim channels). No causal discount.
//   llmc: 6*N + 6*L*d*T   — llm.c's estimate. N = all parameters (padded vocab included);
//         the attention term is halved for the causal mask.
// Here d = d_model, L = n_layers, T = the sequence length trained on. With mixture of experts N
// counts the ACTIVE parameters: each routed expert's weights times top_k / n_experts (a token
// multiplies by top_k of them), the router and shared experts in full; memory (the plan, the
// memory line) counts every expert.
#pragma once
#include <string>

#include "core/config/run_config.h"
#include "core/model/param_table.h"

namespace pt {

double flops_per_token(const ParamTable& table, const ModelSection& model, int seq_len, const std::string& formula);

// A one-line description of the formula for the log, e.g. "palm: 6N+12LdT, N=7.3M".
std::string flops_formula_description(const ParamTable& table, const ModelSection& model, const std::string& formula);

// Dense bf16 tensor-core peak in TFLOP/s for a GPU name (e.g. "NVIDIA H100 80GB HBM3"),
// or 0 when the name is not in the table.
double gpu_peak_tflops(const std::string& device_name);
// Dense FP8 tensor-core peak (fp32 accumulation) in TFLOP/s for a GPU name, or 0 when the
// GPU has no FP8 or is not in the table.
double gpu_fp8_peak_tflops(const std::string& device_name);

}  // namespace pt
