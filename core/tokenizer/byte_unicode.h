// GPT-2's reversible byte <-> unicode mapping (bytes_to_unicode in OpenAI's encoder.py).
//
// encoder.json and vocab.bpe spell every token as a string of "byte characters": printable
// Latin-1 bytes (! to ~, ¡ to ¬, ® to ÿ) stand for themselves and the other 68 bytes (controls,
// space, NBSP, soft hyphen) are shifted to U+0100.. so that no token contains whitespace or a
// control character. The tokenizer itself works on raw bytes; this mapping is only used to turn the
// files' spellings back into bytes when they are loaded.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace pt {

// The code point that stands for each byte.
const std::array<char32_t, 256>& gpt2_byte_to_unicode();

// The bytes a token spelled in byte characters (UTF-8 encoded) stands for; nullopt when the text is
// not valid UTF-8 or holds a character that stands for no byte.
std::optional<std::string> gpt2_unicode_to_bytes(std::string_view spelled);

}  // namespace pt
