// Lines leave the process whole (core/common/console.h): two threads print at the same moment, a
// warning on stderr and a log line on stdout, both streams on one pipe as under `2>&1` or a
// launcher that forwards them; every line read back is one of the lines printed, none torn apart
// or glued to another, and none lost.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <thread>

#include "core/common/console.h"

namespace {

constexpr int kLinesPerThread = 2000;

// A line long enough that a write in pieces would show (a few hundred bytes, under PIPE_BUF).
std::string log_line(int i) { return "step " + std::to_string(i) + " | loss " + std::string(200, 'x'); }
std::string warning_text(int i) { return "pipeline bubble " + std::to_string(i) + " " + std::string(200, 'w'); }

// Runs both printers in a child whose stdout and stderr are the write end of one pipe and
// returns everything it printed.
std::string print_from_two_threads() {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::thread warnings([] {
      for (int i = 0; i < kLinesPerThread; i++) pt::print_warning(warning_text(i));
    });
    for (int i = 0; i < kLinesPerThread; i++) pt::print_line(pt::Stream::out, log_line(i));
    warnings.join();
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;)
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return out;
}

}  // namespace

TEST_CASE("a warning and a log line printed at the same moment by two threads stay whole", "[console]") {
  std::map<std::string, int> expected;
  for (int i = 0; i < kLinesPerThread; i++) {
    expected[log_line(i)] = 0;
    expected["warning: " + warning_text(i)] = 0;
  }
  const std::string out = print_from_two_threads();
  REQUIRE(!out.empty());
  REQUIRE(out.back() == '\n');
  int lines = 0, foreign = 0;
  bool interleaved = false, last_was_warning = false;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end - at);
    at = end + 1;
    lines++;
    const auto it = expected.find(line);
    if (it == expected.end()) {
      if (foreign++ < 3) FAIL_CHECK("a torn or glued line: " << line.substr(0, 120));
      continue;
    }
    it->second++;
    const bool warning = line.starts_with("warning: ");
    if (lines > 1 && warning != last_was_warning) interleaved = true;
    last_was_warning = warning;
  }
  CHECK(foreign == 0);
  CHECK(lines == 2 * kLinesPerThread);
  for (const auto& [line, seen] : expected) {
    if (seen != 1) FAIL_CHECK(seen << " copies of " << line.substr(0, 60));
  }
  // Not asserted (it depends on the scheduler), but said: whether the threads really overlapped.
  INFO("the two threads' lines interleaved: " << (interleaved ? "yes" : "no"));
  SUCCEED();
}

TEST_CASE("print_line adds the newline once and print_text writes the text as it is", "[console]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    pt::print_line(pt::Stream::out, "a");
    pt::print_line(pt::Stream::out, "b\n");
    pt::print_linef(pt::Stream::out, "c %d", 3);
    pt::print_text(pt::Stream::out, "\rd");
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  CHECK(out == "a\nb\nc 3\n\rd");
}
