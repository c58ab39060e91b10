#include "core/tokenizer/tokenizer.h"

#include <filesystem>

#include "core/common/error.h"
#include "core/tokenizer/byte_tokenizer.h"
#include "core/tokenizer/gpt2_tokenizer.h"
#include "core/tokenizer/hf_tokenizer.h"

#ifndef PICOTRAIN_SOURCE_DIR
#define PICOTRAIN_SOURCE_DIR "."
#endif

namespace pt {

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encoder()->encode(text, ids);
  return ids;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& dir) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") return std::make_unique<Gpt2Tokenizer>(dir.empty() ? default_tokenizer_dir(name) : dir);
  if (name == "llama3") return std::make_unique<HfTokenizer>(dir.empty() ? default_tokenizer_dir(name) : dir, name);
  if (std::filesystem::exists(name)) return std::make_unique<HfTokenizer>(name, name);
  throw ConfigError("unknown tokenizer '" + name + "' (known: " + kTokenizerNames + ")");
}

bool is_named_tokenizer(const std::string& name) { return name == "bytes" || name == "gpt2" || name == "llama3"; }

bool is_tokenizer_name(const std::string& name) { return is_named_tokenizer(name) || std::filesystem::exists(name); }

// The source tree is compiled in: the files are fetched there by scripts/get_data.sh, and
// picotrain is run from a build inside it. A binary moved elsewhere takes --tokenizer-dir.
std::string default_tokenizer_dir(const std::string& name) { return std::string(PICOTRAIN_SOURCE_DIR) + "/data/" + name; }

}  // namespace pt
