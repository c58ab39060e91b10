#include "core/model/model_tokenizer.h"

#include <exception>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/common/error.h"
#include "core/model/sampler.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace pt {

namespace fs = std::filesystem;

std::string run_tokenizer_name(const RunConfig& cfg) {
  return cfg.data.tokenizer.empty() ? tokenizer_for_vocab(cfg.model.vocab_size) : cfg.data.tokenizer;
}

std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& name) {
  struct Loaded {
    std::shared_ptr<const Tokenizer> tokenizer;
    std::exception_ptr failure;
  };
  static std::mutex mu;
  static std::map<std::string, Loaded> loaded;
  const std::lock_guard<std::mutex> lock(mu);
  const auto [it, first] = loaded.try_emplace(name);
  Loaded& l = it->second;
  if (first) {
    try {
      l.tokenizer = make_tokenizer(name);
    } catch (...) {
      l.failure = std::current_exception();
    }
  }
  if (l.failure) std::rethrow_exception(l.failure);
  return l.tokenizer;
}

void check_tokenizer_fits(const Tokenizer& tok, int vocab_size, const std::string& source) {
  if (tok.vocab_size() > vocab_size)
    throw ConfigError(source + " has " + std::to_string(tok.vocab_size()) + " tokens, more than model.vocab_size=" +
                      std::to_string(vocab_size) + " (model.vocab_size must be at least the tokenizer's vocabulary)");
}

std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& checkpoint_dir, const ModelSection& model,
                                                    const std::string& flag_name, const std::string& flag_dir) {
  std::unique_ptr<Tokenizer> tok;
  std::string source;
  if (!flag_name.empty()) {
    tok = make_tokenizer(flag_name, flag_dir);
    source = "--tokenizer " + flag_name;
  } else if (ckpt::is_hf_model_folder(checkpoint_dir)) {
    const fs::path file = fs::path(checkpoint_dir) / ckpt::kTokenizerFile;
    if (fs::exists(file)) tok = std::make_unique<HfTokenizer>(checkpoint_dir, file.string());
    source = "the tokenizer " + file.string();
  } else {
    const std::string dir = ckpt::resolve_checkpoint_path(checkpoint_dir, "the checkpoint " + checkpoint_dir);
    const ckpt::CheckpointReader reader(dir);
    tok = ckpt::recorded_tokenizer(reader.manifest(), dir, flag_dir);
    if (tok) source = "the tokenizer " + tok->name() + " recorded in " + dir;
  }
  if (!tok) {
    const std::string name = tokenizer_for_vocab(model.vocab_size);
    if (name.empty())
      throw ConfigError(checkpoint_dir + " records no tokenizer and its vocabulary (" +
                        std::to_string(model.vocab_size) + ") is none of " + vocabularies_with_a_tokenizer() +
                        "; name one with --tokenizer");
    tok = make_tokenizer(name, flag_dir);
    source = "the tokenizer " + name + " (by the model's vocabulary)";
  }
  check_tokenizer_fits(*tok, model.vocab_size, source);
  return tok;
}

}  // namespace pt
