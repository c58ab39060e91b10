// Elementwise ops: GELU (GPT-2's tanh approximation) forward and backward, add, scale.
//  gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//  gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// Cost per element: GELU ~10 FLOPs + one tanh, add 1 FLOP, scale 1 FLOP; all memory-bound:
// gelu_forward 8 bytes, gelu_backward 12 (read inp, dout, write dinp), add 12, scale 8.
// Each element is independent, so the parallel split cannot change any result.
#include <cmath>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
// Below this many elements the threads cost more than they save.
constexpr size_t kParallelMin = size_t(1) << 15;

}  // namespace

void CpuOps::gelu_forward(Tensor out, Tensor inp, size_t n) {
  float* o = cpu::f32_arg(out, n, "gelu_forward", "out");
  const float* x = cpu::f32_arg(inp, n, "gelu_forward", "inp");
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    float xi = x[i];
    float u = kGeluScale * (xi + kGeluCubic * xi * xi * xi);
    o[i] = 0.5f * xi * (1.0f + std::tanh(u));
  }
}

void CpuOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) {
  float* dx = cpu::optional_f32_arg(dinp, n, "gelu_backward", "dinp");
  if (!dx) return;
  const float* x = cpu::f32_arg(inp, n, "gelu_backward", "inp");
  const float* dy = cpu::f32_arg(dout, n, "gelu_backward", "dout");
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    float xi = x[i];
    float th = std::tanh(kGeluScale * (xi + kGeluCubic * xi * xi * xi));
    float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * xi * xi);
    float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
    dx[i] = grad * dy[i];
  }
}

void CpuOps::add(Tensor out, Tensor a, Tensor b, size_t n) {
  float* o = cpu::f32_arg(out, n, "add", "out");
  const float* pa = cpu::f32_arg(a, n, "add", "a");
  const float* pb = cpu::f32_arg(b, n, "add", "b");
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) o[i] = pa[i] + pb[i];
}

void CpuOps::scale(Tensor x, float s, size_t n) {
  float* p = cpu::f32_arg(x, n, "scale", "x");
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) p[i] *= s;
}

}  // namespace pt
