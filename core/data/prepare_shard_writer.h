// Cuts one split's token stream into numbered llm.c shards: <out_dir>/<name>_<split>_NNNNNN.bin,
// each at most shard_tokens tokens, numbered from 0. Version 1 (uint16 tokens) unless `wide`:
// version 7 (uint32), which prepare asks for when the tokenizer has ids past 65,535 (Llama 3).
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace pt {

std::string shard_name(const std::string& name, const std::string& split, uint64_t index);

class ShardWriter {
 public:
  // The paths written are appended to `files`, in order.
  ShardWriter(std::filesystem::path out_dir, std::string name, std::string split, uint64_t shard_tokens, bool wide,
              std::vector<std::string>& files);

  // Throws RuntimeError for an id that does not fit the shard's width.
  void add(std::span<const int32_t> tokens);
  // Writes the last, partial shard, then deletes this split's shards left by an older, larger run,
  // so that a glob never mixes two runs. Idempotent; nothing may be added afterwards.
  void finish();
  uint64_t tokens() const { return written_; }

 private:
  void flush();
  void remove_stale() const;

  std::filesystem::path out_dir_;
  std::string name_, split_;
  uint64_t shard_tokens_;
  bool wide_;
  std::vector<std::string>& files_;
  std::vector<uint32_t> buffer_;
  std::vector<uint16_t> narrow_;  // the buffer as uint16, for a version-1 shard
  uint64_t shards_ = 0, written_ = 0;
  bool finished_ = false;
};

}  // namespace pt
