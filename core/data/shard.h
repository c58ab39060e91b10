// llm.c token shards: a 1024-byte header of 256 little-endian int32 (magic 20240520, version,
// token count), then the tokens: version 1 holds uint16 (GPT-2's 50,257 ids fit), version 7
// uint32 (Llama 3's 128,256 do not). The same files llm.c's dev/data scripts write, so shards
// move freely between the two programs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pt {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;     // uint16 tokens
inline constexpr int32_t kShardVersion32 = 7;   // uint32 tokens
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// The header stores the count as int32 (llm.c's writer asserts the same bound).
inline constexpr uint64_t kMaxShardTokens = 0x7fffffff;

// Writes `tokens` as a shard at `path`. The data goes to path + ".tmp", is fsynced and then
// renamed over `path`, so a run killed mid-write never leaves a half shard under the real name.
// Throws RuntimeError on I/O failure or when there are more than kMaxShardTokens tokens.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);
// The same as a version-7 shard of uint32 tokens, for vocabularies past 65,536 ids.
void write_shard(const std::string& path, std::span<const uint32_t> tokens);

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
  uint64_t size() const { return size_; }  // in tokens
  int version() const { return version_; }  // kShardVersion (uint16) or kShardVersion32 (uint32)
  // The raw tokens, unchecked, of a version-1 shard (tokens()) or a version-7 one (tokens32());
  // asking for the other width is an error naming the file.
  std::span<const uint16_t> tokens() const;
  std::span<const uint32_t> tokens32() const;

  // Copies tokens [offset, offset + n) into out as int32. Throws RuntimeError naming the file
  // and the index of the first token >= vocab_size. Requires offset + n <= size().
  void read(uint64_t offset, uint64_t n, int32_t* out) const;

 private:
  void unmap() noexcept;

  std::string path_;
  int vocab_size_ = 0;
  void* map_ = nullptr;  // the whole file, header included
  size_t map_bytes_ = 0;
  int version_ = 0;
  uint64_t size_ = 0;
  const void* data_ = nullptr;  // the first token
};

}  // namespace pt
