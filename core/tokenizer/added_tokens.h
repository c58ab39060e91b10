// Added tokens of a tokenizer.json (special tokens such as Llama 3's <|begin_of_text|>, and any
// other added_tokens): found in the raw text before it is pre-tokenized, as Hugging Face's
// tokenizers do, leftmost first and, among those starting at the same byte, longest first.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pt {

class AddedTokens {
 public:
  struct Match {
    size_t begin = 0, end = 0;
    int32_t id = -1;
  };

  // `content` must not be empty.
  void add(std::string content, int32_t id);
  bool empty() const { return tokens_.empty(); }
  // The first match in text[from, end), or nullopt.
  std::optional<Match> find(std::string_view text, size_t from) const;
  // Whether some token holds an ASCII whitespace byte (then a cut before whitespace could split
  // one of its matches: split_patterns.h's cut rules no longer hold).
  bool any_holds_ascii_space() const;

 private:
  struct Token {
    std::string content;
    int32_t id;
  };
  std::vector<Token> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into tokens_, longest first
};

}  // namespace pt
