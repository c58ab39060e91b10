#include "core/plan/layouts.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/train/pp_schedule.h"

namespace pt {

std::string LayoutCandidate::name() const {
  return "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " cp" +
         std::to_string(cp);
}

namespace {

nlohmann::json read_config_json(const std::string& config_path) {
  std::ifstream in(config_path);
  if (!in) throw ConfigError("cannot read config file " + config_path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ConfigError("config file " + config_path + " is not valid JSON");
  return j;
}

// The config as `picotrain train` resolves it, and the pipeline schedule's own rules, which the
// trainer checks only when it builds the schedule (the interleaved schedule's micro-batch count a
// multiple of pp): a layout breaking them is not valid rather than an error out of the plan.
RunConfig resolve_layout(const nlohmann::json& j, const std::vector<std::string>& sets, int gpus) {
  RunConfig cfg = config_from_json(j, sets, gpus);
  const ParallelSection& par = cfg.parallel;
  check_pipeline_schedule(parse_pipe_schedule(par.pp_schedule), par.pp, par.pp_virtual_stages,
                          cfg.batch.grad_accum_steps);
  return cfg;
}

}  // namespace

std::vector<int> even_pp_layers(int n_layers, int chunks) {
  if (chunks < 1 || n_layers < chunks)
    throw ConfigError("cannot split model.n_layers=" + std::to_string(n_layers) + " into " + std::to_string(chunks) +
                      " pipeline stages of at least one block each");
  std::vector<int> out(static_cast<size_t>(chunks), n_layers / chunks + 1);
  const int lighter = chunks - n_layers % chunks;  // the stages with n_layers/chunks blocks
  for (int i = 0; i < lighter; i++) out[static_cast<size_t>(i % 2 == 0 ? i / 2 : chunks - 1 - i / 2)] -= 1;
  return out;
}

LayoutCandidate resolve_with(const std::string& config_path, const LayoutCandidate& c, int gpus,
                             const std::vector<std::string>& extra) {
  LayoutCandidate out = c;
  out.sets.insert(out.sets.end(), extra.begin(), extra.end());
  try {
    out.cfg = resolve_layout(read_config_json(config_path), out.sets, gpus);
    out.invalid.clear();
  } catch (const ConfigError& e) {
    out.invalid = e.what();
  }
  return out;
}

std::vector<LayoutCandidate> enumerate_layouts(const std::string& config_path, const std::vector<std::string>& overrides,
                                               int gpus) {
  if (gpus < 1) throw ConfigError("plan --gpus " + std::to_string(gpus) + " must be >= 1");
  const nlohmann::json j = read_config_json(config_path);
  std::vector<LayoutCandidate> out;
  for (int tp = 1; tp <= gpus; tp++) {
    if (gpus % tp) continue;
    for (int pp = 1; pp <= gpus / tp; pp++) {
      if ((gpus / tp) % pp) continue;
      for (int cp = 1; cp <= gpus / tp / pp; cp++) {
        if ((gpus / tp / pp) % cp) continue;
        LayoutCandidate c;
        c.dp = gpus / tp / pp / cp;
        c.tp = tp;
        c.pp = pp;
        c.cp = cp;
        std::vector<std::string> sets = overrides;
        for (const auto& [key, value] : {std::pair{"dp", c.dp}, {"tp", tp}, {"pp", pp}, {"cp", cp}})
          sets.push_back(std::string("parallel.") + key + "=" + std::to_string(value));
        c.sets = sets;
        try {
          c.cfg = resolve_layout(j, sets, gpus);
        } catch (const ConfigError& e) {
          c.invalid = e.what();
        }
        out.push_back(std::move(c));
      }
    }
  }
  // When every layout breaks the same rule, the rule is the config's, not the layout's (an
  // unknown key, a bad value): report it as the error it is.
  bool same = true;
  for (const auto& c : out) same = same && !c.valid() && c.invalid == out.front().invalid;
  if (same) throw ConfigError(out.front().invalid);
  return out;
}

}  // namespace pt
