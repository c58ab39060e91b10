// The counter-based random numbers (core/common/counter_rng.h) that initialise every weight: each
// value a pure function of (seed, stream, index), so every layout and rank count draws the same
// weights, and counter_normal a standard normal: its moments, its tails, and a Kolmogorov-Smirnov
// test against the normal CDF; and the quantile it is drawn through, against the normal CDF.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/common/counter_rng.h"

using namespace pt;

TEST_CASE("counter_normal is a pure function of (seed, stream, index)", "[rng]") {
  const uint64_t stream = hash_name("h.0.attn.qkv.weight");
  std::vector<double> forward, backward(1000);
  for (uint64_t i = 0; i < 1000; ++i) forward.push_back(counter_normal(7, stream, i));
  for (uint64_t i = 1000; i-- > 0;) backward[i] = counter_normal(7, stream, i);
  CHECK(forward == backward);  // in any order: the same bits
  // Another seed, stream or index gives another value.
  CHECK(counter_normal(8, hash_name("h.0.attn.qkv.weight"), 3) != forward[3]);
  CHECK(counter_normal(7, hash_name("h.1.attn.qkv.weight"), 3) != forward[3]);
  CHECK(forward[3] != forward[4]);
}

TEST_CASE("counter_normal draws a standard normal", "[rng]") {
  const size_t n = 1000000;
  const uint64_t stream = hash_name("wte.weight");
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = counter_normal(42, stream, i);
  double m1 = 0, m2 = 0, m3 = 0, m4 = 0;
  size_t beyond_3 = 0, beyond_4 = 0;
  for (double v : z) {
    m1 += v, m2 += v * v, m3 += v * v * v, m4 += v * v * v * v;
    beyond_3 += std::fabs(v) > 3.0;
    beyond_4 += std::fabs(v) > 4.0;
  }
  m1 /= n, m2 /= n, m3 /= n, m4 /= n;
  // Bounds at about 4 standard errors of each statistic for n = 1e6.
  CHECK(std::fabs(m1) < 0.004);
  CHECK(std::fabs(m2 - 1.0) < 0.006);
  CHECK(std::fabs(m3) < 0.01);
  CHECK(std::fabs(m4 / (m2 * m2) - 3.0) < 0.03);
  // P(|z| > 3) = 0.0026998, P(|z| > 4) = 6.334e-5: the tails, counted.
  CHECK(std::fabs(double(beyond_3) - 2699.8) < 4 * std::sqrt(2699.8));
  CHECK(std::fabs(double(beyond_4) - 63.34) < 4 * std::sqrt(63.34));
  // Kolmogorov-Smirnov: D below the 1% critical value 1.63 / sqrt(n).
  std::sort(z.begin(), z.end());
  double d = 0;
  for (size_t i = 0; i < n; ++i) {
    const double F = 0.5 * std::erfc(-z[i] / std::sqrt(2.0));
    d = std::max({d, std::fabs(F - double(i) / n), std::fabs(F - double(i + 1) / n)});
  }
  INFO("KS D = " << d);
  CHECK(d < 1.63 / std::sqrt(double(n)));
}

TEST_CASE("normal_quantile inverts the normal CDF to within 1.2e-9 relative", "[rng]") {
  // One Newton step on Phi(x) = p from the approximation gives x to about 1e-15: the reference.
  auto check_at = [](double p) {
    const double x = normal_quantile(p);
    const double phi = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    const double cdf = x < 0 ? 0.5 * std::erfc(-x / std::sqrt(2.0)) : 1.0 - 0.5 * std::erfc(x / std::sqrt(2.0));
    const double tail = x < 0 ? cdf - p : (1.0 - p) - (1.0 - cdf);  // the error in the smaller tail
    const double exact = x - tail / phi;
    INFO("p = " << p << ", x = " << x << ", refined " << exact);
    CHECK(std::fabs(x - exact) <= 1.2e-9 * std::fabs(exact) + 1e-15);
  };
  for (int i = 1; i < 10000; ++i) check_at(i / 10000.0);
  for (double p = 1e-300; p < 0.03; p *= 1.7) check_at(p);  // the lower tail, down to far below any draw
  for (double p = 1e-16; p < 0.03; p *= 1.7) check_at(1.0 - p);  // the upper, to the smallest 1 - u a draw has
  for (double p : {0.02425, 0.02425 + 1e-12, 0.97575, 0.97575 - 1e-12}) check_at(p);
  CHECK(normal_quantile(0.5) == 0.0);
  CHECK(normal_quantile(0.25) == -normal_quantile(0.75));  // the centre's form is odd in p - 1/2
  CHECK(normal_quantile(0.01) == -normal_quantile(0.99));  // and the tails mirror each other
}
