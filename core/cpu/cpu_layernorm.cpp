// LayerNorm over the last dimension, exactly GPT-2's: eps 1e-5, biased variance (divide by C).
//  forward:  mean = sum(x)/C, rstd = 1/sqrt(sum((x-mean)^2)/C + eps), out = (x-mean)*rstd*w + b.
//            Two passes over the row (mean, then the centred variance) rather than E[x^2]-E[x]^2,
//            which cancels catastrophically when |mean| >> std.
//  backward: with xhat = (x-mean)*rstd and g = w*dout,
//            dinp += rstd * (g - mean(g) - xhat * mean(g*xhat)), dw += sum_n xhat*dout, db += sum_n dout.
// Cost: ~8 FLOPs per element forward, memory-bound: reads x and writes out (8 bytes/element).
// The backward is cpu::norm_backward (cpu_norm_backward.h), shared with RMSNorm.
#include <cmath>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_norm_backward.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {
constexpr float kLayerNormEps = 1e-5f;  // GPT-2's value
}

void CpuOps::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N,
                               int C) {
  cpu::check_dims("layernorm_forward", {N, C});
  size_t NC = size_t(N) * C;
  float* o = cpu::f32_arg(out, NC, "layernorm_forward", "out");
  // mean/rstd are only needed by backward; an eval-only caller may pass null.
  float* mu = cpu::optional_f32_arg(mean, N, "layernorm_forward", "mean");
  float* rs = cpu::optional_f32_arg(rstd, N, "layernorm_forward", "rstd");
  const float* x = cpu::f32_arg(inp, NC, "layernorm_forward", "inp");
  const float* wt = cpu::f32_arg(w, C, "layernorm_forward", "w");
  const float* bs = cpu::f32_arg(b, C, "layernorm_forward", "b");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* xr = x + size_t(n) * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += xr[c];
    float m = sum / C;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; c++) sq += (xr[c] - m) * (xr[c] - m);
    float r = 1.0f / std::sqrt(sq / C + kLayerNormEps);
    float* orow = o + size_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) orow[c] = (xr[c] - m) * r * wt[c] + bs[c];
    if (mu) mu[n] = m;
    if (rs) rs[n] = r;
  }
}

// The residual add, then the LayerNorm of what it stored: the two ops themselves, so the results
// are bitwise those of add + layernorm_forward (the CPU gains nothing from fusing: the row is in
// cache either way). residual may alias a or b; out must not overlap them.
void CpuOps::residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b,
                                        Tensor w, Tensor bias, int N, int C) {
  cpu::check_dims("residual_layernorm_forward", {N, C});
  add(residual, a, b, size_t(N) * C);
  layernorm_forward(out, mean, rstd, residual, w, bias, N, C);
}

void CpuOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                Tensor rstd, int N, int C) {
  cpu::check_dims("layernorm_backward", {N, C});
  size_t NC = size_t(N) * C;
  float* dx = cpu::optional_f32_arg(dinp, NC, "layernorm_backward", "dinp");
  float* dwt = cpu::optional_f32_arg(dw, C, "layernorm_backward", "dw");
  float* dbs = cpu::optional_f32_arg(db, C, "layernorm_backward", "db");
  const float* dy = cpu::f32_arg(dout, NC, "layernorm_backward", "dout");
  const float* x = cpu::f32_arg(inp, NC, "layernorm_backward", "inp");
  const float* mu = cpu::f32_arg(mean, N, "layernorm_backward", "mean");
  const float* rs = cpu::f32_arg(rstd, N, "layernorm_backward", "rstd");

  const float* wt = dx ? cpu::f32_arg(w, C, "layernorm_backward", "w") : nullptr;
  cpu::norm_backward(dx, dwt, dbs, dy, x, wt, mu, rs, N, C);
}

}  // namespace pt
