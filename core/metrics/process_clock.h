// Seconds since this process started (more exactly: since its static objects were made, before
// main() and MPI's start-up), so the log can say what start-up cost before the first step.
#pragma once
#include <chrono>

namespace pt {

double seconds_since_process_start();

// Seconds from `t` (steady clock) to now: the time of a piece of work.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace pt
