#include "core/tokenizer/split_patterns.h"

namespace pt {

namespace {
bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }
}  // namespace

CutRule cut_rule_for(std::string_view pattern) {
  if (pattern == kGpt2SplitPattern) return CutRule::before_ascii_space;
  if (pattern == kLlama3SplitPattern) return CutRule::before_blank;
  return CutRule::none;
}

size_t next_cut(CutRule rule, std::string_view text, size_t from) {
  if (rule == CutRule::none) return std::string_view::npos;
  const bool any_space = rule == CutRule::before_ascii_space;
  for (size_t p = from == 0 ? 1 : from; p < text.size(); ++p) {
    const auto c = static_cast<unsigned char>(text[p]);
    if (!(any_space ? is_ascii_space(c) : is_blank(c))) continue;
    const auto before = static_cast<unsigned char>(text[p - 1]);
    if (before < 0x80 && !is_ascii_space(before)) return p;
  }
  return std::string_view::npos;
}

}  // namespace pt
