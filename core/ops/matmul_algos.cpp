#include "core/ops/matmul_algos.h"

#include <nlohmann/json.hpp>

#include "core/common/error.h"

namespace pt {

namespace {
constexpr int kFormat = 1;  // the file's version
}

std::string matmul_algos_json(const MatmulAlgos& a) {
  nlohmann::json j = {{"format", kFormat},
                      {"library", a.library},
                      {"differs", a.differs},
                      {"heuristic_us", a.heuristic_us},
                      {"chosen_us", a.chosen_us},
                      {"chosen", a.chosen}};
  return j.dump(1) + "\n";
}

MatmulAlgos matmul_algos_from_json(const std::string& text, const std::string& where) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(where + ": not a matmul algorithm file (" + why + "); a timed run writes one as " +
                       "<out_dir>/matmul_algos.json");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw bad(e.what());
  }
  if (!j.is_object() || !j.contains("format") || !j["format"].is_number_integer()) throw bad("no \"format\"");
  if (j["format"].get<int>() != kFormat)
    throw bad("format " + std::to_string(j["format"].get<int>()) + ", this build reads " + std::to_string(kFormat));
  MatmulAlgos a;
  try {
    a.library = j.at("library").get<std::string>();
    a.chosen = j.at("chosen").get<std::map<std::string, std::string>>();
    a.differs = j.value("differs", 0);
    a.heuristic_us = j.value("heuristic_us", 0.0);
    a.chosen_us = j.value("chosen_us", 0.0);
  } catch (const nlohmann::json::exception& e) {
    throw bad(e.what());
  }
  for (const auto& [product, algo] : a.chosen) {
    const bool hex = algo.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (product.empty() || algo.empty() || algo.size() % 2 != 0 || !hex)
      throw bad("product \"" + product + "\" has no algorithm in hex");
  }
  return a;
}

MatmulAlgos agree_matmul_algos(const std::vector<MatmulAlgos>& ranks) {
  MatmulAlgos out;
  if (ranks.empty()) return out;
  out = ranks[0];
  for (size_t r = 1; r < ranks.size(); r++)
    if (ranks[r].library == out.library)
      out.chosen.insert(ranks[r].chosen.begin(), ranks[r].chosen.end());  // insert keeps a lower rank's
  return out;
}

}  // namespace pt
