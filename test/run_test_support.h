// Running the picotrain binary from a test: a command's exit code and output, and a `picotrain
// train` child whose stdout the test reads as it comes and which it can signal (stop signals,
// crashes). Shared by the tests of signals, the run report and the planner.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace pt::test {

struct Launch {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// `command` through the shell, under `timeout` so a hang is exit code 124, not a stuck test.
inline Launch run_command(const std::string& command, int timeout_s = 120) {
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + command + " 2>&1";
  Launch l;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) l.output.append(buf, n);
  const int status = pclose(p);
  l.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return l;
}

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;  // its stdout
};

// Starts `picotrain train --config cfg --set ...` with stdout on a pipe (stderr to `err_path`).
inline Child start_train(const std::string& cfg, const std::vector<std::string>& sets, const std::string& err_path) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::vector<std::string> args = {PICOTRAIN_BIN, "train", "--config", cfg};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // One thread: runs that must agree bit for bit do (they would with any fixed count), and a
    // single thread is not slowed down by a busy machine the way spinning OpenMP teams are.
    setenv("OMP_NUM_THREADS", "1", 1);
    dup2(fds[1], STDOUT_FILENO);
    FILE* err = std::fopen(err_path.c_str(), "w");
    if (err) dup2(fileno(err), STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(PICOTRAIN_BIN, argv.data());
    _exit(127);
  }
  close(fds[1]);
  return {pid, fdopen(fds[0], "r")};
}

// A run's stdout (`out`: a Child's, or a popen'd launcher's) up to and including its
// `steps`-th step line (fewer if it ends first).
inline std::string read_until_step_lines(FILE* out, int steps, int* seen) {
  std::string log;
  *seen = 0;
  char line[1024];
  while (*seen < steps && std::fgets(line, sizeof line, out)) {
    log += line;
    if (std::string(line).rfind("step ", 0) == 0) ++*seen;
  }
  return log;
}

inline int wait_exit_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::string drain(FILE* f) {
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  std::fclose(f);
  return text;
}

}  // namespace pt::test
