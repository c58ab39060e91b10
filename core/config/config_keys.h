// Internal to core/config: the table of every config key, and the cross-key rules.
// Nothing outside core/config includes this; the public API is run_config.h.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"

namespace pt::config {

using nlohmann::json;

// One config key: how to read it from JSON (type-checked), write it back, and check its own
// rule. Rules that involve several keys live in config_rules.cpp.
struct ConfigKey {
  std::string section;
  std::string name;
  std::string type;  // for messages: "an integer", "a string", ...
  bool is_string = false;  // `--set` takes a string key's value literally (see parse_set_value)
  std::function<void(RunConfig&, const json&)> read;  // throws ConfigError on a wrong type
  std::function<json(const RunConfig&)> write;
  std::function<void(const RunConfig&)> check;  // throws ConfigError when the rule fails

  std::string path() const { return section + "." + name; }
};

// Every key, in the order they are documented and written out.
const std::vector<ConfigKey>& config_keys();

// The section names, in order.
const std::vector<std::string>& config_sections();

// "a, b, c": names listed in messages.
std::string join_names(const std::vector<std::string>& names);

// Throws ConfigError listing the valid sections when `section` is not one of them.
void check_section(const std::string& section);

// The key `section.name`; throws ConfigError listing the valid sections or keys when unknown.
const ConfigKey& find_key(const std::string& section, const std::string& name);

// Checks the rules that involve several keys and fills in the derived values
// (parallel.dp, model.padded_vocab, batch.global_batch_tokens/grad_accum_steps, paths).
void check_rules_and_derive(RunConfig& cfg);

// "key=value " as it starts every error message, the value written as JSON.
std::string key_value(const std::string& key, const json& value);

}  // namespace pt::config
