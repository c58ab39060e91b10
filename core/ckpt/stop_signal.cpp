#include "core/ckpt/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace pt::ckpt {
namespace {

volatile std::sig_atomic_t g_signal = 0;
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
struct sigaction g_previous[3];

void write_stderr(const char* s) {
  // write(2) is async-signal-safe; stdio is not. A failed write has no one to report to.
  ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

void on_signal(int sig) {
  if (g_signal != 0) {
    if (sig == SIGINT) {
      write_stderr("\npicotrain: second SIGINT, exiting now without a checkpoint\n");
      ::_exit(128 + SIGINT);
    }
    return;  // e.g. SIGTERM repeated by a launcher: the stop is already under way
  }
  g_signal = sig;
  write_stderr(sig == SIGINT ? "\npicotrain: SIGINT: finishing this step, then writing a checkpoint "
                               "(press Ctrl-C again to exit at once)\n"
                             : sig == SIGTERM ? "\npicotrain: SIGTERM: finishing this step, then writing a checkpoint\n"
                                              : "\npicotrain: SIGUSR1: finishing this step, then writing a checkpoint\n");
}

}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; i++) sigaction(kSignals[i], &sa, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; i++) sigaction(kSignals[i], &g_previous[i], nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace pt::ckpt
