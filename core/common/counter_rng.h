// Counter-based random numbers: the value at (seed, stream, index) is a pure function of
// those three numbers. Parameter initialisation keys each element by (run seed, parameter
// name, global element index), so the same weights come out whatever the layout splits or
// whichever rank computes them: the basis of layout-parity tests and exact resharding.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace pt {

// splitmix64 finaliser: a bijective 64-bit mix with good avalanche (Steele et al. 2014).
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a of a name, so a parameter's stream depends on its name, not on its position in a table.
inline uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Uniform in (0, 1), 53 bits, never exactly 0 (safe for log).
inline double counter_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t x = mix64(mix64(seed ^ mix64(stream)) ^ index);
  return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller from two counter uniforms of the same element.
inline double counter_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  double u1 = counter_uniform(seed, stream, 2 * index);
  double u2 = counter_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace pt
