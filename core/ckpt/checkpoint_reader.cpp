#include "core/ckpt/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checksum.h"
#include "core/ckpt/durable_io.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string mpath = (fs::path(dir_) / kManifestFile).string();
  std::string text;
  try {
    text = read_small_file(mpath);
  } catch (const RuntimeError& e) {
    throw CorruptCheckpoint(e.what());
  }
  manifest_ = manifest_from_json(text, mpath);
  for (const auto& f : manifest_.files) {
    const std::string path = (fs::path(dir_) / f.name).string();
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0)
      throw CorruptCheckpoint("checkpoint file " + path + " is missing: " + std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) != f.bytes)
      throw CorruptCheckpoint("checkpoint file " + path + " is " + std::to_string(st.st_size) +
                              " bytes, the manifest says " + std::to_string(f.bytes) +
                              (static_cast<uint64_t>(st.st_size) < f.bytes ? " (truncated)" : ""));
  }
}

CheckpointReader::~CheckpointReader() {
  for (auto& [name, fd] : fds_) ::close(fd);
}

int CheckpointReader::fd(const std::string& file) {
  auto it = fds_.find(file);
  if (it != fds_.end()) return it->second;
  const std::string path = (fs::path(dir_) / file).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CorruptCheckpoint("cannot open checkpoint file " + path + ": " + std::strerror(errno));
  fds_[file] = fd;
  return fd;
}

const TensorEntry& CheckpointReader::tensor(const std::string& name) const {
  const TensorEntry* t = manifest_.find(name);
  if (!t) throw CorruptCheckpoint(dir_ + "/" + kManifestFile + " has no tensor " + name);
  if (t->dtype != "f32")
    throw CorruptCheckpoint(dir_ + "/" + kManifestFile + ": tensor " + name + " is " + t->dtype +
                            "; this reader reads f32 tensors");
  return *t;
}

void CheckpointReader::read_chunk(const TensorEntry& t, const Chunk& c, void* dst) {
  const std::string path = (fs::path(dir_) / c.file).string();
  try {
    read_at(path, fd(c.file), c.offset, dst, c.bytes);
  } catch (const CorruptCheckpoint&) {
    throw;
  } catch (const RuntimeError& e) {
    throw CorruptCheckpoint(e.what());
  }
  const uint64_t got = checksum64(dst, c.bytes);
  if (got != c.checksum)
    throw CorruptCheckpoint("checksum mismatch in checkpoint file " + path + " (tensor " + t.name + ", bytes " +
                            std::to_string(c.offset) + ".." + std::to_string(c.offset + c.bytes) + "): " +
                            checksum_hex(got) + ", the manifest says " + checksum_hex(c.checksum));
}

void CheckpointReader::read(const std::string& name, uint64_t begin, uint64_t end, float* out) {
  const TensorEntry& t = tensor(name);
  check(begin <= end && end <= t.numel(), "checkpoint read of " + name + " out of range");
  // The chunks overlapping the request, by start. Where chunks overlap (a replicated tensor
  // written by several ranks) each element is read once, from the first chunk that has it.
  std::vector<const Chunk*> hits;
  for (const auto& c : t.chunks)
    if (c.begin < end && c.end > begin) hits.push_back(&c);
  std::sort(hits.begin(), hits.end(), [](const Chunk* a, const Chunk* b) { return a->begin < b->begin; });

  uint64_t covered = begin;  // elements [begin, covered) are filled
  std::vector<float> buf;
  for (const Chunk* c : hits) {
    if (covered >= end) break;
    if (c->end <= covered) continue;
    if (c->begin > covered) break;  // a gap: reported below
    if (c->begin >= begin && c->end <= end) {
      read_chunk(t, *c, out + (c->begin - begin));  // wholly inside the request: no copy
    } else {
      buf.resize(c->end - c->begin);
      read_chunk(t, *c, buf.data());
      const uint64_t lo = std::max(covered, c->begin), hi = std::min(end, c->end);
      std::memcpy(out + (lo - begin), buf.data() + (lo - c->begin), (hi - lo) * sizeof(float));
    }
    covered = std::min(end, c->end);
  }
  if (covered < end)
    throw CorruptCheckpoint(dir_ + "/" + kManifestFile + ": elements " + std::to_string(covered) +
                            " onwards of tensor " + name + " are in no chunk");
}

void CheckpointReader::read_all(const std::string& name, uint64_t numel, float* out) {
  const TensorEntry& t = tensor(name);
  if (t.numel() != numel)
    throw CorruptCheckpoint(dir_ + "/" + kManifestFile + ": tensor " + name + " has " + std::to_string(t.numel()) +
                            " elements, the model needs " + std::to_string(numel));
  read(name, 0, numel, out);
}

std::string resolve_checkpoint_path(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / kManifestFile, ec)) return path;
  if (fs::exists(fs::path(path) / "latest", ec)) {
    const DirScan s = scan_checkpoint_dir(path);
    if (!s.latest)
      throw CorruptCheckpoint(what + ": " + (s.latest_problem.empty() ? path + "/latest is unreadable" : s.latest_problem));
    return (fs::path(path) / step_dir_name(*s.latest)).string();
  }
  throw ConfigError(what + ": " + path + " is neither a checkpoint (no " + kManifestFile +
                    ") nor a checkpoint directory (no latest)");
}

}  // namespace pt::ckpt
