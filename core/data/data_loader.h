// Batches of token sequences from llm.c shards, addressed by ONE global token cursor.
//
// The loader keeps no position of its own: the trainer owns the cursor, checkpoints it, and
// advances it by (sequences per step) * T after each step. A sequence's tokens depend only on
// (cursor, sequence index), never on which rank reads it, so a run resumes under any parallel
// layout and sees exactly the tokens it would have seen without the restart. Data-parallel rank
// d on micro-step m of a step reads first_sequence = (m * dp + d) * B.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/data/token_stream.h"

namespace pt {

class DataLoader {
 public:
  // B rows of T tokens per batch. Throws RuntimeError when the glob matches nothing, a shard is
  // malformed, or the shards hold fewer than T + 1 tokens (one input row and its targets).
  DataLoader(const std::string& glob, int vocab_size, int B, int T);

  uint64_t total_tokens() const { return stream_.total_tokens(); }

  // Sequence s of a step whose cursor is `cursor` occupies stream tokens
  // [cursor + s*T, cursor + s*T + T] (T + 1 tokens, wrapping modulo total_tokens). Fills
  // inputs[b*T + t] and targets[b*T + t] (B*T int32 each) for sequences
  // first_sequence .. first_sequence + B - 1. Const and stateless: safe to call from any thread.
  void load(uint64_t cursor, int64_t first_sequence, int32_t* inputs, int32_t* targets) const;

  // The shard paths, in stream order (for the start-up log).
  const std::vector<std::string>& files() const { return stream_.files(); }

 private:
  TokenStream stream_;
  int B_;
  int T_;
};

}  // namespace pt
