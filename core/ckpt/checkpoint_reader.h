// Reads a checkpoint directory: the manifest, then any element range of any tensor, assembled
// from whichever chunks cover it (so a layout other than the writer's can read its own slices).
// Every chunk read is verified against its checksum; file sizes are checked when opened.
// All failures are CorruptCheckpoint naming the file.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/ckpt/manifest.h"

namespace pt::ckpt {

class CheckpointReader {
 public:
  // `dir` is one checkpoint (step_N/). Parses manifest.json and checks every data file's size.
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return manifest_.find(name) != nullptr; }

  // Fills out[0, end - begin) with elements [begin, end) of the f32 tensor `name`.
  void read(const std::string& name, uint64_t begin, uint64_t end, float* out);
  // The whole tensor, which must have `numel` elements.
  void read_all(const std::string& name, uint64_t numel, float* out);

 private:
  const TensorEntry& tensor(const std::string& name) const;
  // Reads chunk c into dst (c.bytes bytes) and verifies its checksum.
  void read_chunk(const TensorEntry& t, const Chunk& c, void* dst);
  int fd(const std::string& file);

  std::string dir_;
  Manifest manifest_;
  std::map<std::string, int> fds_;
};

// A checkpoint to read: `path` itself when it holds manifest.json, else the checkpoint that
// path/latest names. Throws ConfigError when it is neither (naming `what`, e.g. the key).
std::string resolve_checkpoint_path(const std::string& path, const std::string& what);

}  // namespace pt::ckpt
