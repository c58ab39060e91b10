// A Hugging Face byte-level BPE tokenizer.json (GPT-2's, Llama 3's, ...; what is read and what is
// refused: hf_tokenizer_json.h), giving the ids Hugging Face's tokenizers give with
// add_special_tokens=False.
//
// encode: the added tokens are found in the raw text (added_tokens.h); each run of text between
// them is cut by the pre-tokenizer's regex stages in order (regex_splitter.h; each stage cuts the
// pieces of the one before), and each piece's UTF-8 bytes go through BPE (bpe_model.h). Added
// tokens in the text therefore encode as their ids: "<|begin_of_text|>" in a Llama 3 corpus is
// the special token, as in transformers. decode gives the bytes back, added tokens spelled as
// their content (no clean-up of spaces), so decode(encode(x)) == x for any bytes.
//
// Documents (prepare) start with the document marker, document_marker in hf_tokenizer_json.cpp:
// Llama 3's <|begin_of_text|>, GPT-2's <|endoftext|>.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tokenizer/added_tokens.h"
#include "core/tokenizer/bpe_model.h"
#include "core/tokenizer/regex_splitter.h"
#include "core/tokenizer/split_patterns.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json or a folder holding one (and maybe tokenizer_config.json); `name`
  // is what name() reports ("llama3", or the path). Throws ConfigError (hf_tokenizer_json.h).
  HfTokenizer(const std::string& path, std::string name);

  std::string name() const override { return name_; }
  int vocab_size() const override { return model_->vocab_size(); }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(std::span<const int32_t> ids) const override { return model_->decode(ids, "tokenizer " + name_); }
  // The document marker; throws ConfigError when the file names none.
  std::vector<int32_t> document_prefix() const override;
  std::vector<int32_t> document_suffix() const override { return {}; }
  size_t next_cut(std::string_view text, size_t from) const override { return pt::next_cut(cut_, text, from); }

  size_t merge_count() const { return model_->merge_count(); }
  const std::string& file() const { return path_; }  // the tokenizer.json read

 private:
  friend class HfEncoder;
  struct Stage {
    std::unique_ptr<RegexPattern> pattern;
    bool keep_matches, keep_gaps;
  };
  std::string name_, path_;
  std::unique_ptr<BpeModel> model_;
  std::vector<Stage> stages_;
  AddedTokens added_;
  CutRule cut_ = CutRule::none;
  int32_t marker_ = -1;
};

}  // namespace pt
