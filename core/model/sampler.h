// Sampling from a language model: choosing each next token from the logits (temperature,
// top-k, a counter-based random stream so a continuation reproduces), the generation loop over
// a KvCacheDecoder, and turning token bytes back into whole UTF-8 characters as they arrive.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/kv_cache_decoder.h"

namespace pt {

struct SampleOptions {
  int max_new_tokens = 128;
  double temperature = 0.8;  // 0: greedy (argmax)
  int top_k = 200;           // candidates: the top_k most likely tokens; 0: the whole vocabulary
  uint64_t seed = 1337;
  int32_t stop_token = -1;   // generation ends after this token (GPT-2's <|endoftext|>); -1: never
};

// The token to emit after `logits`. temperature == 0: the argmax (the lowest id among equal
// maxima). Otherwise softmax(logits / temperature) restricted to the top_k largest logits (ties
// at the cut go to the lower id), accumulated in ascending id order in double precision; the
// token is the first whose cumulative probability exceeds u * total, u in [0, 1). With top_k = 1
// this is the argmax whatever u is.
int32_t choose_token(std::span<const float> logits, double temperature, int top_k, double u);

// The uniform number that picks the i-th sampled token (0-based) of a run with `seed`: a pure
// function of (seed, i), so a continuation depends only on the weights, the prompt and the
// options, never on what was sampled before in the process.
double sample_uniform(uint64_t seed, uint64_t i);

// Primes `decoder` with `context` (at least one token) and samples up to o.max_new_tokens
// tokens among the first `vocab` ids, calling on_token(id) for each as soon as it is chosen (the
// stop token included, which ends the loop). Returns the sampled tokens.
std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> context, const SampleOptions& o,
                              int vocab, const std::function<void(int32_t)>& on_token = {});

// Bytes in, printable text out: a token may end inside a multi-byte UTF-8 character (GPT-2's
// byte-level BPE splits emoji and CJK across tokens, the byte tokenizer splits everything), so
// push() returns only what can no longer change: every complete character, and bytes that can
// never become part of one (invalid UTF-8 passes through unchanged, as decode() produced it).
// An incomplete sequence at the end waits for the next push; flush() returns it at the end.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

// The tokenizer a model's vocabulary implies: 256 -> "bytes", 50257 -> "gpt2", 128256 -> "llama3",
// else "".
std::string tokenizer_for_vocab(int vocab_size);
// Those vocabularies, for a message about a model with none of them: "the byte tokenizer's (256),
// GPT-2's (50257) or Llama 3's (128256)".
const char* vocabularies_with_a_tokenizer();

}  // namespace pt
