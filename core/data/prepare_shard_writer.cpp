#include "core/data/prepare_shard_writer.h"

#include <algorithm>
#include <cstdio>

#include "core/common/error.h"
#include "core/data/shard.h"
#include "core/common/console.h"

namespace pt {

namespace fs = std::filesystem;

std::string shard_name(const std::string& name, const std::string& split, uint64_t index) {
  char num[32];
  std::snprintf(num, sizeof(num), "%06llu", static_cast<unsigned long long>(index));
  return name + "_" + split + "_" + num + ".bin";
}

ShardWriter::ShardWriter(fs::path out_dir, std::string name, std::string split, uint64_t shard_tokens, bool wide,
                         std::vector<std::string>& files)
    : out_dir_(std::move(out_dir)), name_(std::move(name)), split_(std::move(split)), shard_tokens_(shard_tokens),
      wide_(wide), files_(files) {}

void ShardWriter::add(std::span<const int32_t> tokens) {
  if (finished_ && !tokens.empty()) throw RuntimeError("prepare: tokens added to the finished " + split_ + " split");
  const int64_t max_id = wide_ ? int64_t{0xFFFFFFFF} : int64_t{0xFFFF};
  for (int32_t id : tokens)
    if (id < 0 || id > max_id)  // prepare picks the width from the vocabulary; this guards it all the same
      throw RuntimeError("prepare: token " + std::to_string(id) + " does not fit a " + (wide_ ? "uint32" : "uint16") +
                         " shard");
  while (!tokens.empty()) {
    const size_t take = std::min<uint64_t>(tokens.size(), shard_tokens_ - buffer_.size());
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + take);
    tokens = tokens.subspan(take);
    if (buffer_.size() == shard_tokens_) flush();
  }
}

void ShardWriter::finish() {
  if (finished_) return;
  if (!buffer_.empty()) flush();
  remove_stale();
  finished_ = true;
}

void ShardWriter::flush() {
  const std::string path = (out_dir_ / shard_name(name_, split_, shards_)).string();
  if (wide_) {
    write_shard(path, std::span<const uint32_t>(buffer_));
  } else {
    narrow_.assign(buffer_.begin(), buffer_.end());
    write_shard(path, std::span<const uint16_t>(narrow_));
  }
  files_.push_back(path);
  written_ += buffer_.size();
  ++shards_;
  buffer_.clear();
}

// Deletes <name>_<split>_NNNNNN.bin with NNNNNN >= the number of shards just written.
void ShardWriter::remove_stale() const {
  const std::string prefix = name_ + "_" + split_ + "_";
  const std::string suffix = ".bin";
  std::error_code ec;
  for (fs::directory_iterator it(out_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string f = p.filename().string();
    if (f.size() != prefix.size() + 6 + suffix.size() || !f.starts_with(prefix) || !f.ends_with(suffix)) continue;
    const std::string digits = f.substr(prefix.size(), 6);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (std::stoull(digits) < shards_) continue;
    print_line(Stream::err, "prepare: removing stale shard " + p.string() + " from an earlier run");
    std::error_code rm;
    if (!fs::remove(p, rm) && rm)
      throw RuntimeError("prepare: cannot remove stale shard " + p.string() + ": " + rm.message());
  }
  if (ec) throw RuntimeError("prepare: cannot list " + out_dir_.string() + ": " + ec.message());
}

}  // namespace pt
