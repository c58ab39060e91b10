#include "core/tokenizer/byte_unicode.h"

#include <cstdint>

namespace pt {

const std::array<char32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable(b) ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

namespace {

// Inverse of gpt2_byte_to_unicode: code points 0..323 -> byte, or -1.
const std::array<int16_t, 512>& unicode_to_byte() {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    const auto& fwd = gpt2_byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return table;
}

// Decodes one UTF-8 character of at most two bytes (every byte character is below U+0800).
// Returns the code point and advances i, or -1.
int32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return s[i++];
  if ((b0 & 0xE0) != 0xC0 || i + 1 >= s.size()) return -1;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if ((b1 & 0xC0) != 0x80) return -1;
  const int32_t cp = ((b0 & 0x1F) << 6) | (b1 & 0x3F);
  if (cp < 0x80) return -1;  // overlong
  i += 2;
  return cp;
}

}  // namespace

std::optional<std::string> gpt2_unicode_to_bytes(std::string_view spelled) {
  const auto& inverse = unicode_to_byte();
  std::string bytes;
  bytes.reserve(spelled.size());
  for (size_t i = 0; i < spelled.size();) {
    const int32_t cp = next_code_point(spelled, i);
    if (cp < 0 || cp >= static_cast<int32_t>(inverse.size()) || inverse[cp] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(inverse[cp]));
  }
  return bytes;
}

}  // namespace pt
