#include "core/plan/kernel_table.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/metrics/flops.h"

namespace pt {

namespace {

// "N=65536 IC=768 OC=2304" -> {N: 65536, IC: 768, OC: 2304}; other words are skipped.
std::map<std::string, double> parse_dims(const std::string& shape) {
  std::map<std::string, double> out;
  std::istringstream in(shape);
  for (std::string word; in >> word;) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    try {
      out[word.substr(0, eq)] = std::stod(word.substr(eq + 1));
    } catch (const std::exception&) {
    }
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double dim(const KernelRow& r, const char* key) {
  const auto it = r.dims.find(key);
  return it == r.dims.end() ? 0 : it->second;
}

// The measured ops of the step model (not the ceilings).
bool is_matmul(const KernelRow& r, bool backward) {
  return r.flops && r.section != "ceiling" && starts_with(r.op, backward ? "matmul_backward" : "matmul_forward") &&
         dim(r, "N") > 0 && dim(r, "IC") > 0 && dim(r, "OC") > 0;
}

double attention_flops(double batch, double heads, double seq, double head_dim, bool backward) {
  return (backward ? 2.5 : 1.0) * 4 * batch * heads * seq * seq * head_dim / 2;
}

std::string read_text(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) throw ConfigError(std::string("plan ") + flag + " " + path + ": cannot read it: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

KernelTable KernelTable::from_json(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string where = "kernel table " + source;
  if (j.is_discarded() || !j.is_object()) throw ConfigError(where + " is not valid JSON (kernel_bench --json writes it)");
  KernelTable t;
  t.source = source;
  t.device = j.value("device", std::string("unknown device"));
  auto positive = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() > 0))
      throw ConfigError(where + ": \"" + key + "\" must be a number > 0 (kernel_bench --json writes it)");
    return j[key].get<double>();
  };
  t.flop_ceiling_tflops = positive("flop_ceiling_tflops");
  t.bandwidth_ceiling_gbps = positive("bandwidth_ceiling_gbps");
  if (!j.contains("rows") || !j["rows"].is_array() || j["rows"].empty())
    throw ConfigError(where + ": \"rows\" must be a non-empty array of measured kernels");
  for (const auto& r : j["rows"]) {
    KernelRow row;
    try {
      row.section = r.value("section", std::string());
      row.op = r.at("op").get<std::string>();
      row.shape = r.at("shape").get<std::string>();
      row.flops = r.at("unit").get<std::string>() == "FLOP";
      row.median_ms = r.at("median_ms").get<double>();
      row.rate = r.at("rate").get<double>();
      row.calls_per_step = r.value("calls_per_step", 0.0);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(where + ": a row lacks op, shape, unit, median_ms or rate (" + e.what() + ")");
    }
    if (!(row.rate > 0 && row.median_ms > 0)) continue;  // not timed: nothing to learn from it
    row.dims = parse_dims(row.shape);
    t.rows.push_back(std::move(row));
  }
  return t;
}

KernelTable KernelTable::from_file(const std::string& path) { return from_json(read_text(path, "--kernels"), path); }

KernelTable KernelTable::with_attention_of(const std::string& path, double peak_tflops) const {
  const nlohmann::json j = nlohmann::json::parse(read_text(path, "--attention"), nullptr, /*allow_exceptions=*/false);
  const std::string what = "plan --attention " + path;
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array() || !j.contains("device") || !j["device"].is_string())
    throw ConfigError(what + ": not bench/attention_sdpa.py's JSON (an object with \"device\" and \"rows\")");
  const std::string device = j["device"].get<std::string>();
  const double measured_peak = gpu_peak_tflops(device);
  if (!(measured_peak > 0)) throw ConfigError(what + ": no dense bf16 peak is known for its device \"" + device + "\"");
  // The faster back end at each shape (B, NH, NKV, T, hd), by its forward + backward time.
  std::map<std::vector<double>, nlohmann::json> best;
  for (const nlohmann::json& r : j["rows"]) {
    if (!r.is_object() || r.value("status", "") != "ok") continue;
    for (const char* key : {"B", "NH", "NKV", "T", "hd", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "fwd_ms", "bwd_ms"})
      if (!r.contains(key) || !r[key].is_number())
        throw ConfigError(what + ": a row without the number \"" + std::string(key) + "\": " + r.dump());
    const std::vector<double> shape = {r["B"], r["NH"], r["NKV"], r["T"], r["hd"]};
    auto it = best.find(shape);
    if (it == best.end() || r["fwd_bwd_tflops"].get<double>() > it->second["fwd_bwd_tflops"].get<double>())
      best[shape] = r;
  }
  if (best.empty()) throw ConfigError(what + ": no row with status \"ok\"");
  KernelTable out = *this;
  std::erase_if(out.rows, [](const KernelRow& r) { return starts_with(r.op, "attention_"); });
  const double scale = peak_tflops / measured_peak;
  for (const auto& [shape, r] : best)
    for (const bool backward : {false, true}) {
      KernelRow row;
      row.section = "attention";
      row.op = backward ? "attention_backward" : "attention_forward";
      row.shape = "B=" + std::to_string(int(shape[0])) + " NH=" + std::to_string(int(shape[1])) +
                  " T=" + std::to_string(int(shape[3])) + " hd=" + std::to_string(int(shape[4]));
      row.flops = true;
      row.rate = r[backward ? "bwd_tflops" : "fwd_tflops"].get<double>() * scale;
      row.median_ms = r[backward ? "bwd_ms" : "fwd_ms"].get<double>() / scale;
      row.dims = parse_dims(row.shape);
      out.rows.push_back(std::move(row));
    }
  out.source += "; attention: " + path + " (" + device + ", PyTorch SDPA, the faster back end per shape)";
  return out;
}

