// kernel_bench's reports, written from the rows once every table has run: the markdown (printed, and
// --md) with the ceilings, one table per model shape with its calls, milliseconds and share per
// optimizer step, the attention table and the shapes not timed; and the JSON (--json) with the same
// rows and the step model's totals, which bench/bench_summary.py reads.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "bench/kernel_bench.h"
#include "core/common/build_info.h"

namespace pt::kernel_bench {
namespace {

// The work of one call in the markdown's units.
std::string human_work(const Row& r) {
  if (r.flops) return fmt("%.1f GFLOP", r.work / 1e9);
  if (r.work >= 1e9) return fmt("%.2f GB", r.work / 1e9);
  if (r.work >= 1e6) return fmt("%.1f MB", r.work / 1e6);
  return fmt("%.1f KB", r.work / 1e3);
}

}  // namespace

std::string markdown(const Bench& b, const RunInfo& run, const std::vector<ModelShape>& models) {
  const std::string& device = run.device;
  const std::string& date = run.date;
  const double peak = run.peak;
  const bool cuda = run.cuda;
  std::string md;
  md += "# picotrain kernel benchmark\n\n";
  md += "- device: " + device + "\n- date: " + date + "\n- build: " + build_description() + "\n";
  md += "- bandwidth ceiling (device-to-device copy, measured): " + fmt("%.0f GB/s", b.bw_ceiling) + "\n";
  std::string matmul_shape;
  for (const Row& r : b.rows)
    if (r.section == "ceiling" && r.flops) matmul_shape = r.shape;
  md += "- FLOP ceiling (matmul_forward " + matmul_shape + ", measured): " + fmt("%.1f TFLOP/s", b.flop_ceiling);
  if (peak > 0) md += fmt(" = %.1f%% of the datasheet dense bf16 peak", 100 * b.flop_ceiling / peak) + fmt(" (%.1f TFLOP/s)", peak);
  md += cuda ? "\n- timing: CUDA events, median of the reps, L2 flushed before each rep. "
              : "\n- timing: host clock, median of the reps (--smoke: the CPU backend at tiny shapes; not a benchmark). ";
  md += "Work is the floor an op must "
        "move (bytes) or the model FLOPs; attention FLOPs count causal as half (FlashAttention's convention), "
        "backward = 2.5 x forward. `% ceil`: of the measured copy bandwidth (bytes rows) or matmul rate (FLOP rows); "
        "LOW: a memory-bound op under 70% of the bandwidth.\n\n";
  auto table = [&](const std::string& section, bool step) {
    md += "| op | shape | median us | work | formula | achieved | % ceil |";
    md += step ? " calls/step | ms/step | % of step |\n|---|---|---|---|---|---|---|---|---|---|\n"
               : "\n|---|---|---|---|---|---|---|\n";
    double total = 0;
    for (const Row& r : b.rows)
      if (r.section == section) total += r.per_step * r.median_ms;
    for (const Row& r : b.rows) {
      if (r.section != section) continue;
      const bool low = !r.flops && r.section != "ceiling" && r.fraction < 0.7 && r.work > 1e6;
      md += "| " + r.op + " | " + r.shape + " | " + fmt("%.1f", r.median_ms * 1e3) + " | " + human_work(r) + " | " +
            r.formula + " | " + fmt(r.flops ? "%.1f TFLOP/s" : "%.0f GB/s", r.rate) + " | " +
            fmt("%.1f%%", 100 * r.fraction) + (low ? " LOW" : "") + " |";
      if (step) {  // two appends: `" " + fmt(...)` draws a false -Wrestrict from GCC 12 in this file
        md += " ";
        md += fmt("%g", r.per_step) + " | " + fmt("%.2f", r.per_step * r.median_ms) + " | " +
              (r.per_step > 0 && total > 0 ? fmt("%.1f%%", 100 * r.per_step * r.median_ms / total) : "") + " |";
      }
      md += "\n";
    }
    return total;
  };
  md += "## Ceilings\n\n";
  table("ceiling", false);
  for (const ModelShape& m : models) {
    md += "\n## " + m.name + ": L=" + std::to_string(m.L) + " C=" + std::to_string(m.C) + " NH=" +
          std::to_string(m.NH) + " B=" + std::to_string(m.B) + " T=" + std::to_string(m.T) +
          " accum=" + std::to_string(m.accum) + "\n\n";
    const double total = table(m.name, true);
    const double tokens = double(m.B) * m.T * m.accum;
    md += "\nSum of kernel time per optimizer step (" + fmt("%.0f", tokens) + " tokens): " + fmt("%.1f ms", total) +
          fmt(", i.e. at most %.0f tokens/s", tokens / (total * 1e-3)) +
          " if nothing else took time. Compare with the measured step time of `picotrain train`; the difference is "
          "launch gaps, host synchronisation and work not listed here.\n";
    // The biggest items first: where the step's GPU time goes.
    std::vector<const Row*> top;
    for (const Row& r : b.rows)
      if (r.section == m.name && r.per_step > 0) top.push_back(&r);
    std::sort(top.begin(), top.end(),
              [](const Row* a, const Row* c) { return a->per_step * a->median_ms > c->per_step * c->median_ms; });
    md += "\nLargest shares: ";
    for (size_t i = 0; i < top.size() && i < 8; i++)
      md += (i ? ", " : "") + top[i]->op + fmt(" %.1f%%", 100 * top[i]->per_step * top[i]->median_ms / total);
    md += "\n";
  }
  bool any_attention = false, any_llama = false, any_moe = false;
  for (const Row& r : b.rows) {
    any_attention |= r.section == "attention";
    any_llama |= r.section == "llama-1b";
    any_moe |= r.section == "moe";
  }
  if (any_llama) {
    md += "\n## llama-1b: the ops a Llama block adds (kernel_bench_llama.cpp), not in a step above\n\n";
    table("llama-1b", false);
  }
  if (any_moe) {
    md += "\n## moe: a small Mixtral's routing and expert products (kernel_bench_moe.cpp), grouped and per expert\n\n";
    table("moe", false);
  }
  if (any_attention) {
    md += "\n## Attention (compare with bench/attention_sdpa.py at the same shapes)\n\n";
    md += "Causal; NKV= in the shape: grouped-query (NKV key/value heads), else multi-head. The FLOPs do not "
          "depend on NKV.\n\n";
    table("attention", false);
  }
  if (!b.failures.empty()) {
    md += "\n## Not timed\n\n| section | shape | why |\n|---|---|---|\n";
    for (const auto& f : b.failures) md += "| " + f.section + " | " + f.shape + " | " + f.error + " |\n";
  }
  return md;
}

// The rows, the ceilings and the step model's totals as JSON (dump(1), no trailing newline).
std::string json_report(const Bench& b, const RunInfo& run, const std::vector<ModelShape>& models) {
  nlohmann::json j;
  j["device"] = run.device;
  j["date"] = run.date;
  j["build"] = {{"commit", build_info().commit}, {"tree", build_info().tree}};
  j["datasheet_peak_tflops"] = run.peak;
  j["bandwidth_ceiling_gbps"] = b.bw_ceiling;
  j["flop_ceiling_tflops"] = b.flop_ceiling;
  j["warmup"] = run.warmup;
  j["reps"] = run.reps;
  if (run.attention) {
    j["attention_warmup"] = run.attention_warmup;
    j["attention_reps"] = run.attention_reps;
  }
  for (const ModelShape& m : models) {
    double total = 0;
    for (const Row& r : b.rows)
      if (r.section == m.name) total += r.per_step * r.median_ms;
    j["step_model"][m.name] = {{"L", m.L},     {"C", m.C},         {"NH", m.NH},
                               {"B", m.B},     {"T", m.T},         {"accum", m.accum},
                               {"kernel_ms_per_step", total},
                               {"tokens_per_step", double(m.B) * m.T * m.accum}};
  }
  for (const Row& r : b.rows)
    j["rows"].push_back({{"section", r.section},   {"op", r.op},           {"shape", r.shape},
                         {"unit", r.flops ? "FLOP" : "byte"}, {"work", r.work}, {"formula", r.formula},
                         {"calls_per_step", r.per_step}, {"median_ms", r.median_ms}, {"min_ms", r.min_ms},
                         {"rate", r.rate}, {"rate_unit", r.flops ? "TFLOP/s" : "GB/s"}, {"fraction", r.fraction}});
  for (const auto& f : b.failures)
    j["failures"].push_back({{"section", f.section}, {"shape", f.shape}, {"error", f.error}});
  return j.dump(1);
}

}  // namespace pt::kernel_bench
