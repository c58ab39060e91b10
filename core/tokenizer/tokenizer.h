// Tokenizers: text (bytes) <-> token ids. `prepare` turns corpora into shards with them, and
// sampling turns prompts into ids and ids back into text.
//
//   "bytes"  one token per byte, vocabulary 256 (byte_tokenizer.h)
//   "gpt2"   OpenAI GPT-2's byte-level BPE, vocabulary 50257, from encoder.json + vocab.bpe
//            (gpt2_tokenizer.h)
//   "llama3" Meta Llama 3's byte-level BPE, vocabulary 128256, from its Hugging Face
//            tokenizer.json (hf_tokenizer.h)
//   a path   any byte-level BPE tokenizer.json, or a folder holding one (hf_tokenizer.h)
//
// All take any bytes: decode(encode(x)) == x for every byte string x.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pt {

// The per-thread half of a tokenizer: its scratch space and caches. Create one per thread with
// Tokenizer::encoder(); it must not outlive its tokenizer.
class TokenEncoder {
 public:
  virtual ~TokenEncoder() = default;
  // Appends the tokens of `text` to `ids`. When `starts` is given, appends for each token the byte
  // offset in `text` of the first byte of the piece it came from (non-decreasing).
  virtual void encode(std::string_view text, std::vector<int32_t>& ids, std::vector<size_t>* starts = nullptr) = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int vocab_size() const = 0;
  virtual std::unique_ptr<TokenEncoder> encoder() const = 0;
  // The bytes of `ids`. Throws RuntimeError for an id outside [0, vocab_size).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // What `prepare` puts around every document: GPT-2 starts each with <|endoftext|> and Llama 3
  // with <|begin_of_text|>, as llm.c's data scripts do; the byte tokenizer has no special ids and
  // ends each with a blank line.
  virtual std::vector<int32_t> document_prefix() const = 0;
  virtual std::vector<int32_t> document_suffix() const = 0;

  // The smallest p >= from, p < text.size(), such that encoding text[0, p) and text[p, end)
  // separately gives the tokens of text; npos when there is none. Lets long documents be
  // encoded in parallel pieces with exactly the tokens of the whole.
  virtual size_t next_cut(std::string_view text, size_t from) const = 0;

  // Convenience for short texts (a prompt, a test): builds a fresh encoder on each call.
  std::vector<int32_t> encode(std::string_view text) const;
};

// "bytes", "gpt2", "llama3", or the path of a tokenizer.json or of a folder holding one. `dir` holds
// the named tokenizer's files (gpt2: encoder.json and vocab.bpe; llama3: tokenizer.json); "" means
// default_tokenizer_dir(name). Throws ConfigError for an unknown name or missing/broken files.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& dir = "");

// bytes, gpt2, llama3: the tokenizers known by name, whose files (if any) are picotrain's own.
bool is_named_tokenizer(const std::string& name);

// Whether make_tokenizer takes `name`: a known name, or an existing file or folder (checked when
// it is read). For command-line checks.
bool is_tokenizer_name(const std::string& name);
inline constexpr const char* kTokenizerNames = "bytes, gpt2, llama3, or a tokenizer.json (or a folder holding one)";

// <repo>/data/<name> (gpt2, llama3), where scripts/get_data.sh puts the tokenizer files.
std::string default_tokenizer_dir(const std::string& name);

}  // namespace pt
