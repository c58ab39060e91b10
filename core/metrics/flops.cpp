#include "core/metrics/flops.h"

#include <cstdio>

#include "core/common/error.h"

namespace pt {

namespace {
// PaLM's N: the parameters a token's forward multiplies by. Not the position embedding nor an
// untied token embedding (lookups); a tied one is the LM head, a matmul.
double matmul_params(const ParamTable& t) {
  size_t lookups = 0;
  for (const ParamSpec& p : t.specs())
    if (p.role == ParamRole::position_embedding || (p.role == ParamRole::token_embedding && !p.also_head))
      lookups += p.numel;
  return static_cast<double>(t.total_numel() - lookups);
}
}  // namespace

double flops_per_token(const ParamTable& table, const ModelSection& m, int seq_len, const std::string& formula) {
  const double L = m.n_layers, d = m.d_model, T = seq_len;
  if (formula == "palm") return 6.0 * matmul_params(table) + 12.0 * L * d * T;
  if (formula == "llmc") return 6.0 * static_cast<double>(table.total_numel()) + 6.0 * L * d * T;
  throw ConfigError("logging.flops_formula=" + formula + " must be palm or llmc");
}

std::string flops_formula_description(const ParamTable& table, const ModelSection& m, const std::string& formula) {
  char buf[128];
  if (formula == "palm")
    std::snprintf(buf, sizeof buf, "palm: 6N+12LdT, N=%.2fM matmul params", matmul_params(table) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "llmc: 6N+6LdT, N=%.2fM params", table.total_numel() / 1e6);
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

}  // namespace pt
