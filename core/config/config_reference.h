// The configuration reference: every key of the run config with its type, default and meaning,
// from one table. The type and the default come from the key table (config_keys.cpp, whose
// defaults are run_config.h's); the meaning, each section's opening line and the rules every key
// shares are written in config_reference_text.cpp. `picotrain keys` prints it for a terminal
// (format_key_help) and `picotrain keys --markdown` as docs/configuration.md
// (config_reference_markdown); the ctest config_reference_doc fails when that file differs from
// what the binary prints, so the help and the guide cannot drift apart.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace pt::config {

struct KeyDoc {
  std::string section, key;
  std::string type;          // as the reference writes it: "integer", "number", "string", ...
  std::string default_json;  // the default as JSON
  std::string meaning;       // markdown as written (`code`, *emphasis*, [links](file.md#anchor))
  std::string path() const { return section + "." + key; }
};

// ---- the hand-written part (config_reference_text.cpp) ----------------------------------------

// What one key means and the rule it follows, by its path ("parallel.tp").
struct KeyMeaning {
  std::string_view path, meaning;
};
// One per key of config_keys(), in any order (a test checks that each key has exactly one).
const std::vector<KeyMeaning>& key_meanings();
// The paragraphs before the sections: the rules every key shares (markdown, paragraphs split by a
// blank line).
std::string_view reference_rules();
// The line under a section's heading, or "" for none.
std::string_view section_intro(std::string_view section);

// ---- the reference ----------------------------------------------------------------------------

// Every key of config_keys(), in its order, with its meaning. Throws std::logic_error naming a
// key that has no meaning, or a meaning whose key does not exist (a build that forgot one).
std::vector<KeyDoc> config_reference();

// docs/configuration.md: a title, a line on what it covers with a link back to the README, the
// shared rules, then a table per section (| `key` | type | `default` | meaning / rule |).
std::string config_reference_markdown();

// The key rows of the reference tables in `markdown` (config_reference_markdown()'s, or a part of
// it): the rows | `key` | type | `default` | meaning | under a "## <section>" heading, until a "# "
// title; a '|' inside a cell is written "\|".
std::vector<KeyDoc> parse_config_reference(std::string_view markdown);

// The rows whose path matches `filter` as text for a terminal: "" every key; a section name
// ("parallel") its keys; anything else the keys whose path contains it ("zero", "parallel.tp").
// Each key is a line "section.key  (type, default D)" and its meaning below, without markdown's
// backticks, a link written as "text (docs/file.md)", wrapped to `width` columns.
// "" when nothing matches.
std::string format_key_help(const std::vector<KeyDoc>& docs, std::string_view filter, int width = 100);

}  // namespace pt::config
