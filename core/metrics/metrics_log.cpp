#include "core/metrics/metrics_log.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/common/console.h"

namespace pt {

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t < 60) std::snprintf(buf, sizeof buf, "%lds", t);
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return buf;
}

namespace {
// The lines of a metrics file whose "step" is <= last (unparsable lines are dropped).
std::string records_through(const std::string& path, int last) {
  std::ifstream in(path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int>() <= last)
      kept += line + "\n";
  }
  return kept;
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path, const std::string& formula_name, int keep_through_step)
    : path_(path), formula_(formula_name) {
  const std::string kept = keep_through_step < 0 ? std::string() : records_through(path, keep_through_step);
  jsonl_.open(path, std::ios::trunc);
  check(jsonl_.good(), "cannot open metrics file " + path + " for writing");
  jsonl_ << kept;
  jsonl_.flush();
}

std::string MetricsLog::step_line(const StepMetrics& m) const {
  const int width = static_cast<int>(std::to_string(m.total_steps).size());
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %*d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | %.3f TFLOP/s | MFU %.1f%% (%s) "
                "| ETA %s",
                width, m.step, m.total_steps, m.loss, m.lr, m.grad_norm, m.dt_ms, m.tokens_per_s, m.tflops_per_gpu,
                100.0 * m.mfu, formula_.c_str(), format_duration(m.eta_s).c_str());
  std::string line = buf;
  if (m.pp_bubble && m.pp_wait_ms) {
    std::snprintf(buf, sizeof buf, " | bubble %.1f%% wait %.1f ms", 100.0 * *m.pp_bubble, *m.pp_wait_ms);
    line += buf;
  }
  if (m.skipped_steps) {
    std::snprintf(buf, sizeof buf, " | skipped %d", *m.skipped_steps);
    line += buf;
  }
  if (m.moe_aux && m.moe_max_load) {
    std::snprintf(buf, sizeof buf, " | aux %.4f load %.2f", *m.moe_aux, *m.moe_max_load);
    line += buf;
  }
  if (m.val_loss) {
    std::snprintf(buf, sizeof buf, " | val %.4f", *m.val_loss);
    line += buf;
  }
  if (m.task) {
    std::snprintf(buf, sizeof buf, " | %s acc %.4f norm %.4f", m.task->name.c_str(), m.task->acc, m.task->acc_norm);
    line += buf;
  }
  return line;
}

void MetricsLog::log(const StepMetrics& m) {
  print_line(Stream::out, step_line(m));
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"dt_ms", m.dt_ms},
                      {"tokens_per_s", m.tokens_per_s},
                      {"tflops_per_gpu", m.tflops_per_gpu},
                      {"mfu", m.mfu},
                      {"tokens", m.tokens},
                      {"eta_s", m.eta_s},
                      {"data_ms", m.data_ms},
                      {"comm_ms", m.comm_ms}};
  if (m.phases)
    for (int p = 0; p < kStepPhases; p++) {
      const auto phase = static_cast<StepPhase>(p);
      if (phase != StepPhase::pp_comm || m.pp_bubble) j[std::string(step_phase_name(phase)) + "_ms"] = (*m.phases)[phase];
    }
  if (m.mfu_fp8) j["mfu_fp8"] = *m.mfu_fp8;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.task) {
    j[m.task->name + "_acc"] = m.task->acc;
    j[m.task->name + "_acc_norm"] = m.task->acc_norm;
  }
  if (m.pp_bubble) j["pp_bubble"] = *m.pp_bubble;
  if (m.pp_wait_ms) j["pp_wait_ms"] = *m.pp_wait_ms;
  if (m.moe_aux) j["moe_aux"] = *m.moe_aux;
  if (m.moe_max_load) j["moe_max_load"] = *m.moe_max_load;
  if (m.skipped_steps) j["skipped_steps"] = *m.skipped_steps;
  jsonl_ << j.dump() << '\n';
  jsonl_.flush();
  check(jsonl_.good(), "writing " + path_ + " failed (disk full?)");
}

}  // namespace pt