const KernelTable& KernelTable::h100() {
  static const KernelTable table =
      from_json(h100_kernel_table_json(), "bench/runs/2026-11-26-h100-bench.md (compiled in)");
  return table;
}

KernelTable KernelTable::scaled(double flop_scale, double bandwidth_scale, const std::string& what) const {
  KernelTable t = *this;
  t.flop_ceiling_tflops *= flop_scale;
  t.bandwidth_ceiling_gbps *= bandwidth_scale;
  for (KernelRow& r : t.rows) {
    const double s = r.flops ? flop_scale : bandwidth_scale;
    r.rate *= s;
    r.median_ms /= s;
  }
  t.source = source + ", scaled to " + what;
  return t;
}

double KernelTable::matmul_efficiency(bool backward) const {
  std::vector<double> fractions;
  for (const KernelRow& r : rows)
    if (is_matmul(r, backward)) fractions.push_back(r.rate / flop_ceiling_tflops);
  // A table without matmul rows (a ceilings-only run): the large matmul ceiling itself.
  return fractions.empty() ? 1.0 : median(fractions);
}

double KernelTable::memory_efficiency() const {
  std::vector<double> fractions;
  for (const KernelRow& r : rows)
    if (!r.flops && r.section != "ceiling") fractions.push_back(r.rate / bandwidth_ceiling_gbps);
  return fractions.empty() ? 1.0 : median(fractions);
}

namespace {

// The row `pick` accepts with the same IC and OC and the N nearest `n`, within a factor of 2;
// null when there is none.
template <class Pick>
const KernelRow* nearest_shape(const std::vector<KernelRow>& rows, double n, double ic, double oc, Pick pick) {
  const KernelRow* best = nullptr;
  for (const KernelRow& r : rows) {
    if (!pick(r) || dim(r, "N") <= 0 || dim(r, "IC") != ic || dim(r, "OC") != oc) continue;
    const double distance = std::fabs(std::log(dim(r, "N") / n));
    if (distance <= std::log(2.0) && (!best || distance < std::fabs(std::log(dim(*best, "N") / n)))) best = &r;
  }
  return best;
}

}  // namespace

