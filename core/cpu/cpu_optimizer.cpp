// AdamW (decoupled weight decay, bias-corrected with step t) and the two host reductions the
// trainer needs: sum of squares (gradient norm) and sum (losses).
//  g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//  master -= lr * (mhat / (sqrt(vhat) + eps) + wd * master), mhat = m/(1-b1^t), vhat = v/(1-b2^t).
// Cost: adamw ~15 FLOPs and 20 bytes per element (read grad, read-modify-write master, m, v),
// plus 8 more when params is a separate buffer; the reductions 1-2 FLOPs and 4 bytes per element.
// The reductions are summed in double over fixed chunks, one slot per chunk, and the slots are
// then added in order: the result is bitwise the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

constexpr size_t kReduceChunk = size_t(1) << 14;  // elements per partial sum
constexpr size_t kParallelMin = size_t(1) << 15;  // below this, threads cost more than they save

// sum over i < n of f(x[i]) in double, deterministic (see the header comment).
template <class F>
double chunked_sum(const float* x, size_t n, F f) {
  size_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t c = 0; c < chunks; c++) {
    size_t end = std::min(n, (c + 1) * kReduceChunk);
    double s = 0.0;
    for (size_t i = c * kReduceChunk; i < end; i++) s += f(double(x[i]));
    partial[c] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

void CpuOps::adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale, Tensor step) {
  check(step || t >= 1, "CpuOps::adamw_update: step t=" + std::to_string(t) + " must be >= 1 (bias correction)");
  AdamwStepScalars s{};
  if (step) std::memcpy(&s, cpu::f32_arg(step, 4, "adamw_update", "step"), sizeof s);
  else s = adamw_step_scalars(lr, beta1, beta2, t, grad_scale);
  float* w = cpu::f32_arg(master, n, "adamw_update", "master");
  float* p = cpu::optional_f32_arg(params, n, "adamw_update", "params");
  const float* g = cpu::f32_arg(grad, n, "adamw_update", "grad");
  float* mm = cpu::f32_arg(m, n, "adamw_update", "m");
  float* vv = cpu::f32_arg(v, n, "adamw_update", "v");
  bool copy_out = p && p != w;  // on the CPU params may alias master
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * s.grad_scale;
    float mi = beta1 * mm[i] + (1.0f - beta1) * gi;
    float vi = beta2 * vv[i] + (1.0f - beta2) * gi * gi;
    mm[i] = mi;
    vv[i] = vi;
    float mhat = mi / s.correction1;
    float vhat = vi / s.correction2;
    w[i] -= s.lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * w[i]);
    if (copy_out) p[i] = w[i];
  }
}

double CpuOps::sum_squares(Tensor x, size_t n) {
  const float* p = cpu::f32_arg(x, n, "sum_squares", "x");
  return chunked_sum(p, n, [](double a) { return a * a; });
}

double CpuOps::sum(Tensor x, size_t n) {
  const float* p = cpu::f32_arg(x, n, "sum", "x");
  return chunked_sum(p, n, [](double a) { return a; });
}

void CpuOps::sum_to(Tensor out, Tensor x, size_t n) {
  float* o = cpu::f32_arg(out, 1, "sum_to", "out");
  *o = static_cast<float>(sum(x, n));
}

}  // namespace pt
