// GPT-2's pre-tokenizer: the regex that cuts text into pieces before BPE, which never merges
// across two pieces.
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// It is run by PCRE2 in UTF mode with Unicode properties (letters \p{L}, numbers \p{N} from
// PCRE2's Unicode tables: Unicode 14 in Debian 12's PCRE2 10.42; characters assigned later split
// like punctuation). Contractions are case-sensitive, as in GPT-2: "'S" is not one.
//
// Whitespace (\s) is the Unicode White_Space property, which is what OpenAI's encoder.py
// (Python's `regex` module) and tiktoken use: it includes U+0085 (NEL) and excludes U+FEFF (BOM).
// PCRE2's own \s differs (no U+0085), and so does JavaScript's (U+FEFF, no U+0085), so the class is
// spelled out.
//
// Invalid UTF-8. OpenAI's encoder works on decoded text and has no rule for bytes that are not
// UTF-8. Ours: the regex runs over the valid text (PCRE2_MATCH_INVALID_UTF), an ill-formed byte is
// matched by nothing and so ends a piece (a whitespace run before it counts as followed by
// nothing), and each maximal run of such bytes becomes a piece of its own, encoded by BPE like any
// other. Every byte thus lands in exactly one piece: decode(encode(x)) == x for any bytes, and
// valid UTF-8 encodes exactly as in GPT-2.
#pragma once
#include <cstddef>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace pt {

// The compiled pattern (JIT-compiled when the platform allows). Shared, read-only, by all threads.
class Gpt2Pattern {
 public:
  Gpt2Pattern();
  ~Gpt2Pattern();
  Gpt2Pattern(const Gpt2Pattern&) = delete;
  Gpt2Pattern& operator=(const Gpt2Pattern&) = delete;

  // The smallest p >= from, p < text.size(), at which text can be cut without changing its pieces:
  // the pieces of text[0, p) followed by those of text[p, end) are the pieces of text. Returns
  // npos when there is none. Used to cut long documents for parallel encoding.
  static size_t next_cut(std::string_view text, size_t from);

 private:
  friend class Gpt2Splitter;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// Iterates over the pieces of one text. One per thread (it owns PCRE2's match state).
class Gpt2Splitter {
 public:
  explicit Gpt2Splitter(const Gpt2Pattern& pattern);
  ~Gpt2Splitter();
  Gpt2Splitter(const Gpt2Splitter&) = delete;
  Gpt2Splitter& operator=(const Gpt2Splitter&) = delete;

  // Starts over on `text`, which must outlive the iteration.
  void reset(std::string_view text);
  // The next piece, as [begin, end) offsets into the text; false at the end.
  bool next(size_t& begin, size_t& end);

 private:
  const Gpt2Pattern& pattern_;
  pcre2_real_match_data_8* match_ = nullptr;
  std::string_view text_;
  size_t pos_ = 0;
  // A match found after a run of invalid bytes, returned on the next call.
  size_t held_begin_ = 0, held_end_ = 0;
  bool held_ = false;
};

}  // namespace pt
