// Measured kernel speeds of one GPU model, and the time of one kernel call read from them: what
// `picotrain plan` builds a step's compute time from, operation by operation, instead of a flat
// share of the peak. The table is kernel_bench's --json output (bench/kernel_bench.cpp): its
// measured ceilings (device-to-device copy GB/s, large bf16 matmul TFLOP/s) and one row per op
// and shape (median time and rate). The compiled-in table is our H100's
// (core/plan/h100_kernel_table.cpp); `plan --kernels FILE` reads one measured on the user's GPU.
//
// How a call's time is found:
//   matmul      a measured row of the same direction (forward: 2·N·IC·OC FLOPs; backward: dinp
//               and dW, twice that) with the same IC and OC and N within a factor of 2: its
//               rate. Otherwise the fallback curve: a roofline at the table's own typical
//               efficiency, max(FLOPs / (FLOP ceiling x e), bytes / copy ceiling), where e is
//               the median over the table's measured matmul rows of that direction of
//               rate / FLOP ceiling (H100: 0.86 forward, 0.78 backward) and bytes the bf16
//               operands and result (2(N·IC + IC·OC + N·OC); backward twice that).
//   attention   causal flash attention, 4·B·H·T²·hd/2 FLOPs forward and 2.5x that backward:
//               the exact shape when measured; else the rate of the rows with the nearest head
//               size, interpolated linearly in log T between the measured sequence lengths
//               (held constant beyond the ends), the rows at one T averaged.
//               `plan --attention FILE` plans another library's attention (with_attention_of).
//   fp8 matmul  the table's fp8_matmul rows at the shape (kernel_bench_fp8.cpp) when it has them;
//               else none (the compiled-in table predates FP8): stage_compute.h's fallback.
//   memory-bound the rows whose op name starts with the name asked for (layernorm_backward,
//               gelu_forward, adamw_update (per tensor, ...): the rate of the one nearest in
//               bytes moved (log scale); an op never measured runs at the median fraction of
//               the copy ceiling over the table's memory-bound rows.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace pt {

struct KernelRow {
  std::string section, op, shape;
  bool flops = false;       // rate in TFLOP/s; else GB/s
  double median_ms = 0, rate = 0;
  double calls_per_step = 0;
  std::map<std::string, double> dims;  // the shape's "KEY=value" pairs (N, IC, OC, B, NH, T, hd, ...)
  double work() const { return rate * (flops ? 1e12 : 1e9) * median_ms * 1e-3; }  // FLOPs or bytes per call
};

class KernelTable {
 public:
  // kernel_bench --json's text; `source` names it in errors. Throws ConfigError for text that is
  // not such a table (the key that is missing or wrong).
  static KernelTable from_json(const std::string& text, const std::string& source);
  static KernelTable from_file(const std::string& path);
  // The compiled-in table: our H100 SXM measurement.
  static const KernelTable& h100();
  // The same table for a GPU of another speed: every FLOP rate times flop_scale, every bandwidth
  // times bandwidth_scale (used for a --gpu profile without a table measured on it).
  KernelTable scaled(double flop_scale, double bandwidth_scale, const std::string& what) const;

  // This table with its attention rows replaced by another library's, measured on some GPU: the
  // file of bench/attention_sdpa.py's JSON (PyTorch's scaled_dot_product_attention, one row per back end
  // and shape), the faster back end's forward and backward at each shape, their rates times
  // peak_tflops over the measuring GPU's dense bf16 peak (attention is bound by the tensor
  // cores). Throws ConfigError naming the file for one that cannot be read or is not such JSON.
  KernelTable with_attention_of(const std::string& path, double peak_tflops) const;

  // Seconds of one call (see the header comment for measured shapes and the fallback).
  double matmul_s(double n, double ic, double oc, bool backward) const;
  double attention_s(double batch, double heads, double seq, double head_dim, bool backward) const;
  double memory_s(const std::string& op, double bytes) const;
  // One FP8 product (precision.fp8) where the table measured it at the same IC and OC and N
  // within a factor of 2: kernel_bench's fp8_matmul rows (forward; backward: its dinp and dW rows
  // together). 0 where it did not: the planner then scales bf16's time (stage_compute.h).
  double measured_fp8_matmul_s(double n, double ic, double oc, bool backward) const;

  // The fallback curve's efficiencies (of the FLOP or copy ceiling), from the rows.
  double matmul_efficiency(bool backward) const;
  double memory_efficiency() const;

  std::string device, source;
  double flop_ceiling_tflops = 0, bandwidth_ceiling_gbps = 0;
  std::vector<KernelRow> rows;
};

// The H100 table's kernel_bench JSON (core/plan/h100_kernel_table.cpp).
const char* h100_kernel_table_json();

}  // namespace pt
