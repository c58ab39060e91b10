// Helpers for the tokenizer tests: the GPT-2 and Llama 3 files (fetched by scripts/get_data.sh --tokenizer),
// the reference ids from npm packages' JavaScript encoders run under node, a temp dir, and tiny
// tokenizer.json files written for a test.
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

#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/gpt2_tokenizer.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace pt::test {

namespace fs = std::filesystem;

// $env_var, else where scripts/get_data.sh puts `name`'s files (default_tokenizer_dir).
inline std::string tokenizer_dir_for_tests(const char* env_var, const std::string& name) {
  const char* env = std::getenv(env_var);
  return env && *env ? env : default_tokenizer_dir(name);
}

// $PICOTRAIN_GPT2_DIR, else <repo>/data/gpt2.
inline std::string gpt2_dir() { return tokenizer_dir_for_tests("PICOTRAIN_GPT2_DIR", "gpt2"); }

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

// $PICOTRAIN_LLAMA3_DIR, else <repo>/data/llama3.
inline std::string llama3_dir() { return tokenizer_dir_for_tests("PICOTRAIN_LLAMA3_DIR", "llama3"); }

// Llama 3's tokenizer.json, loaded once per test binary; fails like gpt2() when it is missing.
inline const HfTokenizer& llama3() {
  static std::unique_ptr<HfTokenizer> tok;
  if (!tok) {
    if (!fs::exists(fs::path(llama3_dir()) / "tokenizer.json"))
      FAIL("Llama 3's tokenizer.json is not in " << llama3_dir()
                                                  << ": run scripts/get_data.sh --tokenizer (scripts/test.sh does)");
    tok = std::make_unique<HfTokenizer>(llama3_dir(), "llama3");
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

// Runs `node test/<script> <args...> IN.json` on `texts` and returns the ids it prints, one list
// per text. Fails, never skips, when node is missing or the script fails.
inline std::vector<std::vector<int32_t>> node_reference_ids(const std::string& script, const std::vector<std::string>& args,
                                                            const std::vector<std::string>& texts) {
  if (std::system("command -v node >/dev/null 2>&1") != 0)
    FAIL("node is not on PATH: the reference ids come from npm packages' JavaScript encoders; install Node.js");
  TempDir dir;
  std::ofstream(dir.file("in.json"), std::ios::binary) << nlohmann::json(texts).dump();
  std::string cmd = "node '" + std::string(PICOTRAIN_SOURCE_DIR) + "/test/" + script + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " '" + dir.file("in.json") + "' > '" + dir.file("out.json") + "' 2> '" + dir.file("err.txt") + "'";
  if (std::system(cmd.c_str()) != 0) FAIL("the reference encoder failed: " << slurp(dir.file("err.txt")));
  const auto out = nlohmann::json::parse(slurp(dir.file("out.json")));
  REQUIRE(out.size() == texts.size());
  return out.get<std::vector<std::vector<int32_t>>>();
}

// The ids gpt-3-encoder's Encoder.js gives for each text (valid UTF-8 only: JavaScript strings
// cannot hold other bytes).
inline std::vector<std::vector<int32_t>> reference_ids(const std::vector<std::string>& texts) {
  if (!fs::exists(fs::path(gpt2_dir()) / "Encoder.js"))
    FAIL(gpt2_dir() << "/Encoder.js is missing: run scripts/get_data.sh --tokenizer");
  return node_reference_ids("gpt2_reference.js", {gpt2_dir()}, texts);
}

// A byte-level tokenizer.json small enough to reason about: the 256 byte tokens, then `extra`
// tokens (spelled in byte characters) with ids from 256, the merges, the pre-tokenizer, and the
// added tokens.
inline nlohmann::json tiny_tokenizer(const std::vector<std::string>& extra, const nlohmann::json& merges,
                                     const nlohmann::json& pre_tokenizer,
                                     const nlohmann::json& added = nlohmann::json::array()) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {  // spelled in byte characters (byte_unicode.h), all below U+0800
    const char32_t c = gpt2_byte_to_unicode()[b];
    std::string spelled;
    if (c < 0x80) {
      spelled += static_cast<char>(c);
    } else {
      spelled += static_cast<char>(0xC0 | (c >> 6));
      spelled += static_cast<char>(0x80 | (c & 0x3F));
    }
    vocab[spelled] = b;
  }
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return {{"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

inline const nlohmann::json kByteLevelNoRegex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};

// Writes `j` as <dir>/<name>/tokenizer.json; returns its path.
inline std::string write_json(const TempDir& dir, const std::string& name, const nlohmann::json& j) {
  fs::create_directories(dir.path / name);
  const std::string path = (dir.path / name / "tokenizer.json").string();
  std::ofstream(path, std::ios::binary) << j.dump();
  return path;
}

}  // namespace pt::test