double KernelTable::matmul_s(double n, double ic, double oc, bool backward) const {
  const double flops = (backward ? 4.0 : 2.0) * n * ic * oc;
  const KernelRow* best = nearest_shape(rows, n, ic, oc, [&](const KernelRow& r) { return is_matmul(r, backward); });
  if (best) return flops / (best->rate * 1e12);
  const double bytes = (backward ? 4.0 : 2.0) * (n * ic + ic * oc + n * oc);
  return std::max(flops / (flop_ceiling_tflops * 1e12 * matmul_efficiency(backward)),
                  bytes / (bandwidth_ceiling_gbps * 1e9));
}

double KernelTable::measured_fp8_matmul_s(double n, double ic, double oc, bool backward) const {
  // kernel_bench_fp8.cpp's rows: "fp8_matmul NAME forward (...)", "... dinp (...)", "... dW += (...)",
  // each 2·N·IC·OC FLOPs.
  const double flops = 2 * n * ic * oc;
  auto seconds = [&](const char* product) {
    const KernelRow* r = nearest_shape(rows, n, ic, oc, [&](const KernelRow& r) {
      return r.flops && starts_with(r.op, "fp8_matmul ") && r.op.find(product) != std::string::npos;
    });
    return r ? flops / (r->rate * 1e12) : 0.0;
  };
  if (!backward) return seconds(" forward");
  const double dinp = seconds(" dinp"), dw = seconds(" dW");
  return dinp > 0 && dw > 0 ? dinp + dw : 0;
}

double KernelTable::attention_s(double batch, double heads, double seq, double head_dim, bool backward) const {
  const double flops = attention_flops(batch, heads, seq, head_dim, backward);
  const std::string op = backward ? "attention_backward" : "attention_forward";
  std::vector<const KernelRow*> measured;
  for (const KernelRow& r : rows)
    if (r.flops && r.op == op && dim(r, "T") > 0 && dim(r, "hd") > 0) measured.push_back(&r);
  if (measured.empty()) return flops / (flop_ceiling_tflops * 1e12 * matmul_efficiency(backward));
  for (const KernelRow* r : measured)
    if (dim(*r, "B") == batch && dim(*r, "NH") == heads && dim(*r, "T") == seq && dim(*r, "hd") == head_dim)
      return flops / (r->rate * 1e12);
  // The nearest head size, then each measured T's mean rate, interpolated in log T.
  double hd = 0;
  for (const KernelRow* r : measured)
    if (!hd || std::fabs(std::log(dim(*r, "hd") / head_dim)) < std::fabs(std::log(hd / head_dim))) hd = dim(*r, "hd");
  std::map<double, std::pair<double, int>> by_seq;  // T -> (sum of rates, rows)
  for (const KernelRow* r : measured) {
    if (dim(*r, "hd") != hd) continue;
    auto& [sum, count] = by_seq[dim(*r, "T")];
    sum += r->rate;
    count++;
  }
  auto rate_at = [&](auto it) { return it->second.first / it->second.second; };
  double rate;
  const auto above = by_seq.lower_bound(seq);
  if (above == by_seq.begin()) rate = rate_at(above);
  else if (above == by_seq.end()) rate = rate_at(std::prev(above));
  else {
    const auto below = std::prev(above);
    const double w = std::log(seq / below->first) / std::log(above->first / below->first);
    rate = (1 - w) * rate_at(below) + w * rate_at(above);
  }
  return flops / (rate * 1e12);
}

double KernelTable::memory_s(const std::string& op, double bytes) const {
  const KernelRow* best = nullptr;
  for (const KernelRow& r : rows) {
    if (r.flops || r.section == "ceiling" || !starts_with(r.op, op)) continue;
    if (!best || std::fabs(std::log(r.work() / bytes)) < std::fabs(std::log(best->work() / bytes))) best = &r;
  }
  const double rate = best ? best->rate : bandwidth_ceiling_gbps * memory_efficiency();
  return bytes / (rate * 1e9);
}

}  // namespace pt
