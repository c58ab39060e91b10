// LayerNorm (GPT-2: eps 1e-5, biased variance), fp32 and bf16: forward, plain and fused with the
// residual add that precedes it (llm.c's fused_residual_forward).
//
// Computes, per row of x[N, C] (x = inp, or x = residual = a + b rounded to the dtype):
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C,  rstd = 1 / sqrt(var + 1e-5)
//   out  = (x - mean) * rstd * w + b
// mean[N] and rstd[N] are fp32 (saved for backward); storage in the dtype, all math in fp32.
//
// Algorithm: one warp per row (8 rows per 256-thread block), three passes over the row:
//   1. sum (the fused form also computes a + b here and stores the residual),
//   2. sum of squared deviations from the mean: two passes, not E[x^2] - mean^2, so a row whose
//      mean is large against its spread (the residual stream late in training) loses no digits,
//   3. normalise, scale, shift, store.
// Lane l handles chunks l, l+32, l+64, ... of VEC elements in every pass, so passes 2 and 3
// re-read exactly the bytes the same thread read (or wrote) in pass 1: a row is C*s bytes
// (1.5 KB for GPT-2 124M in bf16), and those re-reads hit L1/L2, not DRAM. Warp sums use the
// butterfly shuffle, so each row's statistics come out the same on every run (no atomics,
// deterministic). Chunks are 16 bytes (128-bit loads/stores) when C is a multiple of the chunk
// and every pointer is 16-byte aligned; otherwise (e.g. C = 771, an odd slice) a VEC=1
// instantiation uses scalar accesses.
//
// Memory traffic (s = 4 for fp32, 2 for bf16), the floor the kernel should approach:
//   plain: read N*C*s (x) + write N*C*s (out) + 8N (mean, rstd) + 2*C*s (w, b, then L2-resident)
//   fused: read 2*N*C*s (a, b) + write 2*N*C*s (residual, out) + 8N + 2*C*s
// e.g. GPT-2 124M, N = B*T = 8*1024, C = 768, bf16: plain 25.2 MB (~7.5 us at 3.35 TB/s on H100
// SXM), fused 50.4 MB (~15 us), against 62.9 MB (~19 us) for a separate residual-add kernel and
// LayerNorm.
// The arithmetic (~10 flops per element) is far below the FLOP floor.
//
// The backward is cuda/norm_backward.cu (one kernel for LayerNorm and RMSNorm).
#include "cuda/cuda_common.h"
#include "cuda/layernorm.h"
#include "cuda/norm_args.h"

namespace pt::gpu {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

// kResidual: pass 1 reads a and b, stores residual = a + b, and passes 2-3 read the residual.
// Otherwise pass 1 and passes 2-3 read a (the input) and residual/b are unused.
template <typename T, int VEC, bool kResidual>
__global__ void __launch_bounds__(kBlock)
    layernorm_forward_kernel(T* out, float* mean, float* rstd, T* residual, const T* a, const T* b, const T* w,
                             const T* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below stay full-warp
  const size_t offset = static_cast<size_t>(row) * C;
  const T* x = kResidual ? residual + offset : a + offset;

  float sum = 0.0f;
  for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
    Packed<T, VEC> xa = load_packed<T, VEC>(a + offset + i);
    if constexpr (kResidual) {
      Packed<T, VEC> xb = load_packed<T, VEC>(b + offset + i);
      Packed<T, VEC> r;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        r.v[k] = from_float<T>(to_float(xa.v[k]) + to_float(xb.v[k]));
        sum += to_float(r.v[k]);  // the rounded value: statistics of what is stored
      }
      store_packed<T, VEC>(residual + offset + i, r);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += to_float(xa.v[k]);
    }
  }
  const float m = warp_sum(sum) / C;

  float sq = 0.0f;
  for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
    Packed<T, VEC> xv = load_packed<T, VEC>(x + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float d = to_float(xv.v[k]) - m;
      sq += d * d;
    }
  }
  const float s = rsqrtf(warp_sum(sq) / C + kEps);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }

  for (int i = lane * VEC; i < C; i += kWarpSize * VEC) {
    Packed<T, VEC> xv = load_packed<T, VEC>(x + i);
    Packed<T, VEC> wv = load_packed<T, VEC>(w + i);
    Packed<T, VEC> bv = load_packed<T, VEC>(bias + i);
    Packed<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o.v[k] = from_float<T>((to_float(xv.v[k]) - m) * s * to_float(wv.v[k]) + to_float(bv.v[k]));
    store_packed<T, VEC>(out + offset + i, o);
  }
}

