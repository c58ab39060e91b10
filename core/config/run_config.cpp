// Reading a run config: JSON file -> type-checked keys -> `--set` overrides -> rules and
// derived values; and writing the resolved config back out. The keys themselves are listed
// in config_keys.cpp, the rules between keys in config_rules.cpp.
#include "core/config/run_config.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common/error.h"
#include "core/config/config_keys.h"

namespace pt {

std::string CheckpointSection::cadence() const {
  const std::string every = "every " + std::to_string(every_steps) + " steps";
  if (every_steps > 0)
    return final ? every + " and at the end" : every + ", the end only when due (checkpoint.final=false)";
  return final ? "at the end of the run" : "on stop signals only (checkpoint.final=false)";
}

namespace {

using config::ConfigKey;
using config::json;

void read_sections(RunConfig& cfg, const json& j) {
  if (!j.is_object()) throw ConfigError("a run config must be a JSON object of sections, got " + j.dump());
  for (const auto& [section, keys] : j.items()) {
    if (!keys.is_object())
      throw ConfigError(config::key_value(section, keys) + " must be an object of keys (a config section)");
    config::check_section(section);  // also when it is empty: `"modle": {}` is a typo too
    for (const auto& [name, value] : keys.items()) config::find_key(section, name).read(cfg, value);
  }
}

// The text after '=' in `--set section.key=value`: JSON when it parses (numbers, booleans,
// arrays, quoted strings), else the text itself. A string key always takes the text literally
// unless it is a quoted JSON string, so `--set run.name=2024` names the run "2024".
json parse_set_value(const ConfigKey& key, const std::string& text) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || (key.is_string && !parsed.is_string())) return json(text);
  return parsed;
}

void apply_override(RunConfig& cfg, const std::string& text) {
  auto eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError("--set " + text + ": missing '=' (the form is --set section.key=value)");
  std::string path = text.substr(0, eq);
  auto dot = path.find('.');
  if (dot == std::string::npos)
    throw ConfigError("--set " + text + ": missing '.' in the key " + path + " (the form is --set section.key=value)");
  try {
    const ConfigKey& key = config::find_key(path.substr(0, dot), path.substr(dot + 1));
    key.read(cfg, parse_set_value(key, text.substr(eq + 1)));
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (in --set " + text + ")");
  }
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says where.
std::string without_exception_tag(const std::string& what) {
  auto end = what.find("] ");
  return what.rfind("[json.exception", 0) == 0 && end != std::string::npos ? what.substr(end + 2) : what;
}

}  // namespace

RunConfig config_from_json(const nlohmann::json& j, const std::vector<std::string>& overrides, int world_size) {
  RunConfig cfg;  // the defaults of run_config.h
  cfg.world_size = world_size;
  read_sections(cfg, j);
  for (const auto& o : overrides) apply_override(cfg, o);
  for (const auto& key : config::config_keys()) key.check(cfg);
  config::check_rules_and_derive(cfg);
  return cfg;
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  return config_from_json(read_config_file(path), overrides, world_size);
}

nlohmann::json read_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read config file " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    throw ConfigError("config file " + path + " is not valid JSON: " + without_exception_tag(e.what()));
  }
  return j;
}

nlohmann::json config_to_json(const RunConfig& cfg) {
  json j = json::object();
  for (const auto& key : config::config_keys()) j[key.section][key.name] = key.write(cfg);
  return j;
}

void write_resolved_config(const RunConfig& cfg) {
  namespace fs = std::filesystem;
  // Written in the table's order (not nlohmann's alphabetical one) so it reads like docs/configuration.md.
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& key : config::config_keys()) out[key.section][key.name] = nlohmann::ordered_json(key.write(cfg));

  fs::path dir(cfg.run.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError("cannot create the run directory " + dir.string() + ": " + ec.message());
  // A per-process temp name: every rank may write the same file at once, and a reader never
  // sees a half-written config.
  fs::path final_path = dir / "config.json";
  fs::path tmp = dir / ("config.json.tmp." + std::to_string(::getpid()));
  {
    std::ofstream f(tmp);
    f << out.dump(2) << "\n";
    f.close();
    if (!f) throw RuntimeError("cannot write " + tmp.string() + ": " + std::strerror(errno));
  }
  fs::rename(tmp, final_path, ec);
  if (ec) throw RuntimeError("cannot rename " + tmp.string() + " to " + final_path.string() + ": " + ec.message());
}

}  // namespace pt
