#include "core/data/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>

#include "core/common/error.h"
#include "core/data/shard.h"

namespace pt {

namespace fs = std::filesystem;

namespace {

void validate(const PrepareOptions& o) {
  if (o.tokenizer != "bytes")
    throw ConfigError("prepare: unknown tokenizer '" + o.tokenizer +
                      "' (known: bytes; GPT-2 BPE is not implemented yet)");
  if (o.inputs.empty()) throw ConfigError("prepare: no input given (pass text files or directories with --input)");
  if (o.out_dir.empty()) throw ConfigError("prepare: no output directory given (--out)");
  if (o.name.empty() || o.name.find('/') != std::string::npos)
    throw ConfigError("prepare: name='" + o.name + "' must be a non-empty file name prefix without '/'");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw ConfigError("prepare: val_fraction=" + std::to_string(o.val_fraction) + " must be in [0, 1)");
  if (o.shard_tokens == 0 || o.shard_tokens > kMaxShardTokens)
    throw ConfigError("prepare: shard_tokens=" + std::to_string(o.shard_tokens) + " must be in [1, " +
                      std::to_string(kMaxShardTokens) + "] (the shard header stores an int32 count)");
}

bool is_hidden(const fs::path& p) { return p.filename().string().starts_with('.'); }

// The documents under one directory, sorted; hidden entries and the output directory are skipped.
std::vector<fs::path> walk_directory(const fs::path& dir, const fs::path& out_dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  while (!ec && it != end) {
    // An entry we cannot stat (a dangling link) is neither a directory nor a file: skipped.
    std::error_code ignored;
    if (it->is_directory(ignored)) {
      if (is_hidden(it->path()) || fs::equivalent(it->path(), out_dir, ignored)) it.disable_recursion_pending();
    } else if (!is_hidden(it->path()) && it->is_regular_file(ignored)) {
      found.push_back(it->path());
    }
    it.increment(ec);
  }
  if (ec) throw RuntimeError("prepare: cannot read directory " + dir.string() + ": " + ec.message());
  std::sort(found.begin(), found.end());
  return found;
}

// Every input file, in order: explicit files as given, directories expanded (see prepare.h).
std::vector<fs::path> list_documents(const std::vector<std::string>& inputs, const fs::path& out_dir) {
  std::vector<fs::path> docs;
  for (const auto& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (!fs::exists(st)) throw ConfigError("prepare: input '" + input + "' does not exist");
    if (fs::is_directory(st)) {
      if (fs::equivalent(input, out_dir, ec))
        throw ConfigError("prepare: input '" + input + "' is the output directory; write the shards elsewhere");
      auto found = walk_directory(input, out_dir);
      docs.insert(docs.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(st)) {
      docs.emplace_back(input);
    } else {
      throw ConfigError("prepare: input '" + input + "' is neither a regular file nor a directory");
    }
  }
  return docs;
}

// The rule documented in prepare.h.
uint64_t val_tokens_for(uint64_t total, double fraction) {
  if (fraction <= 0.0 || total < 2) return 0;
  auto val = static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(total)));
  if (val < kMinValTokens) val = std::max(val, std::min(kMinValTokens, total / 2));
  return std::min(val, total - 1);
}

std::string shard_name(const std::string& name, const std::string& split, uint64_t index) {
  char num[32];
  std::snprintf(num, sizeof(num), "%06llu", static_cast<unsigned long long>(index));
  return name + "_" + split + "_" + num + ".bin";
}

// Cuts one split's token stream into numbered shards of at most shard_tokens tokens.
class ShardWriter {
 public:
  ShardWriter(fs::path out_dir, std::string name, std::string split, uint64_t shard_tokens,
              std::vector<std::string>& files)
      : out_dir_(std::move(out_dir)), name_(std::move(name)), split_(std::move(split)),
        shard_tokens_(shard_tokens), files_(files) {}

  void add(std::span<const uint16_t> tokens) {
    while (!tokens.empty()) {
      const size_t take = std::min<uint64_t>(tokens.size(), shard_tokens_ - buffer_.size());
      buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + take);
      tokens = tokens.subspan(take);
      if (buffer_.size() == shard_tokens_) flush();
    }
  }

  // Writes the last, partial shard, then deletes this split's shards left by an older, larger
  // run. Idempotent; nothing may be added afterwards.
  void finish() {
    if (finished_) return;
    if (!buffer_.empty()) flush();
    remove_stale();
    finished_ = true;
  }

  uint64_t tokens() const { return written_; }

 private:
  void flush() {
    const std::string path = (out_dir_ / shard_name(name_, split_, shards_)).string();
    write_shard(path, buffer_);
    files_.push_back(path);
    written_ += buffer_.size();
    ++shards_;
    buffer_.clear();
  }

