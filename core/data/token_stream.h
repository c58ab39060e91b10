// The shards a glob names, read as one virtual stream: shard 0's tokens, then shard 1's, ...,
// and after the last token the stream starts again at the first (the epoch boundary).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/data/shard.h"

namespace pt {

// The paths matching a glob(3) pattern, sorted bytewise (not by locale) so every rank and
// every machine sees the same order. Throws RuntimeError naming the pattern when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

class TokenStream {
 public:
  // Opens every shard the glob matches. Throws RuntimeError when the glob matches nothing,
  // a shard is malformed, or the shards hold no tokens at all.
  TokenStream(const std::string& glob, int vocab_size);

  uint64_t total_tokens() const { return starts_.back(); }
  const std::vector<std::string>& files() const { return files_; }

  // Copies n tokens starting at stream position pos (taken modulo total_tokens) into out,
  // wrapping around past the end as often as needed.
  void read(uint64_t pos, uint64_t n, int32_t* out) const;

 private:
  std::vector<std::string> files_;
  std::vector<TokenShard> shards_;
  std::vector<uint64_t> starts_;  // starts_[i]: stream position of shard i's first token; back(): total
};

}  // namespace pt
