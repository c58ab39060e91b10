#include "core/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/common/error.h"

namespace pt {

namespace {

// Unicode White_Space (see the header): \t \n \v \f \r, space, NEL, NBSP, ogham space mark, the
// U+2000 block of spaces, line and paragraph separators, narrow NBSP, medium math space, ideographic
// space. The contents of a character class.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// The bytes of the UTF-8 character at text[i] (1 for an invalid byte).
size_t char_bytes(std::string_view text, size_t i) {
  size_t n = 1;
  while (n < 4 && i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
  return n;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  int depth = 0;  // of character classes (Oniguruma nests them; so do POSIX classes like [[:alpha:]])
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += depth > 0 ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (depth > 0)
          throw ConfigError("tokenizer regex: \\S inside a character class is not supported (in " + std::string(p) + ")");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (c == '[') {
      ++depth;
      // A ']' first in a class (after an optional '^') is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (c == ']' && depth > 0) {
      --depth;
    }
  }
  return out;
}

RegexPattern::RegexPattern(std::string_view pattern, const std::string& what) {
  const std::string pcre = oniguruma_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE where = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &where, nullptr);
  if (code_ == nullptr)
    throw ConfigError(what + ": PCRE2 cannot compile the split pattern " + std::string(pattern) + " (as " + pcre +
                      ") at offset " + std::to_string(where) + ": " + pcre2_message(err));
  // Without a JIT (some platforms) the interpreter gives the same matches, only slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

RegexPattern::~RegexPattern() { pcre2_code_free(code_); }

RegexSplitter::RegexSplitter(const RegexPattern& pattern) : pattern_(pattern) {
  match_ = pcre2_match_data_create_from_pattern(pattern_.code_, nullptr);
  if (match_ == nullptr) throw RuntimeError("pre-tokenizer: out of memory for PCRE2 match data");
}

RegexSplitter::~RegexSplitter() { pcre2_match_data_free(match_); }

void RegexSplitter::reset(std::string_view text) {
  text_ = text;
  pos_ = search_ = 0;
  held_ = false;
}

bool RegexSplitter::next(size_t& begin, size_t& end, bool& matched) {
  if (held_) {
    held_ = false;
    begin = held_begin_;
    end = pos_ = search_ = held_end_;
    matched = true;
    return true;
  }
  if (pos_ >= text_.size()) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  for (;;) {
    const int rc = search_ > text_.size() ? PCRE2_ERROR_NOMATCH
                   : pattern_.jit_        ? pcre2_jit_match(pattern_.code_, subject, text_.size(), search_, 0, match_, nullptr)
                                          : pcre2_match(pattern_.code_, subject, text_.size(), search_, 0, match_, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // the rest is a gap (with GPT-2's pattern: only invalid bytes)
      begin = pos_;
      end = pos_ = search_ = text_.size();
      matched = false;
      return true;
    }
    if (rc < 0) throw RuntimeError("pre-tokenizer: PCRE2 match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
    if (ov[1] > ov[0]) {
      if (ov[0] > pos_) {  // text before the match that no match covers: a piece of its own
        begin = pos_;
        end = pos_ = ov[0];
        held_begin_ = ov[0];
        held_end_ = ov[1];
        held_ = true;
        matched = false;
        return true;
      }
      begin = ov[0];
      end = pos_ = search_ = ov[1];
      matched = true;
      return true;
    }
    // An empty match ends nothing; look again from the next character, as Oniguruma does.
    search_ = ov[0] < text_.size() ? ov[0] + char_bytes(text_, ov[0]) : text_.size() + 1;
  }
}

}  // namespace pt
