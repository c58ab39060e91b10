// Errors a user can act on. main() turns each into one "error: ..." line and an exit code:
// ConfigError -> 2 (bad config or usage), everything else -> 1 (runtime failure).
#pragma once
#include <stdexcept>
#include <string>

namespace pt {

// Bad input from the user: a config key, a CLI flag, an inconsistent combination.
// The message names the key, the value and the rule.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Something went wrong while running: I/O, a bad data file, out of memory.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws RuntimeError(msg) when cond is false. For internal invariants and I/O results,
// never for user input (use ConfigError with a message naming the key for that).
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw RuntimeError(msg);
}

}  // namespace pt
