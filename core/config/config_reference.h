// The configuration reference for a terminal (`picotrain keys`). README.md's "Configuration
// reference" section is the one place every key is explained: CMake compiles that section into
// the binary at build time, this file reads its tables (one per config section, a row per key:
// | `key` | type | `default as JSON` | meaning |) and prints them, so the help and the README
// cannot drift apart, and a test checks that every key of the config table has its row.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace pt::config {

struct KeyDoc {
  std::string section, key;
  std::string type;          // as the README writes it: "integer", "number", "string", ...
  std::string default_json;  // the default as JSON, without the README's backticks
  std::string meaning;       // the row's last cell, markdown as written
  std::string path() const { return section + "." + key; }
};

// Every key row of the reference tables in `markdown` (a whole README or just the section):
// rows under a "### <section>" heading, until the next "## " heading.
std::vector<KeyDoc> parse_config_reference(std::string_view markdown);

// README.md's configuration reference as it was when this binary was built.
std::string_view built_in_config_reference();

// The rows whose path matches `filter` as text for a terminal: "" every key; a section name
// ("parallel") its keys; anything else the keys whose path contains it ("zero", "parallel.tp").
// Each key is a line "section.key  (type, default D)" and its meaning below, without markdown's
// backticks, wrapped to `width` columns. "" when nothing matches.
std::string format_key_help(const std::vector<KeyDoc>& docs, std::string_view filter, int width = 100);

}  // namespace pt::config
