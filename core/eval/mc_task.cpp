#include "core/eval/mc_task.h"

#include <cctype>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/common/error.h"

namespace pt {

namespace {

using json = nlohmann::json;

McExample parse_line(const std::string& text, const std::string& where, int line) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(where + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw ConfigError(where + ": expected a JSON object with ctx, endings and label");
  McExample ex;
  ex.line = line;
  if (!j.contains("ctx") || !j["ctx"].is_string()) throw ConfigError(where + ": \"ctx\" must be a string");
  ex.context = j["ctx"].get<std::string>();
  if (ex.context.empty()) throw ConfigError(where + ": \"ctx\" is empty (an ending needs a context to follow)");
  if (!j.contains("endings") || !j["endings"].is_array() || j["endings"].size() < 2)
    throw ConfigError(where + ": \"endings\" must be an array of at least two strings");
  for (const json& e : j["endings"]) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw ConfigError(where + ": every ending must be a non-empty string");
    ex.endings.push_back(e.get<std::string>());
  }
  if (!j.contains("label") || !j["label"].is_number_integer())
    throw ConfigError(where + ": \"label\" must be an integer");
  const int64_t label = j["label"].get<int64_t>();
  if (label < 0 || label >= static_cast<int64_t>(ex.endings.size()))
    throw ConfigError(where + ": \"label\" " + std::to_string(label) + " is not an index of its " +
                      std::to_string(ex.endings.size()) + " endings");
  ex.label = static_cast<int>(label);
  return ex;
}

}  // namespace

std::vector<McExample> read_mc_task(const std::string& path, int64_t max_examples) {
  std::ifstream in(path);
  if (!in) throw ConfigError("multiple-choice task " + path + ": cannot be read (no such file?)");
  std::vector<McExample> out;
  std::string text;
  for (int line = 1; std::getline(in, text); line++) {
    if (max_examples > 0 && static_cast<int64_t>(out.size()) >= max_examples) break;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_line(text, path + " line " + std::to_string(line), line));
  }
  if (out.empty()) throw ConfigError("multiple-choice task " + path + ": holds no example");
  return out;
}

std::vector<McTokens> tokenize_mc_task(const std::vector<McExample>& examples, const Tokenizer& tok) {
  const std::unique_ptr<TokenEncoder> enc = tok.encoder();
  std::vector<McTokens> out;
  out.reserve(examples.size());
  for (const McExample& ex : examples) {
    McTokens t;
    t.label = ex.label;
    enc->encode(ex.context, t.context);
    for (const std::string& ending : ex.endings) {
      t.endings.emplace_back();
      enc->encode(" " + ending, t.endings.back());
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string mc_task_name(const std::string& path) {
  const std::string file = std::filesystem::path(path).filename().string();
  std::string name = file.substr(0, file.find_first_of("_."));
  for (char& c : name) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name.empty() ? "task" : name;
}

}  // namespace pt
