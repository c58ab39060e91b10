#include "core/metrics/peak_probe.h"

#include <algorithm>
#include <chrono>

namespace pt {

PeakProbe measure_matmul_peak(Ops& ops) {
  const int n = 512;
  Tensor a = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  Tensor w = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  Tensor out = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  ops.matmul_forward(out, a, w, Tensor{}, n, n, n);  // warm-up: page in, spin up threads
  ops.synchronize();
  // The fastest of the calls in a quarter of a second: a peak, so a moment when another process
  // held the cores (a build, another rank) does not lower it and push MFU past 100%.
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double fastest = 0, elapsed = 0;
  do {
    const auto t0 = clock::now();
    ops.matmul_forward(out, a, w, Tensor{}, n, n, n);
    ops.synchronize();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    fastest = fastest > 0 ? std::min(fastest, dt) : dt;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < 0.25);
  ops.release(a);
  ops.release(w);
  ops.release(out);
  return {2.0 * n * n * n / fastest / 1e12, n};
}

}  // namespace pt
