#include "core/common/console.h"

#include <unistd.h>

#include <cerrno>

namespace pt {

void print_line(Stream to, std::string line) {
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  print_text(to, line);
}

void print_text(Stream to, const std::string& line) {
  const int fd = to == Stream::out ? STDOUT_FILENO : STDERR_FILENO;
  // One write almost always takes the whole line; a signal or a nearly full pipe can cut a long
  // one short, and then the rest follows (nothing is lost).
  const char* at = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stream: nothing useful can be done about it
    at += n;
    left -= static_cast<size_t>(n);
  }
}

void print_warning(const std::string& msg) { print_line(Stream::err, "warning: " + msg); }

void print_error(const std::string& msg) { print_line(Stream::err, "error: " + msg); }

}  // namespace pt
