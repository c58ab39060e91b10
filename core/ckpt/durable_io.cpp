#include "core/ckpt/durable_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/common/error.h"

namespace pt::ckpt {
namespace {

FaultHook& hook() {
  static FaultHook h;
  return h;
}

// Runs the hook for one step; a nonzero result becomes that step's errno.
void maybe_fail(std::string_view step, const std::string& path, const std::string& what) {
  if (!hook()) return;
  if (int err = hook()(step, path)) throw_errno(what, path, err);
}

}  // namespace

void set_fault_hook(FaultHook h) { hook() = std::move(h); }

void throw_errno(const std::string& what, const std::string& path, int err) {
  throw RuntimeError(what + " " + path + ": " + std::strerror(err));
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
  maybe_fail("open", path, "cannot create");
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", path, errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  maybe_fail("write", path_, "cannot write");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; a larger chunk simply takes several.
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path_, errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset_ += static_cast<uint64_t>(n);
  }
}

void FileWriter::sync_and_close() {
  maybe_fail("fsync", path_, "cannot fsync");
  if (::fsync(fd_) != 0) throw_errno("cannot fsync", path_, errno);
  const int fd = std::exchange(fd_, -1);
  // close() can report a deferred write error (NFS): it counts as a failed write.
  if (::close(fd) != 0) throw_errno("cannot close", path_, errno);
}

void make_dir(const std::string& path) {
  maybe_fail("mkdir", path, "cannot create directory");
  if (::mkdir(path.c_str(), 0755) != 0) throw_errno("cannot create directory", path, errno);
}

void fsync_dir(const std::string& path) {
  maybe_fail("fsync", path, "cannot fsync directory");
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are then as durable
  // as they get, which is not a reason to fail the checkpoint.
  if (rc != 0 && err != EINVAL) throw_errno("cannot fsync directory", path, err);
}

void rename_path(const std::string& from, const std::string& to) {
  maybe_fail("rename", to, "cannot rename " + from + " to");
  if (::rename(from.c_str(), to.c_str()) != 0) throw_errno("cannot rename " + from + " to", to, errno);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    FileWriter f(tmp);
    f.write(text.data(), text.size());
    f.sync_and_close();
  }
  rename_path(tmp, path);
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

void read_at(const std::string& path, int fd, uint64_t offset, void* out, size_t bytes) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read", path, errno);
    }
    if (n == 0) throw RuntimeError("cannot read " + path + ": unexpected end of file at byte " + std::to_string(offset));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

FileReader::FileReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_errno("cannot open", path_, errno);
}

FileReader::~FileReader() { ::close(fd_); }

uint64_t FileReader::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno("cannot stat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path, errno);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw_errno("cannot read", path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  return ec ? ec.message() : std::string();
}

}  // namespace pt::ckpt