template <typename T, bool kResidual>
void launch(T* out, float* mean, float* rstd, T* residual, const T* a, const T* b, const T* w, const T* bias, int N,
            int C, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  bool vec = C % V == 0 && is_aligned(out, 16) && is_aligned(a, 16) && is_aligned(w, 16) && is_aligned(bias, 16);
  if constexpr (kResidual) vec = vec && is_aligned(residual, 16) && is_aligned(b, 16);
  const unsigned grid = static_cast<unsigned>(ceil_div(N, kRowsPerBlock));
  if (vec) {
    layernorm_forward_kernel<T, V, kResidual>
        <<<grid, kBlock, 0, stream>>>(out, mean, rstd, residual, a, b, w, bias, N, C);
  } else {
    layernorm_forward_kernel<T, 1, kResidual>
        <<<grid, kBlock, 0, stream>>>(out, mean, rstd, residual, a, b, w, bias, N, C);
  }
  CUDA_CHECK_LAUNCH();
}

[[noreturn]] void unsupported(const char* op, DType dtype) {
  throw RuntimeError(std::string(op) + ": dtype " + dtype_name(dtype) + " is not supported (f32 or bf16)");
}

}  // namespace

void layernorm_forward(DType dtype, void* out, float* mean, float* rstd, const void* inp, const void* w,
                       const void* b, int N, int C, void* stream) {
  check_norm_args("layernorm_forward", N, C, {out, inp, w, b});
  if (N == 0) return;  // a zero-block grid is a launch error
  switch (dtype) {
    case DType::f32:
      return launch<float, false>(static_cast<float*>(out), mean, rstd, nullptr, static_cast<const float*>(inp),
                                  nullptr, static_cast<const float*>(w), static_cast<const float*>(b), N, C,
                                  as_stream(stream));
    case DType::bf16: {
      using bf = __nv_bfloat16;
      return launch<bf, false>(static_cast<bf*>(out), mean, rstd, nullptr, static_cast<const bf*>(inp), nullptr,
                               static_cast<const bf*>(w), static_cast<const bf*>(b), N, C, as_stream(stream));
    }
    default: unsupported("layernorm_forward", dtype);
  }
}

void fused_residual_layernorm_forward(DType dtype, void* residual, void* out, float* mean, float* rstd,
                                      const void* a, const void* b, const void* w, const void* bias, int N, int C,
                                      void* stream) {
  check_norm_args("fused_residual_layernorm_forward", N, C, {residual, out, a, b, w, bias});
  if (N == 0) return;
  switch (dtype) {
    case DType::f32:
      return launch<float, true>(static_cast<float*>(out), mean, rstd, static_cast<float*>(residual),
                                 static_cast<const float*>(a), static_cast<const float*>(b),
                                 static_cast<const float*>(w), static_cast<const float*>(bias), N, C,
                                 as_stream(stream));
    case DType::bf16: {
      using bf = __nv_bfloat16;
      return launch<bf, true>(static_cast<bf*>(out), mean, rstd, static_cast<bf*>(residual),
                              static_cast<const bf*>(a), static_cast<const bf*>(b), static_cast<const bf*>(w),
                              static_cast<const bf*>(bias), N, C, as_stream(stream));
    }
    default: unsupported("fused_residual_layernorm_forward", dtype);
  }
}

}  // namespace pt::gpu
