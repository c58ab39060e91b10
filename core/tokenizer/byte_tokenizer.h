// The byte tokenizer: token = byte value, vocabulary 256 (train with model.vocab_size=256). It has
// no special tokens, so prepared documents are each followed by kByteDocumentSeparator, the
// plain-text paragraph break, rather than an end-of-text id.
#pragma once
#include "core/tokenizer/tokenizer.h"

namespace pt {

inline constexpr const char* kByteDocumentSeparator = "\n\n";

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::vector<int32_t> document_prefix() const override { return {}; }
  std::vector<int32_t> document_suffix() const override;
  // Every byte is a token, so every position is a cut.
  size_t next_cut(std::string_view text, size_t from) const override {
    return from < text.size() ? from : std::string_view::npos;
  }
};

}  // namespace pt
