#include "core/tokenizer/gpt2_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "core/common/error.h"

namespace pt {

namespace {

// Unicode White_Space (see the header): \t \n \v \f \r, space, NEL, NBSP, ogham space mark, the
// U+2000 block of spaces, line and paragraph separators, narrow NBSP, medium math space, ideographic
// space.
#define PT_WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" PT_WS "\\p{L}\\p{N}]+|[" PT_WS "]+(?![^" PT_WS "])|[" PT_WS "]+";
#undef PT_WS

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

Gpt2Pattern::Gpt2Pattern() {
  int err = 0;
  PCRE2_SIZE where = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &where, nullptr);
  if (code_ == nullptr)
    throw RuntimeError("GPT-2 pre-tokenizer: PCRE2 cannot compile the pattern at offset " + std::to_string(where) +
                       ": " + pcre2_message(err));
  // Without a JIT (some platforms) the interpreter gives the same matches, only slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Gpt2Pattern::~Gpt2Pattern() { pcre2_code_free(code_); }

size_t Gpt2Pattern::next_cut(std::string_view text, size_t from) {
  // A cut between an ASCII non-space character and ASCII whitespace is always a piece boundary:
  // every alternative that can match the character before stops at whitespace, and none that
  // ended earlier looks past it ((?!\S) only follows whitespace). The piece starting at the cut is
  // found from there alone, as the pattern has no look-behind.
  for (size_t p = from == 0 ? 1 : from; p < text.size(); ++p) {
    const auto before = static_cast<unsigned char>(text[p - 1]);
    if (is_ascii_space(static_cast<unsigned char>(text[p])) && before < 0x80 && !is_ascii_space(before)) return p;
  }
  return std::string_view::npos;
}

Gpt2Splitter::Gpt2Splitter(const Gpt2Pattern& pattern) : pattern_(pattern) {
  match_ = pcre2_match_data_create_from_pattern(pattern_.code_, nullptr);
  if (match_ == nullptr) throw RuntimeError("GPT-2 pre-tokenizer: out of memory for PCRE2 match data");
}

Gpt2Splitter::~Gpt2Splitter() { pcre2_match_data_free(match_); }

void Gpt2Splitter::reset(std::string_view text) {
  text_ = text;
  pos_ = 0;
  held_ = false;
}

bool Gpt2Splitter::next(size_t& begin, size_t& end) {
  if (held_) {
    held_ = false;
    begin = held_begin_;
    end = pos_ = held_end_;
    return true;
  }
  if (pos_ >= text_.size()) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  const int rc = pattern_.jit_ ? pcre2_jit_match(pattern_.code_, subject, text_.size(), pos_, 0, match_, nullptr)
                               : pcre2_match(pattern_.code_, subject, text_.size(), pos_, 0, match_, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid bytes are left
    begin = pos_;
    end = pos_ = text_.size();
    return true;
  }
  if (rc < 0) throw RuntimeError("GPT-2 pre-tokenizer: PCRE2 match failed: " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
  // Every alternative consumes at least one character, so a match is never empty.
  if (ov[1] <= ov[0] || ov[0] < pos_) throw RuntimeError("GPT-2 pre-tokenizer: unexpected empty match");
  if (ov[0] > pos_) {  // invalid bytes before the match: they are a piece of their own
    begin = pos_;
    end = ov[0];
    held_begin_ = ov[0];
    held_end_ = ov[1];
    held_ = true;
    pos_ = ov[0];
    return true;
  }
  begin = ov[0];
  end = pos_ = ov[1];
  return true;
}

}  // namespace pt
