// The regex that cuts text into pieces before BPE, which never merges across two pieces: GPT-2's
// (split_patterns.h), or any `Split` pattern of a Hugging Face tokenizer.json.
//
// Patterns are written as in tokenizer.json, for Oniguruma (the regex engine of Hugging Face's
// Rust tokenizers), and run by PCRE2 in UTF mode with Unicode properties (letters \p{L}, numbers
// \p{N} from PCRE2's Unicode tables: Unicode 14 in Debian 12's PCRE2 10.42; characters assigned
// later split like punctuation). One difference between the two engines matters to these
// patterns and is translated (oniguruma_to_pcre2): whitespace \s. Oniguruma's is Unicode
// White_Space, which is also what OpenAI's encoder.py (Python's `regex` module) and tiktoken use:
// it includes U+0085 (NEL) and excludes U+FEFF (BOM). PCRE2's own \s differs (no U+0085), and so
// does JavaScript's (U+FEFF, no U+0085), so the class is spelled out.
//
// Invalid UTF-8. The reference encoders work on decoded text and have no rule for bytes that are
// not UTF-8. Ours: the regex runs over the valid text (PCRE2_MATCH_INVALID_UTF), an ill-formed
// byte is matched by nothing and so ends a piece (a whitespace run before it counts as followed
// by nothing), and each maximal run of such bytes becomes a piece of its own, encoded by BPE like
// any other. Every byte thus lands in exactly one piece: decode(encode(x)) == x for any bytes, and
// valid UTF-8 encodes exactly as the reference does.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace pt {

// `pattern` (Oniguruma syntax, as in tokenizer.json) in PCRE2's: \s and \S spelled out as Unicode
// White_Space. Throws ConfigError for \S inside a character class, which has no such spelling.
std::string oniguruma_to_pcre2(std::string_view pattern);

// A compiled pattern (JIT-compiled when the platform allows). Shared, read-only, by all threads.
class RegexPattern {
 public:
  // `pattern` in tokenizer.json's (Oniguruma's) syntax. Throws ConfigError, prefixed by `what`,
  // when PCRE2 cannot compile it.
  RegexPattern(std::string_view pattern, const std::string& what);
  ~RegexPattern();
  RegexPattern(const RegexPattern&) = delete;
  RegexPattern& operator=(const RegexPattern&) = delete;

 private:
  friend class RegexSplitter;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// Iterates over the pieces of one text: the matches of the pattern and, between them, the text no
// match covers (invalid bytes always). One per thread (it owns PCRE2's match state).
class RegexSplitter {
 public:
  explicit RegexSplitter(const RegexPattern& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Starts over on `text`, which must outlive the iteration.
  void reset(std::string_view text);
  // The next piece, as [begin, end) offsets into the text, never empty, and whether the pattern
  // matched it (false: a gap between matches); false at the end. Empty matches are skipped, as
  // Oniguruma's find-all does.
  bool next(size_t& begin, size_t& end, bool& matched);
  bool next(size_t& begin, size_t& end) {
    bool matched;
    return next(begin, end, matched);
  }

 private:
  const RegexPattern& pattern_;
  pcre2_real_match_data_8* match_ = nullptr;
  std::string_view text_;
  size_t pos_ = 0;     // where the next piece starts
  size_t search_ = 0;  // where the next match is searched from (past pos_ after an empty match)
  // A match found after a gap, returned on the next call.
  size_t held_begin_ = 0, held_end_ = 0;
  bool held_ = false;
};

}  // namespace pt
