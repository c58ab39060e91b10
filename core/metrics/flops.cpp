#include "core/metrics/flops.h"

#include <cstdio>

#include "core/common/error.h"

namespace pt {

namespace {
// A parameter's share in one token's forward: a routed expert's weights are used by the
// top_k / n_experts of the tokens that choose it (mixture of experts); everything else by all.
double active_numel(const ParamSpec& p, const ModelSection& m) {
  const bool routed = p.role == ParamRole::expert_up || p.role == ParamRole::expert_down;
  return routed ? static_cast<double>(p.numel) * m.moe.top_k / m.moe.n_experts : static_cast<double>(p.numel);
}

// Every parameter a token uses (the active ones).
double active_params(const ParamTable& t, const ModelSection& m) {
  double n = 0;
  for (const ParamSpec& p : t.specs()) n += active_numel(p, m);
  return n;
}

// PaLM's N: the parameters a token's forward multiplies by. Not the position embedding nor an
// untied token embedding (lookups); a tied one is the LM head, a matmul.
double matmul_params(const ParamTable& t, const ModelSection& m) {
  double lookups = 0;
  for (const ParamSpec& p : t.specs())
    if (p.role == ParamRole::position_embedding || (p.role == ParamRole::token_embedding && !p.also_head))
      lookups += active_numel(p, m);
  return active_params(t, m) - lookups;
}
}  // namespace

double flops_per_token(const ParamTable& table, const ModelSection& m, int seq_len, const std::string& formula) {
  const double L = m.n_layers, d = m.d_model, T = seq_len;
  if (formula == "palm") return 6.0 * matmul_params(table, m) + 12.0 * L * d * T;
  if (formula == "llmc") return 6.0 * active_params(table, m) + 6.0 * L * d * T;
  throw ConfigError("logging.flops_formula=" + formula + " must be palm or llmc");
}

std::string flops_formula_description(const ParamTable& table, const ModelSection& m, const std::string& formula) {
  char buf[128];
  if (formula == "palm")
    std::snprintf(buf, sizeof buf, "palm: 6N+12LdT, N=%.2fM matmul params%s", matmul_params(table, m) / 1e6,
                  m.moe.enabled() ? " (active: top_k of the experts)" : "");
  else
    std::snprintf(buf, sizeof buf, "llmc: 6N+6LdT, N=%.2fM params%s", active_params(table, m) / 1e6,
                  m.moe.enabled() ? " (active: top_k of the experts)" : "");
  return buf;
}

double gpu_peak_tflops(const std::string& name) {
  // Dense bf16 tensor-core peaks from the vendors' datasheets (the sparse figure is 2x). The
  // first entry the name contains wins, so a name that contains another comes before it
  // ("H200 NVL" before "H200", "H100 PCIe" before "H100").
  struct Entry {
    const char* match;
    double tflops;
  };
  static const Entry table[] = {
      {"GH200", 989.4}, {"H200 NVL", 835.5}, {"H200", 989.4}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4},
      {"B200", 2250.0}, {"A100", 312.0},      {"A10G", 70.0},      {"L40S", 362.0}, {"L4", 121.0},
      {"RTX 4090", 165.2}, {"RTX 3090", 71.0},
  };
  for (const auto& e : table)
    if (name.find(e.match) != std::string::npos) return e.tflops;
  return 0.0;
}

double gpu_fp8_peak_tflops(const std::string& name) {
  // Dense FP8 (e4m3/e5m2 inputs, fp32 accumulation) peaks from the same datasheets: twice the
  // bf16 figure on Hopper and Blackwell datacenter parts and on L40S/L4; GeForce Ada accumulates
  // fp32 at half rate, so the RTX 4090's equals its bf16 figure. Ampere has no FP8.
  struct Entry {
    const char* match;
    double tflops;
  };
  static const Entry table[] = {
      {"GH200", 1978.9}, {"H200 NVL", 1671.0}, {"H200", 1978.9}, {"H100 PCIe", 1513.0}, {"H100 NVL", 1671.0},
      {"H100", 1978.9},  {"B200", 4500.0},     {"L40S", 733.0},  {"L4", 242.0},         {"RTX 4090", 165.2},
  };
  for (const auto& e : table)
    if (name.find(e.match) != std::string::npos) return e.tflops;
  return 0.0;
}

}  // namespace pt
