// Test texts shared by the tokenizer tests (test_tokenizer, test_hf_tokenizer): hand-picked cases,
// one per thing the pre-tokenizers and BPE treat specially, and random mixes of them.
#pragma once
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace pt::test {

using Ids = std::vector<int32_t>;

// Hand-picked cases, one per thing GPT-2's pre-tokenizer and BPE treat specially. All valid UTF-8.
inline const std::vector<std::string>& named_cases() {
  static const std::vector<std::string> cases = {
      // ASCII prose
      "Hello world, the quick brown fox.",
      "It was the best of times, it was the worst of times; it was the age of wisdom...",
      "In the beginning God created the heaven and the earth.\n\nAnd the earth was without form, and void.",
      // runs of spaces, tabs and newlines: \s+(?!\S) leaves the last space to the next word
      "a  b   c    d", "   leading", "trailing   ", "\n\n\nparagraph\n\n", "tab\there\t\tand\t", "mixed \t\n \r\n x",
      "    ", "\n", " ", "x \n y", "end \n", "\r\n\r\n",
      // contractions, and their uppercase forms, which GPT-2 does NOT special-case
      "it's don't they're we've I'm you'll he'd", "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D", "'s't're've'm'll'd",
      "rock'n'roll o'clock", "' s 's' ''s", "the dog's 'quoted' 'stuff'", "x'S y'Ll z'D",
      // numbers
      "1 12 123 1234 12345 3.14159 -42 1e10 0x1F 2024-11-21 10,000,000", "abc123def 456ghi",
      "phone: +1 (555) 012-3456", "٣٤٥ ５６ Ⅻ ² ½ ¾",
      // punctuation runs
      "!!! ??? ... --- *** ### $$$ %%% &&& ((( ))) [[[ ]]] {{{ }}}", "\"quoted\" 'single' `back`",
      "a,b;c:d.e!f?g", "...and then—she left…", "<|endoftext|>", "<html><body>x</body></html>", "@#$%^&*()_+-=",
      "C:\\path\\to\\file.txt", "http://example.com/a?b=c&d=e#f",
      // accented Latin, Greek, Cyrillic
      "café naïve résumé Ångström façade", "Straße Øresund œuvre Ñandú", "Ελληνικά κείμενο", "Русский текст здесь",
      // CJK, Hangul, kana
      "中文文本测试", "日本語のテキスト、ひらがなとカタカナ。", "한국어 텍스트", "混合 mixed テキスト text",
      // emoji, skin tones, flags, ZWJ sequences
      "I love 🍕 and 🎉!", "👍🏽👋🏿", "🇺🇸🇯🇵", "👨‍👩‍👧‍👦 family", "😀😃😄😁",
      // combining marks (category M: not a letter, so they split from the letter before)
      "e\u0301 a\u0308 c\u0327", "Z\u0351\u0359\u0334a\u0336l\u0337g\u0338o", "n\u0303o\u0303", "\u0915\u094D\u0937",
      // other Unicode whitespace that every encoder agrees on, and format characters
      "a\u00A0b", "x\u2003y\u3000z", "line\u2028sep", "zero\u200Bwidth", "a \u00A0 b",
      // astral letters and symbols
      "𝐀𝐁𝐂 𐍈𐌰", "𝟘𝟙𝟚", "♠♥♦♣ ★☆",
  };
  return cases;
}

// Random strings over pools of characters from each class above (no U+0085 / U+FEFF, on which the
// JavaScript encoder deviates from GPT-2; tested separately). Deterministic.
inline std::vector<std::string> random_cases(size_t count, uint32_t seed) {
  const std::vector<std::string> pool = {
      "a", "b", "Z", "the", "The", "word", "0", "7", "42", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", ".", ",", "!",
      "?", "'", "\"", "-", "(", ")", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "é", "ü", "ß", "Å",
      "\u0301", "\u0308", "α", "Ω", "д", "中", "文", "日本", "ひ", "カ", "한", "٣", "５", "Ⅻ", "½", "😀", "👍🏽", "🇺🇸",
      "\u200D", "\u200B", "\u00A0", "\u2003", "\u3000", "𝐀", "𝟙", "♥", "…", "—", "€", "<|endoftext|>", "$", "#"};
  std::mt19937 gen(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t len = 1 + gen() % 40;
    for (size_t j = 0; j < len; ++j) s += pool[gen() % pool.size()];
    out.push_back(s);
  }
  return out;
}

inline std::string ids_text(const Ids& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

// Encoding a text in two parts cut at each of the tokenizer's next_cut places gives the tokens of
// the whole (what lets prepare encode a long document in parallel pieces); returns the number of
// cuts checked.
template <class Tok>
size_t check_cuts_keep_tokens(const Tok& tok, const std::vector<std::string>& texts) {
  size_t cuts = 0;
  for (const auto& text : texts) {
    const Ids whole = tok.encode(text);
    for (size_t p = tok.next_cut(text, 0); p != std::string::npos; p = tok.next_cut(text, p + 1)) {
      INFO("text \"" << text << "\" cut at " << p);
      REQUIRE(p < text.size());
      Ids parts = tok.encode(std::string_view(text).substr(0, p));
      const Ids rest = tok.encode(std::string_view(text).substr(p));
      parts.insert(parts.end(), rest.begin(), rest.end());
      REQUIRE(ids_text(parts) == ids_text(whole));
      ++cuts;
    }
  }
  return cuts;
}

}  // namespace pt::test
