// Reads a Hugging Face tokenizer.json (and the tokenizer_config.json beside it, when there is one)
// into what a byte-level BPE tokenizer needs, refusing every kind it cannot encode exactly.
//
// Accepted, as byte-level BPE models (GPT-2, Llama 3, ...) write them:
//   model          type BPE: vocab (spelled in GPT-2's byte characters), merges as "a b" strings
//                  or ["a", "b"] pairs (rank = order), ignore_merges; no byte_fallback, subword
//                  prefix/suffix or dropout
//   normalizer     null, or an empty Sequence
//   pre_tokenizer  ByteLevel (add_prefix_space false; use_regex: GPT-2's split pattern), Split
//                  (a Regex or String pattern, behavior Isolated or Removed, invert), or a
//                  Sequence of these with every Split before the ByteLevel; a ByteLevel is required
//   decoder        null or ByteLevel
//   added_tokens   matched in the raw text (no lstrip, rstrip or single_word)
//   post_processor ignored: it only adds special tokens around a sequence when asked to, which
//                  picotrain never asks (prepare puts the document marker itself)
// Refused with a ConfigError that names the kind: other models (Unigram, the SentencePiece kind;
// WordPiece; WordLevel), normalizers (NFC, NFKC, Lowercase, ...) and pre-tokenizers (Metaspace,
// Whitespace, BertPreTokenizer, Digits, ...), which are not byte-level BPE.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace pt {

struct HfTokenizerFile {
  struct Split {
    std::string pattern;  // in Oniguruma's syntax, as in the file
    bool keep_matches = true, keep_gaps = true;  // Isolated keeps both; Removed drops one side
  };
  struct AddedToken {
    int32_t id = -1;
    std::string content;
  };
  std::string path;        // of tokenizer.json
  nlohmann::json vocab;    // model.vocab
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
  std::vector<Split> splits;  // the pre-tokenizer's regex stages, applied in order
  std::vector<AddedToken> added;
  // The id of the added token that starts every document in prepare (see hf_tokenizer.h); -1 when
  // none is known.
  int32_t document_marker_id = -1;
};

// `path` is a tokenizer.json or a folder holding one. Throws ConfigError naming the file for a
// missing or malformed file and for every refused kind.
HfTokenizerFile read_hf_tokenizer_file(const std::string& path);

}  // namespace pt
