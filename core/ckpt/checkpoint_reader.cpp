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

  // The request as covered by the chunks' runs: every run that overlaps [begin, end), clipped
  // to it. (Chunks of several tensor-parallel ranks interleave, so coverage is a matter of runs,
  // not of chunk extents.)
  struct Segment {
    uint64_t begin, end;  // global elements, inside the request
    size_t chunk;         // index into t.chunks
    uint64_t at;          // where `begin` lies in the chunk's data, in elements
  };
  std::vector<Segment> segs;
  for (size_t k = 0; k < t.chunks.size(); k++) {
    const Chunk& c = t.chunks[k];
    if (c.begin >= end || c.end <= begin) continue;
    const uint64_t run = c.run_length(), stride = c.run_stride();
    // The runs j whose [c.begin + j*stride, + run) overlaps the request.
    const uint64_t first = begin < c.begin + run ? 0 : (begin - c.begin - run) / stride + 1;
    const uint64_t last = std::min(c.runs() - 1, (end - 1 - c.begin) / stride);
    for (uint64_t j = first; j <= last; j++) {
      const uint64_t lo = c.begin + j * stride, hi = lo + run;
      if (hi <= begin || lo >= end) continue;  // the request falls between two runs
      segs.push_back({std::max(lo, begin), std::min(hi, end), k, j * run + (std::max(lo, begin) - lo)});
    }
  }
  // By start, manifest order breaking ties. Where chunks overlap (a replicated tensor written
  // by several ranks) each element is taken once, from the first segment that has it.
  std::stable_sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.begin < b.begin; });

  // A chunk is read (and verified) once, when a segment first needs it: a contiguous chunk
  // wholly inside the request straight into `out`, any other into a buffer kept for its later
  // runs.
  std::vector<std::vector<float>> buffers(t.chunks.size());
  std::vector<char> in_place(t.chunks.size(), 0);
  uint64_t covered = begin;  // elements [begin, covered) are filled
  for (const Segment& s : segs) {
    if (covered >= end) break;
    if (s.end <= covered) continue;
    if (s.begin > covered) break;  // a gap: reported below
    const Chunk& c = t.chunks[s.chunk];
    std::vector<float>& buf = buffers[s.chunk];
    if (!in_place[s.chunk] && buf.empty()) {
      if (!c.strided() && c.begin >= begin && c.end <= end) {
        read_chunk(t, c, out + (c.begin - begin));
        in_place[s.chunk] = 1;
      } else {
        buf.resize(c.numel());
        read_chunk(t, c, buf.data());
      }
    }
    if (!in_place[s.chunk])
      std::memcpy(out + (covered - begin), buf.data() + s.at + (covered - s.begin), (s.end - covered) * sizeof(float));
    covered = s.end;
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
