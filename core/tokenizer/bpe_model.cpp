#include "core/tokenizer/bpe_model.h"

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/tokenizer/byte_unicode.h"

namespace pt {

BpeModel::BpeModel(const nlohmann::json& vocab, const std::string& where) {
  if (!vocab.is_object() || vocab.empty())
    throw ConfigError(where + " must hold a JSON object mapping tokens to ids");
  const size_t n = vocab.size();
  id_bytes_.assign(n, {});
  hole_.assign(n, true);
  bytes_to_id_.reserve(n);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string& spelled = it.key();
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= int64_t(n))
      throw ConfigError(where + ": the id of \"" + spelled + "\" must be an integer in [0, " + std::to_string(n) + ")");
    const auto id = it.value().get<int32_t>();
    if (!hole_[id]) throw ConfigError(where + ": id " + std::to_string(id) + " is used twice");
    hole_[id] = false;
    // Special tokens such as <|endoftext|> are plain printable ASCII, which maps to itself.
    std::optional<std::string> bytes = gpt2_unicode_to_bytes(spelled);
    if (!bytes) throw ConfigError(where + ": \"" + spelled + "\" is not spelled in GPT-2's byte characters");
    id_bytes_[id] = *bytes;
    bytes_to_id_.emplace(std::move(*bytes), id);
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    auto it = bytes_to_id_.find(std::string_view(&byte, 1));
    if (it == bytes_to_id_.end()) throw ConfigError(where + " has no token for byte " + std::to_string(b));
    byte_ids_[b] = it->second;
  }
}

int32_t BpeModel::id_of_spelling(std::string_view spelled, const std::string& where) const {
  std::optional<std::string> bytes = gpt2_unicode_to_bytes(spelled);
  auto it = bytes ? bytes_to_id_.find(*bytes) : bytes_to_id_.end();
  if (it == bytes_to_id_.end())
    throw ConfigError(where + "\"" + std::string(spelled) + "\" is not a token of the vocabulary");
  return it->second;
}

void BpeModel::add_merge(std::string_view left, std::string_view right, const std::string& where) {
  const int32_t l = id_of_spelling(left, where), r = id_of_spelling(right, where);
  merges_.add(l, r, id_of_spelling(std::string(left) + std::string(right), where), next_rank_++);
}

void BpeModel::set_token(int32_t id, std::string bytes) {
  if (id >= vocab_size()) {
    id_bytes_.resize(id + 1);
    hole_.resize(id + 1, true);
  }
  hole_[id] = false;
  bytes_to_id_[bytes] = id;
  id_bytes_[id] = std::move(bytes);
}

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

std::string BpeModel::decode(std::span<const int32_t> ids, const std::string& who) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || hole_[id])
      throw RuntimeError(who + ": cannot decode token " + std::to_string(id) + " (vocabulary " +
                         std::to_string(vocab_size()) + (id >= 0 && id < vocab_size() ? ", where it is a hole)" : ")"));
    out += id_bytes_[id];
  }
  return out;
}

void BpePieceEncoder::encode(std::string_view piece, std::vector<int32_t>& ids) {
  if (piece.size() == 1) {  // nothing to merge
    ids.push_back(model_.byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (const std::span<const int32_t> hit = cache_.find(piece); !hit.empty()) {
    ids.insert(ids.end(), hit.begin(), hit.end());
    return;
  }
  symbols_.clear();
  const auto whole = model_.ignore_merges_ ? model_.bytes_to_id_.find(piece) : model_.bytes_to_id_.end();
  if (whole != model_.bytes_to_id_.end()) {
    symbols_.push_back(whole->second);
  } else {
    for (char c : piece) symbols_.push_back(model_.byte_ids_[static_cast<unsigned char>(c)]);
    bpe_merge(model_.merges_, symbols_, scratch_);
  }
  ids.insert(ids.end(), symbols_.begin(), symbols_.end());
  cache_.insert(piece, symbols_);
}

}  // namespace pt
