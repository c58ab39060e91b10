// llm.c token shards: a 1024-byte header of 256 little-endian int32 (magic 20240520, version 1,
// token count), then the tokens as uint16. The same files llm.c's dev/data scripts write, so
// shards move freely between the two programs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pt {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// The header stores the count as int32 (llm.c's writer asserts the same bound).
inline constexpr uint64_t kMaxShardTokens = 0x7fffffff;

// Writes `tokens` as a shard at `path`. The data goes to path + ".tmp", is fsynced and then
// renamed over `path`, so a run killed mid-write never leaves a half shard under the real name.
// Throws RuntimeError on I/O failure or when there are more than kMaxShardTokens tokens.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

// A read-only, memory-mapped shard. The header and the file size are checked when it is opened;
// token values are checked against vocab_size as they are read (see read()), so opening a large
// data set costs nothing, yet no out-of-range id ever reaches an embedding lookup.
class TokenShard {
 public:
  TokenShard(const std::string& path, int vocab_size);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return tokens_.size(); }  // in tokens
  // The raw tokens, unchecked.
  std::span<const uint16_t> tokens() const { return tokens_; }

  // Copies tokens [offset, offset + n) into out as int32. Throws RuntimeError naming the file
  // and the index of the first token >= vocab_size. Requires offset + n <= size().
  void read(uint64_t offset, uint64_t n, int32_t* out) const;

 private:
  void unmap() noexcept;

  std::string path_;
  int vocab_size_ = 0;
  void* map_ = nullptr;  // the whole file, header included
  size_t map_bytes_ = 0;
  std::span<const uint16_t> tokens_;
};

}  // namespace pt