  // Deletes <name>_<split>_NNNNNN.bin with NNNNNN >= the number of shards just written.
  void remove_stale() const {
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
      std::fprintf(stderr, "prepare: removing stale shard %s from an earlier run\n", p.c_str());
      std::error_code rm;
      if (!fs::remove(p, rm) && rm)
        throw RuntimeError("prepare: cannot remove stale shard " + p.string() + ": " + rm.message());
    }
    if (ec) throw RuntimeError("prepare: cannot list " + out_dir_.string() + ": " + ec.message());
  }

  fs::path out_dir_;
  std::string name_, split_;
  uint64_t shard_tokens_;
  std::vector<std::string>& files_;
  std::vector<uint16_t> buffer_;
  uint64_t shards_ = 0, written_ = 0;
  bool finished_ = false;
};

// A progress line on stderr at most once a second, so small inputs print nothing.
class Progress {
 public:
  explicit Progress(uint64_t total_bytes) : total_(total_bytes) {}

  void update(uint64_t done, bool last = false) {
    const auto now = Clock::now();
    if (!last && now - last_print_ < std::chrono::seconds(1)) return;
    if (last && !printed_) return;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double mb = static_cast<double>(done) / 1e6;
    std::fprintf(stderr, "prepare: read %.1f of %.1f MB (%.0f%%), %.1f MB/s\n", mb, static_cast<double>(total_) / 1e6,
                 total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0,
                 secs > 0 ? mb / secs : 0.0);
    last_print_ = now;
    printed_ = true;
  }

 private:
  using Clock = std::chrono::steady_clock;
  uint64_t total_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_print_ = start_;
  bool printed_ = false;
};

// The bytes tokenizer: one token per byte.
void byte_tokens(const char* bytes, size_t n, std::vector<uint16_t>& out) {
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(bytes[i]);
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opts) {
  validate(opts);
  const fs::path out_dir = opts.out_dir;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw RuntimeError("prepare: cannot create output directory " + opts.out_dir + ": " + ec.message());

  const std::vector<fs::path> docs = list_documents(opts.inputs, out_dir);
  // With the bytes tokenizer the token count is known before reading: bytes + separators.
  // That lets the val split be cut while streaming, in one pass and bounded memory.
  std::vector<uint64_t> doc_bytes;
  uint64_t text_bytes = 0;
  for (const auto& d : docs) {
    doc_bytes.push_back(fs::file_size(d, ec));
    if (ec) throw RuntimeError("prepare: cannot stat " + d.string() + ": " + ec.message());
    text_bytes += doc_bytes.back();
  }
  if (text_bytes == 0)
    throw ConfigError("prepare: the inputs hold no text (" + std::to_string(docs.size()) +
                      " non-hidden files found); nothing to tokenize");

  std::vector<uint16_t> separator;
  byte_tokens(kDocumentSeparator, std::strlen(kDocumentSeparator), separator);
  const uint64_t total = text_bytes + docs.size() * separator.size();
  uint64_t val_left = val_tokens_for(total, opts.val_fraction);

  PrepareResult result;
  ShardWriter val(out_dir, opts.name, "val", opts.shard_tokens, result.files);
  ShardWriter train(out_dir, opts.name, "train", opts.shard_tokens, result.files);
  auto emit = [&](std::span<const uint16_t> tokens) {
    const size_t to_val = std::min<uint64_t>(tokens.size(), val_left);
    val.add(tokens.first(to_val));
    val_left -= to_val;
    // Close val as soon as it is complete, so its last shard is listed before train's.
    if (val_left == 0) val.finish();
    train.add(tokens.subspan(to_val));
  };

  Progress progress(text_bytes);
  uint64_t bytes_done = 0;
  std::vector<char> chunk(1 << 20);
  std::vector<uint16_t> tokens;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::ifstream in(docs[i], std::ios::binary);
    if (!in) throw RuntimeError("prepare: cannot open " + docs[i].string() + ": " + std::strerror(errno));
    uint64_t read = 0;
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto n = static_cast<size_t>(in.gcount());
      if (n == 0) break;
      byte_tokens(chunk.data(), n, tokens);
      emit(tokens);
      read += n;
      progress.update(bytes_done + read);
    }
    if (in.bad()) throw RuntimeError("prepare: read error in " + docs[i].string());
    // The split point was computed from the sizes; a file that changed since would move it.
    if (read != doc_bytes[i])
      throw RuntimeError("prepare: " + docs[i].string() + " changed while being read (" + std::to_string(doc_bytes[i]) +
                         " bytes expected, " + std::to_string(read) + " read)");
    bytes_done += read;
    emit(separator);
  }
  progress.update(bytes_done, /*last=*/true);

  val.finish();
  train.finish();
  result.val_tokens = val.tokens();
  result.train_tokens = train.tokens();
  return result;
}

}  // namespace pt
