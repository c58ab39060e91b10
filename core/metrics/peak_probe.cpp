#include "core/metrics/peak_probe.h"

#include <chrono>

namespace pt {

PeakProbe measure_matmul_peak(Ops& ops) {
  const int n = 512;
  Tensor a = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  Tensor w = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  Tensor out = ops.alloc(static_cast<size_t>(n) * n, DType::f32);
  ops.matmul_forward(out, a, w, Tensor{}, n, n, n);  // warm-up: page in, spin up threads
  ops.synchronize();
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int reps = 0;
  double elapsed = 0;
  do {
    ops.matmul_forward(out, a, w, Tensor{}, n, n, n);
    ops.synchronize();
    reps++;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < 0.25);
  ops.release(a);
  ops.release(w);
  ops.release(out);
  return {2.0 * n * n * n * reps / elapsed / 1e12, n};
}

}  // namespace pt
