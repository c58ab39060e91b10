// The tokenizer files of a Hugging Face model folder, so that AutoTokenizer.from_pretrained(DIR)
// loads the tokenizer the model was trained with:
//
//   tokenizer.json           a Hugging Face tokenizer's own file, copied byte for byte; for GPT-2's
//                            encoder.json + vocab.bpe, the tokenizer.json Hugging Face's gpt2
//                            repository holds, built from them (gpt2_tokenizer_json)
//   tokenizer_config.json    the one beside the source file (its content); else PreTrainedTokenizerFast
//                            with the bos/eos tokens and model_max_length = model.max_seq_len
//   special_tokens_map.json  bos_token and eos_token
//   generation_config.json   bos_token_id and eos_token_id, which generate() stops at
//
// bos/eos are tokenizer_config.json's bos_token/eos_token when it names added tokens (Llama 3's
// <|begin_of_text|> and <|end_of_text|>), else the document marker picotrain's data starts each
// document with, for both (GPT-2's <|endoftext|>, 50256, as in Hugging Face's gpt2).
// The byte tokenizer has no such files: its documents end in a blank line, not a special token,
// which no Hugging Face tokenizer class reproduces.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/config/run_config.h"
#include "core/tokenizer/tokenizer.h"

namespace pt::ckpt {

struct HfSpecialTokens {
  std::string bos, eos;  // their text
  int32_t bos_id = -1, eos_id = -1;
};

// GPT-2's tokenizer.json as Hugging Face's gpt2 repository has it, from OpenAI's encoder.json and
// vocab.bpe in `dir`: the vocabulary, the merges as ["a", "b"] pairs, <|endoftext|> (50256) as an
// added special token, and the ByteLevel pre-tokenizer (GPT-2's regex), post-processor and decoder.
nlohmann::ordered_json gpt2_tokenizer_json(const std::string& dir);

// Writes the files above into `out_dir` (each atomically) for `tok` and returns its bos/eos;
// nullopt, writing nothing, for a tokenizer with no Hugging Face form (bytes).
std::optional<HfSpecialTokens> write_hf_tokenizer_files(const Tokenizer& tok, const ModelSection& model,
                                                        const std::string& out_dir);

}  // namespace pt::ckpt
