#include "core/metrics/process_clock.h"

#include <chrono>

namespace pt {

namespace {
// Made during static initialisation, before main() runs.
const std::chrono::steady_clock::time_point kProcessStart = std::chrono::steady_clock::now();
}  // namespace

double seconds_since_process_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kProcessStart).count();
}

}  // namespace pt
