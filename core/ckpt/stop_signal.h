// Graceful stop on SIGTERM, SIGINT and SIGUSR1 (Slurm's pre-emption warning, with --signal):
// the handler only records the signal; the trainer polls stop_requested() between steps,
// finishes the step it is in, writes a checkpoint and exits 0. A second SIGINT while a stop
// is pending exits at once with status 130 (128 + SIGINT) from inside the handler: committed
// checkpoints are untouched (at worst a .tmp_ directory is left, which is never loaded).
#pragma once

namespace pt::ckpt {

// Installs the handlers (sigaction, SA_RESTART so checkpoint writes are not interrupted) for
// its lifetime and restores the previous ones after. Clears any earlier request.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

bool stop_requested();
int stop_signal();                    // the first signal received, 0 when none
const char* signal_name(int signal);  // "SIGTERM", ...

}  // namespace pt::ckpt
