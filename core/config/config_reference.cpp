#include "core/config/config_reference.h"

#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "core/config/config_keys.h"
#include "core/config/run_config.h"

namespace pt::config {

namespace {

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

std::string without(std::string s, char c) {
  std::erase(s, c);
  return s;
}

// `text` wrapped into lines of at most `width` columns (longer words stand alone), each
// starting with `indent`.
std::string wrap(const std::string& text, const std::string& indent, int width) {
  std::istringstream words(text);
  std::string out, line, word;
  while (words >> word) {
    if (!line.empty() && static_cast<int>(indent.size() + line.size() + 1 + word.size()) > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

// A markdown meaning as a terminal shows it: no backticks, and a link [text](file.md#anchor) as
// "text (docs/file.md)" (the links point from docs/configuration.md to its neighbours).
std::string plain(const std::string& meaning) {
  static const std::regex link(R"(\[([^\]]+)\]\(([^)#]+)(#[^)]*)?\))");
  return std::regex_replace(without(meaning, '`'), link, "$1 (docs/$2)");
}

// The cells of a table row "| a | b \| c | d |": split at each '|' that is not escaped, "\|"
// read back as '|', each trimmed.
std::vector<std::string> cells_of(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < row.size(); i++) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      i++;
    } else if (row[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// Markdown paragraphs (split by a blank line) wrapped at 100 columns, each followed by a blank line.
std::string paragraphs(std::string_view text) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find("\n\n", at);
    if (end == std::string_view::npos) end = text.size();
    out += wrap(std::string(text.substr(at, end - at)), "", 100) + "\n";
    at = end + 2;
  }
  return out;
}

}  // namespace

std::vector<KeyDoc> config_reference() {
  std::map<std::string, std::string, std::less<>> meanings;
  for (const KeyMeaning& m : key_meanings()) {
    const std::string path(m.path);
    const size_t dot = path.find('.');
    if (dot == std::string::npos) throw std::logic_error("the reference explains '" + path + "', which is no key");
    find_key(path.substr(0, dot), path.substr(dot + 1));  // throws for a key that does not exist
    if (!meanings.emplace(path, std::string(m.meaning)).second)
      throw std::logic_error("the reference explains " + path + " twice");
  }
  const RunConfig defaults;
  std::vector<KeyDoc> docs;
  for (const ConfigKey& k : config_keys()) {
    auto it = meanings.find(k.path());
    if (it == meanings.end() || it->second.empty())
      throw std::logic_error("the configuration reference does not explain " + k.path() +
                             ": add it to core/config/config_reference_text.cpp");
    docs.push_back({k.section, k.name, k.type, k.write(defaults).dump(), it->second});
  }
  return docs;
}

std::string config_reference_markdown() {
  std::string out = "# Configuration reference\n\n";
  out += paragraphs(
      "Every key of the run config, with its type, its default and the rule it must satisfy. [Back to the "
      "README](../README.md).\n\n"
      "This file is generated: `picotrain keys --markdown > docs/configuration.md` writes it from the key "
      "table that `picotrain keys` prints (the types and defaults from `core/config/config_keys.cpp`, the text "
      "from `core/config/config_reference_text.cpp`); the test `config_reference_doc` fails when the two "
      "differ.");
  out += paragraphs(reference_rules());
  const std::vector<KeyDoc> docs = config_reference();
  for (size_t i = 0; i < docs.size(); i++) {
    const KeyDoc& d = docs[i];
    if (i == 0 || docs[i - 1].section != d.section)
      out += "## " + d.section + "\n\n" + paragraphs(section_intro(d.section)) +
             "| key | type | default | meaning / rule |\n|---|---|---|---|\n";
    out += "| `" + d.key + "` | " + d.type + " | `" + d.default_json + "` | " + escape_cell(d.meaning) + " |\n";
    if (i + 1 == docs.size() || docs[i + 1].section != d.section) out += "\n";
  }
  out.pop_back();  // one newline at the end of the file
  return out;
}

std::vector<KeyDoc> parse_config_reference(std::string_view markdown) {
  std::vector<KeyDoc> docs;
  std::string section;
  std::istringstream in{std::string(markdown)};
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) section = without(trim(line.substr(3)), '`');
    else if (line.rfind("# ", 0) == 0) section.clear();
    if (section.empty() || line.rfind("| `", 0) != 0) continue;
    // | `key` | type | `default` | meaning |
    const std::vector<std::string> cells = cells_of(line);
    if (cells.size() < 4) continue;
    docs.push_back({section, without(cells[0], '`'), cells[1], without(cells[2], '`'), cells[3]});
  }
  return docs;
}

std::string format_key_help(const std::vector<KeyDoc>& docs, std::string_view filter, int width) {
  bool is_section = false;
  for (const KeyDoc& d : docs) is_section = is_section || d.section == filter;
  std::string out, section;
  for (const KeyDoc& d : docs) {
    const bool match = filter.empty() || (is_section ? d.section == filter : d.path().find(filter) != std::string::npos);
    if (!match) continue;
    if (d.section != section) {
      section = d.section;
      out += (out.empty() ? "" : "\n") + section + "\n";
    }
    out += "  " + d.path() + "  (" + d.type + ", default " + d.default_json + ")\n";
    out += wrap(plain(d.meaning), "      ", width);
  }
  return out;
}

}  // namespace pt::config
