// How far a result is from its reference, for the tests that compare two computations of the
// same thing (a GPU kernel and its CPU reference, a parallel layout and one rank).
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <vector>

namespace pt::test {

inline size_t count_nonfinite(const std::vector<float>& v) {
  size_t bad = 0;
  for (float x : v) bad += !std::isfinite(x);
  return bad;
}

// ||got - ref||_2 / ||ref||_2 in double; NaN anywhere makes it NaN, which fails every <= check.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace pt::test
