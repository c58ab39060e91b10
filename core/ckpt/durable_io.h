// POSIX file operations for the checkpoint commit protocol: every failure throws RuntimeError
// naming the path and the errno text ("... /ckpt/.tmp_step_00000100_42/master_r00000.bin: No
// space left on device"), and every "make it durable" step is explicit (fsync of files and of
// the directories whose entries changed), which <filesystem> and iostreams do not offer.
//
// A fault-injection hook lets tests make any step fail with an errno (disk full, EIO) or
// throw (a process killed mid-write) without needing a full disk or root-proof permissions.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace pt::ckpt {

// Called before each durable step with the step's name ("mkdir", "write", "fsync", "rename",
// "latest") and its path. Return 0 to proceed, or an errno value to make the step fail with
// it; the hook may also throw. Tests only; nullptr (the default) disables it.
using FaultHook = std::function<int(std::string_view step, const std::string& path)>;
void set_fault_hook(FaultHook hook);

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err);

// A file opened for writing from scratch (O_CREAT | O_TRUNC), written sequentially.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();  // closes without syncing (an abandoned write)
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);  // all of it, retrying short writes and EINTR
  void sync_and_close();                       // fsync, then close; both checked
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
};

void make_dir(const std::string& path);      // one level; fails if it exists
void fsync_dir(const std::string& path);     // makes the directory's entries durable
void rename_path(const std::string& from, const std::string& to);
// Writes `text` to path + ".tmp", fsyncs it, renames it over `path` and fsyncs the directory:
// a reader sees the old or the new content, never a mix.
void write_file_atomic(const std::string& path, const std::string& text);

// Reads exactly `bytes` at `offset`; throws naming the path on a short read or an error.
void read_at(const std::string& path, int fd, uint64_t offset, void* out, size_t bytes);

// A file opened read-only (model files being imported), closed when it goes out of scope.
class FileReader {
 public:
  explicit FileReader(std::string path);  // throws naming the path when it cannot be opened
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const;
  void read(uint64_t offset, void* out, size_t bytes) const { read_at(path_, fd_, offset, out, bytes); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};
std::string read_small_file(const std::string& path);  // whole file (a pointer, a manifest)

// Removes a tree, never throwing: returns "" on success, else what went wrong.
std::string remove_tree(const std::string& path);

}  // namespace pt::ckpt
