// Fused softmax + cross-entropy with its backward written in place (llm.c's fused classifier):
// the logits of the LM head become dlogits without a probability matrix ever existing, and
// no row of fp32 logits is held anywhere (the row streams through registers twice).
//
// Computes, per row n (target y = targets[n], x = logits[n, :]):
//   M = max_{i<V} x_i,  S = sum_{i<V} exp(x_i - M),  loss = log S + M - x_y
//   dloss != 0:  x_i <- (exp(x_i - M) / S - [i == y]) * dloss  (i < V),  x_i <- 0  (V <= i < Vp)
//   y < 0: loss 0 and, when dloss != 0, the whole row 0.
//
// Algorithm: one block of 512 threads per row.
//   pass 1: each thread keeps an online (max, sum) over its strided elements (a new maximum
//           rescales the sum), then the block merges the pairs in a fixed tree (warp
//           butterflies, then warp 0): deterministic;
//   pass 2: (training only) each thread rewrites its elements from (M, S).
// The target logit is read before the block's first barrier, so no thread can have
// overwritten it yet. Loads/stores are 16-byte chunks when Vp is a multiple of the chunk and
// the row pointer is aligned (bf16: Vp % 8 == 0, true for every padded vocabulary), else scalar.
//
// Memory traffic per row (s = bytes per logit): training reads 2*Vp*s and writes Vp*s (the
// second read mostly hits L2: a bf16 row of GPT-2's 50304 logits is 100 KB); eval reads Vp*s.
// GPT-2 124M, B*T = 8192, bf16: 2.47 GB for training, ~0.74 ms at 3.35 TB/s (H100 SXM).
// Arithmetic: one exp per logit per pass (fast-math ex2), far below the FLOP floor.
#include <cmath>

#include "cuda/cross_entropy.h"
#include "cuda/cuda_common.h"
#include "cuda/online_softmax.cuh"

namespace pt::gpu {

namespace {

constexpr int kBlock = 512;

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) softmax_cross_entropy_kernel(float* losses, T* logits,
                                                                       const int32_t* targets, int V, int Vp,
                                                                       float dloss) {
  __shared__ MaxSum warp_states[kBlock / kWarpSize];
  __shared__ MaxSum row_state;
  const int row = blockIdx.x;
  T* x = logits + static_cast<size_t>(row) * Vp;
  const int target = targets[row];
  const bool backward = dloss != 0.0f;

  if (target < 0) {  // no target: no loss, no gradient
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (backward)
      for (int i = threadIdx.x; i < Vp; i += kBlock) x[i] = from_float<T>(0.0f);
    return;
  }
  const bool target_ok = target < V;
  const float target_logit = target_ok ? to_float(x[target]) : NAN;  // before anyone writes the row

  MaxSum st{-INFINITY, 0.0f};
  for (int i = threadIdx.x * VEC; i < V; i += kBlock * VEC) {
    Packed<T, VEC> p = load_packed<T, VEC>(x + i);  // within the row: i + VEC <= Vp (Vp % VEC == 0)
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (i + k < V) add_value(st, to_float(p.v[k]));
  }
  const MaxSum total = block_merge<kBlock>(st, warp_states);
  if (threadIdx.x == 0) {
    row_state = total;
    losses[row] = logf(total.s) + total.m - target_logit;
  }
  __syncthreads();
  if (!backward) return;

  const float M = row_state.m;
  const float scale = dloss / row_state.s;  // softmax * dloss = exp(x - M) * (dloss / S)
  for (int i = threadIdx.x * VEC; i < Vp; i += kBlock * VEC) {
    Packed<T, VEC> p = load_packed<T, VEC>(x + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const int col = i + k;
      float d = 0.0f;  // padded columns
      if (col < V) {
        d = expf(to_float(p.v[k]) - M) * scale;
        if (col == target) d -= dloss;
      }
      p.v[k] = from_float<T>(d);
    }
    store_packed<T, VEC>(x + i, p);
  }
}

template <typename T>
void launch(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
            cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  T* x = static_cast<T*>(logits);
  if (Vp % VEC == 0 && is_aligned(logits, 16))
    softmax_cross_entropy_kernel<T, VEC><<<N, kBlock, 0, stream>>>(losses, x, targets, V, Vp, dloss);
  else
    softmax_cross_entropy_kernel<T, 1><<<N, kBlock, 0, stream>>>(losses, x, targets, V, Vp, dloss);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax_cross_entropy(DType dtype, float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                           float dloss, void* stream) {
  check(V > 0 && V <= Vp, "softmax_cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                              " Vp=" + std::to_string(Vp));
  if (N <= 0) return;
  switch (dtype) {
    case DType::f32: return launch<float>(losses, logits, targets, N, V, Vp, dloss, as_stream(stream));
    case DType::bf16: return launch<__nv_bfloat16>(losses, logits, targets, N, V, Vp, dloss, as_stream(stream));
    default:
      throw RuntimeError(std::string("softmax_cross_entropy: dtype ") + dtype_name(dtype) +
                         " is not supported (f32 or bf16)");
  }
}

}  // namespace pt::gpu
