#include "core/ckpt/hf_tokenizer_files.h"

#include <filesystem>
#include <sstream>

#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/durable_io.h"
#include "core/common/error.h"
#include "core/tokenizer/gpt2_tokenizer.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace pt::ckpt {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

ordered_json parse_json(const std::string& path) {
  try {
    return ordered_json::parse(read_small_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + " is not valid JSON (" + e.what() + ")");
  }
}

// The token that begins/ends a document by tokenizer_config.json's `key` ("bos_token",
// "eos_token"; a string or {"content": ...}) when it encodes as one token, else the document marker.
std::pair<std::string, int32_t> special_token(const Tokenizer& tok, const ordered_json& config, const char* key) {
  if (config.is_object() && config.contains(key)) {
    const ordered_json& v = config.at(key);
    const ordered_json content = v.is_object() ? v.value("content", ordered_json()) : v;
    if (content.is_string()) {
      const std::string text = content.get<std::string>();
      if (const std::vector<int32_t> ids = tok.encode(text); ids.size() == 1) return {text, ids[0]};
    }
  }
  std::vector<int32_t> marker;
  try {
    marker = tok.document_prefix();
  } catch (const ConfigError&) {  // a tokenizer.json that names no marker
  }
  if (marker.size() != 1) return {"", -1};
  return {tok.decode(marker), marker[0]};
}

ordered_json id_or_null(int32_t id) { return id >= 0 ? ordered_json(id) : ordered_json(nullptr); }
ordered_json text_or_null(const std::string& s) { return s.empty() ? ordered_json(nullptr) : ordered_json(s); }

void write_json(const std::string& out_dir, const char* name, const ordered_json& j) {
  write_file_atomic((fs::path(out_dir) / name).string(), j.dump(2) + "\n");
}

}  // namespace

ordered_json gpt2_tokenizer_json(const std::string& dir) {
  ordered_json merges = ordered_json::array();
  std::istringstream lines(read_small_file((fs::path(dir) / "vocab.bpe").string()));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    merges.push_back({line.substr(0, space), line.substr(space + 1)});
  }
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {{{"id", 50256}, {"content", kEndOfText}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", true}, {"special", true}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false},
                {"vocab", parse_json((fs::path(dir) / "encoder.json").string())}, {"merges", merges}};
  return j;
}

std::optional<HfSpecialTokens> write_hf_tokenizer_files(const Tokenizer& tok, const ModelSection& model,
                                                        const std::string& out_dir) {
  std::string tokenizer_json;
  ordered_json config;  // the tokenizer_config.json beside the source, when there is one
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(&tok)) {
    tokenizer_json = read_small_file(hf->file());
    const fs::path beside = fs::path(hf->file()).parent_path() / kTokenizerConfigFile;
    if (fs::is_regular_file(beside)) config = parse_json(beside.string());
  } else if (const auto* gpt2 = dynamic_cast<const Gpt2Tokenizer*>(&tok)) {
    tokenizer_json = gpt2_tokenizer_json(gpt2->dir()).dump() + "\n";
  } else {
    return std::nullopt;
  }
  HfSpecialTokens s;
  std::tie(s.bos, s.bos_id) = special_token(tok, config, "bos_token");
  std::tie(s.eos, s.eos_id) = special_token(tok, config, "eos_token");

  write_file_atomic((fs::path(out_dir) / kTokenizerFile).string(), tokenizer_json);
  if (config.is_null()) {
    config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"bos_token", text_or_null(s.bos)},
              {"eos_token", text_or_null(s.eos)}, {"model_max_length", model.max_seq_len},
              {"clean_up_tokenization_spaces", false}};
  }
  write_json(out_dir, kTokenizerConfigFile, config);
  write_json(out_dir, "special_tokens_map.json", {{"bos_token", text_or_null(s.bos)}, {"eos_token", text_or_null(s.eos)}});
  write_json(out_dir, "generation_config.json",
             {{"_from_model_config", true}, {"bos_token_id", id_or_null(s.bos_id)}, {"eos_token_id", id_or_null(s.eos_id)}});
  return s;
}

}  // namespace pt::ckpt
