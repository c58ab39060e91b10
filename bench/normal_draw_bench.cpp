// Times the initial weights' normal draw (core/common/counter_rng.h) over GPT-2 124M's element
// count, against the Box-Muller draw it replaced (2026-11-28), both as init_params calls them
// (one counter stream, OpenMP over the elements) into memory already touched, so that page
// faults, which any first touch of the weights pays, stay out of the figure. Prints CPU-seconds
// (fair on a loaded machine) and wall time. Results: bench/RESULTS.md, "The initial weights' draw".
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "core/common/counter_rng.h"

namespace {

double box_muller(const pt::CounterStream& rng, uint64_t i) {
  return std::sqrt(-2.0 * std::log(rng.uniform(2 * i))) * std::cos(6.283185307179586 * rng.uniform(2 * i + 1));
}

double quantile(const pt::CounterStream& rng, uint64_t i) { return rng.normal(i); }

template <class Draw>
void time_draw(const char* name, Draw draw, std::vector<float>& out) {
  const pt::CounterStream rng(1337, pt::hash_name("transformer.h.0.mlp.c_fc.weight"));
  const auto wall0 = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < out.size(); i++) out[i] = static_cast<float>(0.02 * draw(rng, i));
  const double cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  std::printf("%-11s %zu values: %.2f CPU-s (%.1f ns a value), %.2f s wall\n", name, out.size(), cpu,
              cpu / static_cast<double>(out.size()) * 1e9, wall);
}

}  // namespace

int main() {
  std::vector<float> out(124475904);  // GPT-2 124M's parameters (padded vocabulary), touched here
  time_draw("box-muller", box_muller, out);
  time_draw("quantile", quantile, out);
  time_draw("box-muller", box_muller, out);
  time_draw("quantile", quantile, out);
}
