// The split patterns picotrain knows by heart, and where text can be cut without changing the
// pieces they make (for encoding one long document on several threads).
//
// GPT-2's (OpenAI's encoder.py; also what a tokenizer.json's ByteLevel pre-tokenizer with
// use_regex runs):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Contractions are case-sensitive, as in GPT-2: "'S" is not one.
//
// Llama 3's (tiktoken's cl100k pattern, as Meta's tokenizer.json spells it): contractions in any
// case, a letter run with one optional non-letter, non-digit, non-newline before it, digits in
// groups of one to three, punctuation runs with the newlines after them, newline runs.
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
#pragma once
#include <cstddef>
#include <string_view>

namespace pt {

inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Where a pattern's pieces are known not to cross, between an ASCII non-space byte and:
//   any ASCII whitespace byte (GPT-2's pattern), or
//   a space, tab, \v or \f (Llama 3's: its punctuation alternative takes the \r and \n after it).
// In both, every alternative that can match the byte before the cut stops at that whitespace, and
// none that ended earlier looks past it ((?!\S) only follows whitespace); the piece starting at the
// cut is found from there alone, as neither pattern looks behind. Other patterns: no known cut.
enum class CutRule { none, before_ascii_space, before_blank };
CutRule cut_rule_for(std::string_view pattern);

// The smallest p >= from, p < text.size(), at which the rule allows a cut: the pieces of text[0, p)
// followed by those of text[p, end) are the pieces of text. npos when there is none.
size_t next_cut(CutRule rule, std::string_view text, size_t from);

}  // namespace pt
