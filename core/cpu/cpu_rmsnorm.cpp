// RMSNorm over the last dimension, Hugging Face's LlamaRMSNorm: no centring, no bias, eps given.
//  forward:  rstd = 1/sqrt(sum(x^2)/C + eps), out = (x*rstd)*w (the product in that order, as
//            `weight * (x * rsqrt(var + eps))`).
//  backward: with xhat = x*rstd and g = w*dout,
//            dinp += rstd * (g - xhat * mean(g*xhat)), dw += sum_n xhat*dout.
//            (d rstd / d x_j = -rstd^3 x_j / C, so the mean(g) term of LayerNorm's backward,
//            which comes from the centring, is absent.)
// Cost: ~4 FLOPs per element forward, memory-bound: reads x and writes out (8 bytes/element).
// The backward is cpu::norm_backward (cpu_norm_backward.h), shared with LayerNorm.
#include <cmath>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_norm_backward.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

void CpuOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) {
  cpu::check_dims("rmsnorm_forward", {N, C});
  size_t NC = size_t(N) * C;
  float* o = cpu::f32_arg(out, NC, "rmsnorm_forward", "out");
  float* rs = cpu::optional_f32_arg(rstd, N, "rmsnorm_forward", "rstd");  // only backward needs it
  const float* x = cpu::f32_arg(inp, NC, "rmsnorm_forward", "inp");
  const float* wt = cpu::f32_arg(w, C, "rmsnorm_forward", "w");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* xr = x + size_t(n) * C;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; c++) sq += xr[c] * xr[c];
    float r = 1.0f / std::sqrt(sq / C + eps);
    float* orow = o + size_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) orow[c] = xr[c] * r * wt[c];
    if (rs) rs[n] = r;
  }
}

// The add, then the RMSNorm of what it stored: bitwise add + rmsnorm_forward by construction
// (as residual_layernorm_forward; the CPU gains nothing from fusing).
void CpuOps::residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w, int N,
                                      int C, float eps) {
  cpu::check_dims("residual_rmsnorm_forward", {N, C});
  add(residual, a, b, size_t(N) * C);
  rmsnorm_forward(out, rstd, residual, w, N, C, eps);
}

void CpuOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N, int C) {
  cpu::check_dims("rmsnorm_backward", {N, C});
  size_t NC = size_t(N) * C;
  float* dx = cpu::optional_f32_arg(dinp, NC, "rmsnorm_backward", "dinp");
  float* dwt = cpu::optional_f32_arg(dw, C, "rmsnorm_backward", "dw");
  if (!dx && !dwt) return;
  const float* dy = cpu::f32_arg(dout, NC, "rmsnorm_backward", "dout");
  const float* x = cpu::f32_arg(inp, NC, "rmsnorm_backward", "inp");
  const float* rs = cpu::f32_arg(rstd, N, "rmsnorm_backward", "rstd");

  const float* wt = dx ? cpu::f32_arg(w, C, "rmsnorm_backward", "w") : nullptr;
  cpu::norm_backward(dx, dwt, nullptr, dy, x, wt, nullptr, rs, N, C);  // no centring, no bias
}

}  // namespace pt
