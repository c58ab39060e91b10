#include "core/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/common/error.h"

namespace pt {

// Shards are little-endian on disk; we read and write them by reinterpreting memory.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes a file descriptor on every path out of a function.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeError(path + ": write failed: " + errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Both versions: the header, then the tokens' bytes as they are in memory (little-endian).
void write_shard_bytes(const std::string& path, int32_t version, const void* data, uint64_t count, size_t width) {
  if (count > kMaxShardTokens)
    throw RuntimeError(path + ": " + std::to_string(count) + " tokens do not fit one shard (at most " +
                       std::to_string(kMaxShardTokens) + ")");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);

  const std::string tmp = path + ".tmp";
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) throw RuntimeError(tmp + ": cannot create: " + errno_text());
    write_all(f.fd, header, sizeof(header), tmp);
    write_all(f.fd, data, count * width, tmp);
    // fsync before the rename: otherwise a crash could leave the new name pointing at missing data.
    if (::fsync(f.fd) != 0) throw RuntimeError(tmp + ": fsync failed: " + errno_text());
    const int fd = std::exchange(f.fd, -1);
    if (::close(fd) != 0) throw RuntimeError(tmp + ": close failed: " + errno_text());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw RuntimeError(tmp + ": cannot rename to " + path + ": " + errno_text());
}

// The bytes one token takes in a shard of `version` (0: a version this build does not read).
size_t token_width(int32_t version) {
  return version == kShardVersion ? sizeof(uint16_t) : version == kShardVersion32 ? sizeof(uint32_t) : 0;
}

}  // namespace

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  write_shard_bytes(path, kShardVersion, tokens.data(), tokens.size(), sizeof(uint16_t));
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens) {
  write_shard_bytes(path, kShardVersion32, tokens.data(), tokens.size(), sizeof(uint32_t));
}

TokenShard::TokenShard(const std::string& path, int vocab_size) : path_(path), vocab_size_(vocab_size) {
  check(vocab_size > 0, path + ": vocab_size must be positive, got " + std::to_string(vocab_size));
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw RuntimeError(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw RuntimeError(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw RuntimeError(path + ": not a regular file (is the data glob too wide?)");

  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes)
    throw RuntimeError(path + ": truncated: the file has " + std::to_string(file_bytes) + " bytes, less than the " +
                       std::to_string(kShardHeaderBytes) + "-byte header of an llm.c token shard");

  map_bytes_ = static_cast<size_t>(file_bytes);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw RuntimeError(path + ": mmap failed: " + errno_text());
  }
  // The mapping stays valid after the descriptor closes (Fd's destructor).

  try {
    const auto* header = static_cast<const int32_t*>(map_);
    if (header[0] != kShardMagic)
      throw RuntimeError(path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                         std::to_string(kShardMagic) + "; is this an llm.c token shard?)");
    const size_t width = token_width(header[1]);
    if (width == 0)
      throw RuntimeError(path + ": unsupported shard version " + std::to_string(header[1]) + " (expected " +
                         std::to_string(kShardVersion) + ", uint16 tokens, or " + std::to_string(kShardVersion32) +
                         ", uint32 tokens)");
    if (header[2] < 0)
      throw RuntimeError(path + ": corrupt header: negative token count " + std::to_string(header[2]));

    const auto count = static_cast<uint64_t>(header[2]);
    const uint64_t expected = kShardHeaderBytes + count * width;
    const std::string says = "header says " + std::to_string(count) + " tokens (" + std::to_string(expected) +
                             " bytes) but the file has " + std::to_string(file_bytes) + " bytes";
    if (file_bytes < expected) throw RuntimeError(path + ": truncated: " + says);
    if (file_bytes > expected) throw RuntimeError(path + ": too long: " + says + " (trailing data?)");

    version_ = header[1];
    size_ = count;
    data_ = static_cast<const char*>(map_) + kShardHeaderBytes;
  } catch (...) {
    unmap();
    throw;
  }
}

TokenShard::~TokenShard() { unmap(); }

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      vocab_size_(other.vocab_size_),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      version_(std::exchange(other.version_, 0)),
      size_(std::exchange(other.size_, 0)),
      data_(std::exchange(other.data_, nullptr)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    vocab_size_ = other.vocab_size_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    version_ = std::exchange(other.version_, 0);
    size_ = std::exchange(other.size_, 0);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

void TokenShard::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  version_ = 0;
  size_ = 0;
  data_ = nullptr;
}

std::span<const uint16_t> TokenShard::tokens() const {
  check(version_ == kShardVersion, path_ + ": a version-" + std::to_string(version_) + " shard holds uint32 tokens");
  return {static_cast<const uint16_t*>(data_), size_};
}

std::span<const uint32_t> TokenShard::tokens32() const {
  check(version_ == kShardVersion32, path_ + ": a version-" + std::to_string(version_) + " shard holds uint16 tokens");
  return {static_cast<const uint32_t*>(data_), size_};
}

namespace {
// Copies n tokens of `src` (the shard's width) into out, each checked against vocab.
template <class T>
void copy_checked(const T* src, uint64_t offset, uint64_t n, uint32_t vocab, int32_t* out, const std::string& path) {
  for (uint64_t i = 0; i < n; ++i) {
    if (src[i] >= vocab)
      throw RuntimeError(path + ": token " + std::to_string(src[i]) + " at index " + std::to_string(offset + i) +
                         " is >= model.vocab_size=" + std::to_string(vocab) +
                         " (was the shard made with a different tokenizer?)");
    out[i] = static_cast<int32_t>(src[i]);
  }
}
}  // namespace

void TokenShard::read(uint64_t offset, uint64_t n, int32_t* out) const {
  check(offset <= size() && n <= size() - offset,
        path_ + ": read of " + std::to_string(n) + " tokens at " + std::to_string(offset) + " is past the end (" +
            std::to_string(size()) + " tokens)");
  const auto vocab = static_cast<uint32_t>(vocab_size_);
  if (version_ == kShardVersion32) copy_checked(tokens32().data() + offset, offset, n, vocab, out, path_);
  else copy_checked(tokens().data() + offset, offset, n, vocab, out, path_);
}

}  // namespace pt
