#include "core/cpu/cpu_norm_backward.h"

#include <cstddef>

#include "core/cpu/cpu_parallel.h"

namespace pt::cpu {

void norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int N, int C) {
  const bool centred = mean != nullptr;
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* xr = x + size_t(n) * C;
      const float* dyr = dy + size_t(n) * C;
      const float m = centred ? mean[n] : 0.0f, r = rstd[n];
      float g_mean = 0.0f, gx_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gx_mean)
      for (int c = 0; c < C; c++) {
        const float g = w[c] * dyr[c];
        g_mean += g;
        gx_mean += g * ((xr[c] - m) * r);
      }
      g_mean = centred ? g_mean / C : 0.0f;
      gx_mean /= C;
      float* dxr = dx + size_t(n) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        const float xhat = (xr[c] - m) * r;
        dxr[c] += r * (w[c] * dyr[c] - g_mean - xhat * gx_mean);
      }
    }
  }
  if (dw || db) {
    for_each_channel_block(C, [&](int c0, int c1) {
      float acc_w[kChannelBlock] = {}, acc_b[kChannelBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* xr = x + size_t(n) * C;
        const float* dyr = dy + size_t(n) * C;
        const float m = centred ? mean[n] : 0.0f, r = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) {
          acc_w[c - c0] += (xr[c] - m) * r * dyr[c];
          acc_b[c - c0] += dyr[c];
        }
      }
      for (int c = c0; c < c1; c++) {
        if (dw) dw[c] += acc_w[c - c0];
        if (db) db[c] += acc_b[c - c0];
      }
    });
  }
}

}  // namespace pt::cpu
