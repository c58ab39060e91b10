// RMSNorm (Hugging Face's LlamaRMSNorm), fp32 and bf16: forward, plain and fused with the
// residual add that precedes it. The same structure as layernorm.cu, less the
// mean: one statistics pass instead of two, and no bias.
//
// Computes, per row of x[N, C] (x = inp, or x = residual = a + b rounded to the dtype):
//   rstd = 1 / sqrt(sum(x^2) / C + eps),   out = (x * rstd) * w
// rstd[N] is fp32 (saved for backward); storage in the dtype, all math in fp32, one rounding at
// the store. (transformers rounds x * rstd to the dtype before the weight multiply, a second
// bf16 rounding; one rounding is the more accurate of the two and well inside bf16's tolerance.)
//
// Algorithm: one warp per row (8 rows per 256-thread block), two passes over the row:
//   1. sum of squares (the fused form also computes a + b here and stores the residual, and sums
//      the squares of the ROUNDED values it stored, so the statistics are those rmsnorm_forward
//      computes from the stored residual),
//   2. scale by rstd and w, store.
// Lane l handles chunks l, l+32, ... of VEC elements in both passes, so pass 2 re-reads exactly
// the bytes the same thread read (or wrote) in pass 1, from L1/L2. The warp butterfly
// (warp_sum) fixes the summation order: deterministic, no atomics. Chunks are 16 bytes (128-bit
// loads/stores) when C is a multiple of the chunk and every pointer is 16-byte aligned;
// otherwise a VEC=1 instantiation uses scalar accesses. The plain and the fused kernel are one
// template, so for the same VEC they sum a row in the same order (the bitwise contract of
// Ops::residual_rmsnorm_forward; CudaOps picks the same VEC for both).
//
// Memory traffic (s = 4 for fp32, 2 for bf16), the floor the kernel should approach:
//   plain: read N*C*s (x) + write N*C*s (out) + 4N (rstd) + C*s (w, then L2-resident)
//   fused: read 2*N*C*s (a, b) + write 2*N*C*s (residual, out) + 4N + C*s
// e.g. a 1B-class Llama, N = B*T = 8*1024, C = 2048, bf16: plain 67.1 MB (~20 us at 3.35 TB/s on
// H100 SXM), fused 134.2 MB (~40 us), against 167.8 MB (~50 us) for a separate add and RMSNorm.
// The arithmetic (~4 flops per element) is far below the FLOP floor.
//
// The backward is cuda/norm_backward.cu (one kernel for LayerNorm and RMSNorm).
#include "cuda/cuda_common.h"
#include "cuda/norm_args.h"
#include "cuda/rmsnorm.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

// kResidual: pass 1 reads a and b and stores residual = a + b; pass 2 reads the residual.
// Otherwise both passes read a (the input) and residual/b are unused.
template <typename T, int VEC, bool kResidual>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_forward_kernel(T* out, float* rstd, T* residual, const T* a, const T* b, const T* w, int N, int C,
                           float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below stay full-warp
  const size_t offset = static_cast<size_t>(row) * C;
  const T* x = kResidual ? residual + offset : a + offset;

  float sq = 0.0f;
  for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
    Packed<T, VEC> xa = load_packed<T, VEC>(a + offset + i);
    if constexpr (kResidual) {
      Packed<T, VEC> xb = load_packed<T, VEC>(b + offset + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) xa.v[k] = from_float<T>(to_float(xa.v[k]) + to_float(xb.v[k]));
      store_packed<T, VEC>(residual + offset + i, xa);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float v = to_float(xa.v[k]);  // the rounded value: statistics of what is stored
      sq += v * v;
    }
  }
  const float r = rsqrtf(warp_sum(sq) / C + eps);
  if (lane == 0 && rstd) rstd[row] = r;

  for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
    Packed<T, VEC> xv = load_packed<T, VEC>(x + i);
    Packed<T, VEC> wv = load_packed<T, VEC>(w + i);
    Packed<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(to_float(xv.v[k]) * r * to_float(wv.v[k]));
    store_packed<T, VEC>(out + offset + i, o);
  }
}

template <bool kResidual>
void launch_forward(const char* op, DType dtype, void* out, float* rstd, void* residual, const void* a,
                    const void* b, const void* w, int N, int C, float eps, cudaStream_t stream) {
  dispatch_act(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    bool vec = C % V == 0 && is_aligned(out, 16) && is_aligned(a, 16) && is_aligned(w, 16);
    if constexpr (kResidual) vec = vec && is_aligned(residual, 16) && is_aligned(b, 16);
    const unsigned grid = static_cast<unsigned>(ceil_div(N, kRowsPerBlock));
    T* o = static_cast<T*>(out);
    T* res = static_cast<T*>(residual);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    const T* pw = static_cast<const T*>(w);
    if (vec)
      rmsnorm_forward_kernel<T, V, kResidual><<<grid, kBlock, 0, stream>>>(o, rstd, res, pa, pb, pw, N, C, eps);
    else
      rmsnorm_forward_kernel<T, 1, kResidual><<<grid, kBlock, 0, stream>>>(o, rstd, res, pa, pb, pw, N, C, eps);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rmsnorm_forward(DType dtype, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps,
                     void* stream) {
  check_norm_args("rmsnorm_forward", N, C, {out, inp, w});
  if (N == 0) return;  // a zero-block grid is a launch error
  launch_forward<false>("rmsnorm_forward", dtype, out, rstd, nullptr, inp, nullptr, w, N, C, eps, as_stream(stream));
}

void fused_residual_rmsnorm_forward(DType dtype, void* residual, void* out, float* rstd, const void* a,
                                    const void* b, const void* w, int N, int C, float eps, void* stream) {
  check_norm_args("fused_residual_rmsnorm_forward", N, C, {residual, out, a, b, w});
  if (N == 0) return;
  launch_forward<true>("fused_residual_rmsnorm_forward", dtype, out, rstd, residual, a, b, w, N, C, eps,
                       as_stream(stream));
}

}  // namespace pt::gpu
