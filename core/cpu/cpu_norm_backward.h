// The backward of the two row norms, LayerNorm and RMSNorm, for CpuOps: one routine serves both,
// because RMSNorm is LayerNorm without the centring (mean = 0, so x - 0 is exactly x and the
// mean(g) term vanishes) and without a bias. With xhat = (x - mean) * rstd and g = w * dout:
//   dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))    (RMSNorm: no mean_c(g) term)
//   dw   += sum_n xhat * dout,   db += sum_n dout
// dinp is parallel over rows; dw/db over channel blocks, each summing the rows in order, so no two
// threads touch one gradient element (deterministic with any thread count, no atomics).
// Cost: ~12 FLOPs per element; memory-bound: reads x and dout twice (once per row for dinp, once
// per channel block for dw/db) and read-modify-writes dinp, about 24 bytes per element.
#pragma once

namespace pt::cpu {

// mean == nullptr: RMSNorm. Each output may be nullptr (not wanted); w is read only for dx.
void norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int N, int C);

}  // namespace pt::cpu
