#include "core/tokenizer/added_tokens.h"

#include <algorithm>

namespace pt {

void AddedTokens::add(std::string content, int32_t id) {
  auto& bucket = by_first_byte_[static_cast<unsigned char>(content[0])];
  tokens_.push_back({std::move(content), id});
  bucket.push_back(static_cast<uint32_t>(tokens_.size() - 1));
  std::stable_sort(bucket.begin(), bucket.end(),
                   [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

std::optional<AddedTokens::Match> AddedTokens::find(std::string_view text, size_t from) const {
  if (tokens_.empty()) return std::nullopt;
  // Most text holds no added token at all: a byte whose bucket is empty costs one load.
  for (size_t p = from; p < text.size(); ++p) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[p])];
    for (uint32_t i : bucket) {
      const std::string& c = tokens_[i].content;
      if (text.compare(p, c.size(), c) == 0) return Match{p, p + c.size(), tokens_[i].id};
    }
  }
  return std::nullopt;
}

bool AddedTokens::any_holds_ascii_space() const {
  return std::any_of(tokens_.begin(), tokens_.end(), [](const Token& t) {
    return std::any_of(t.content.begin(), t.content.end(), [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
  });
}

}  // namespace pt
