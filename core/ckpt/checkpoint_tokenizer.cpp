#include "core/ckpt/checkpoint_tokenizer.h"

#include <filesystem>

#include "core/common/error.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

void record_tokenizer(Manifest& meta, const std::string& name) {
  if (name.empty()) return;
  meta.tokenizer = {{"name", name}};
  if (is_named_tokenizer(name)) return;
  fs::path file(name);
  if (fs::is_directory(file)) file /= kTokenizerFile;
  if (!fs::is_regular_file(file))
    throw ConfigError("tokenizer " + name + ": " + file.string() + " is not a file (a tokenizer.json, or a folder holding one)");
  meta.tokenizer["file"] = kTokenizerFile;
  meta.copies.emplace_back(kTokenizerFile, file.string());
  const fs::path config = file.parent_path() / kTokenizerConfigFile;
  if (fs::is_regular_file(config)) meta.copies.emplace_back(kTokenizerConfigFile, config.string());
}

std::unique_ptr<Tokenizer> recorded_tokenizer(const Manifest& meta, const std::string& step_dir,
                                              const std::string& files_dir) {
  const nlohmann::json& t = meta.tokenizer;
  if (t.is_null()) return nullptr;
  const std::string where = (fs::path(step_dir) / kManifestFile).string();
  if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
    throw CorruptCheckpoint(where + ": \"tokenizer\" has no \"name\" string: " + t.dump());
  const std::string name = t["name"].get<std::string>();
  if (!t.contains("file")) return make_tokenizer(name, files_dir);
  if (!t["file"].is_string() || t["file"].get<std::string>() != kTokenizerFile)
    throw CorruptCheckpoint(where + ": \"tokenizer\" names the file " + t["file"].dump() + ", not \"" +
                            kTokenizerFile + "\"");
  // The step directory: its tokenizer.json and the tokenizer_config.json beside it.
  return std::make_unique<HfTokenizer>(step_dir, name);
}

}  // namespace pt::ckpt
