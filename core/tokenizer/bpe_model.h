// A byte-level BPE model: the tokens (each stands for a byte string, and every single byte has
// one), the merges in rank order, and the per-thread encoder of one pre-tokenized piece. Shared by
// GPT-2's tokenizer (encoder.json + vocab.bpe) and the tokenizer.json reader, which differ only in
// how they find their files and cut text into pieces.
//
// Files spell tokens in GPT-2's byte characters (byte_unicode.h); the model works on raw bytes.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/piece_cache.h"

namespace pt {

class BpeModel {
 public:
  // `vocab` is {"spelling": id, ...} with ids exactly 0..n-1 (encoder.json, tokenizer.json's
  // model.vocab). Throws ConfigError, prefixed with `where` (the file), when it is not, when a
  // spelling is not in byte characters, or when some byte has no token.
  BpeModel(const nlohmann::json& vocab, const std::string& where);

  // Adds the merge of the tokens spelled `left` and `right`, with the next rank (merges are added
  // in file order). A later merge of the same pair replaces the earlier one, as a Python dict or a
  // Rust HashMap built from the list would. Throws ConfigError, prefixed with `where`, when either
  // side or their concatenation is not a token.
  void add_merge(std::string_view left, std::string_view right, const std::string& where);

  // Makes `id` stand for `bytes` (an added or special token, spelled as itself), growing the
  // vocabulary when needed; ids skipped over are holes that decode refuses.
  void set_token(int32_t id, std::string bytes);

  // Hugging Face's ignore_merges (Llama 3 sets it): a piece that is itself a token becomes that
  // token, whatever the merges would make of it.
  void set_ignore_merges(bool on) { ignore_merges_ = on; }

  std::optional<int32_t> find(std::string_view bytes) const;
  int vocab_size() const { return static_cast<int>(id_bytes_.size()); }
  size_t merge_count() const { return merges_.size(); }

  // The bytes of `ids`. Throws RuntimeError, naming `who`, for an id that is not a token.
  std::string decode(std::span<const int32_t> ids, const std::string& who) const;

 private:
  friend class BpePieceEncoder;
  // A hash that also takes string_view, so that lookups need not build a std::string.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  int32_t id_of_spelling(std::string_view spelled, const std::string& where) const;

  std::vector<std::string> id_bytes_;  // the bytes each id stands for
  std::vector<bool> hole_;             // ids that stand for nothing
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_to_id_;
  std::array<int32_t, 256> byte_ids_{};  // the id of each single byte
  MergeTable merges_;
  int32_t next_rank_ = 0;
  bool ignore_merges_ = false;
};

// The per-thread half: BPE scratch space and the piece cache (piece_cache.h), as GPT-2's encoder
// keeps one. Must not outlive its model.
class BpePieceEncoder {
 public:
  explicit BpePieceEncoder(const BpeModel& model) : model_(model) {}
  // Appends the ids of one piece (its UTF-8 bytes, one token per byte, merged).
  void encode(std::string_view piece, std::vector<int32_t>& ids);

 private:
  const BpeModel& model_;
  BpeScratch scratch_;
  std::vector<int32_t> symbols_;
  PieceCache cache_;
};

}  // namespace pt
