// Fused softmax + cross-entropy with its backward written in place (llm.c's fused classifier):
// the logits of the LM head become dlogits without a probability matrix ever existing.
//
// Computes, per row n (target y = targets[n], x = logits[n, :]):
//   M = max_{i<V} x_i,  S = sum_{i<V} exp(x_i - M),  loss = log S + M - x_y
//   dloss != 0:  x_i <- (exp(x_i - M) / S - [i == y]) * dloss  (i < V),  x_i <- 0  (V <= i < Vp)
//   y < 0: loss 0 and, when dloss != 0, the whole row 0.  y >= V: a NaN loss.
//
// Floor (s = bytes per logit): training reads and writes each row once, N * Vp * 2s bytes, plus
// 8N for the targets and losses; eval reads N * Vp * s. GPT-2 124M, B*T = 8192, bf16: 1.65 GB,
// ~0.34 ms at 4.8 TB/s (H200). Arithmetic: two exps per logit in training (the sum, the gradient):
// ~0.2 ms of the SFUs (16 per clock per SM) for that shape, so an SM must overlap one row's math
// with another row's memory traffic to stay at the floor.
//
// One block per row. Each thread keeps an online (max, sum) over its columns, a chunk at a time (a
// new maximum rescales the sum); the block merges them in a fixed tree (warp butterflies, then
// warp 0; online_softmax.cuh): bitwise the same result on every run, no atomics.
//
// Training, row held on chip (the floor's one read + one write): thread t owns the 16-byte chunks
// t, t + kThreads, ... of the row (coalesced sweeps), the first kRegChunks = 8 in registers (32 of
// its 64) and the rest, at most 8 more, in shared memory, copied there by cp.async (registers
// alone cannot hold a long row: a bf16 row of Llama 3's 128256 logits is 256 KB, a whole SM's
// register file). Every load of the row is issued before the first dependent instruction; after
// the merge each thread turns its chunks into dlogits and stores them.
//   rows of <= 512 * 16 chunks: 512 threads, two rows per SM (GPT-2's 50304 bf16: 64 KB in
//     registers + 34 KB shared per row);
//   rows of <= 1024 * 16 chunks: 1024 threads, one row per SM (Llama 3's 128256 bf16: 128 KB +
//     122.5 KB; fp32 rows up to Vp = 65536).
//
// Two-pass fallback (512 threads), for eval (which only reads), longer rows, GPUs with too little
// shared memory, and rows not in aligned 16-byte chunks (Vp % (16/s) != 0 or a misaligned row:
// scalar loads): pass 1 computes (M, S), pass 2 (training only) re-reads the row, mostly from L2,
// and rewrites it: three passes of traffic instead of two.
//
// Both paths read the target logit before the block's first barrier, so no thread can have
// overwritten it yet, and share the per-chunk math below.
#include <cuda_pipeline_primitives.h>

#include <algorithm>
#include <cmath>

#include "cuda/cross_entropy.h"
#include "cuda/cuda_common.h"
#include "cuda/online_softmax.cuh"

namespace pt::gpu {

namespace {

constexpr int kFallbackThreads = 512;
constexpr int kRegChunks = 8;   // 16-byte chunks a thread holds in registers (on-chip path)
constexpr int kMaxChunks = 16;  // ... and in all: the rest in shared memory

// Adds the real columns (< V) of the chunk starting at column col to a thread's state: the
// chunk's maximum first, so that the sum is rescaled at most once per chunk.
template <typename T, int VEC>
__device__ __forceinline__ void add_chunk(MaxSum& st, const Packed<T, VEC>& p, int col, int V) {
  float cm = -INFINITY;
#pragma unroll
  for (int k = 0; k < VEC; ++k)
    if (col + k < V) cm = fmaxf(cm, to_float(p.v[k]));
  if (cm > st.m) {
    st.s *= expf(st.m - cm);  // 0 while st.m = -inf
    st.m = cm;
  }
  // While st.m is -inf, every value seen is -inf (or NaN): taking exps relative to 0 then keeps
  // exp(-inf - (-inf)) = NaN out, so a -inf logit adds 0, as in CpuOps; a NaN makes the sum NaN.
  const float m = st.m == -INFINITY ? 0.0f : st.m;
#pragma unroll
  for (int k = 0; k < VEC; ++k)
    if (col + k < V) st.s += expf(to_float(p.v[k]) - m);
}

// What the backward needs of a row: dlogit_i = exp(x_i - M) * scale - [i == target] * dloss with
// scale = dloss / S (softmax * dloss), 0 on the padded columns (i >= V).
struct RowGrad {
  int V, target;
  float M, scale, dloss;
};

template <typename T, int VEC>
__device__ __forceinline__ Packed<T, VEC> grad_chunk(Packed<T, VEC> p, int col, const RowGrad& g) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    float d = 0.0f;
    if (col + k < g.V) {
      d = expf(to_float(p.v[k]) - g.M) * g.scale;
      if (col + k == g.target) d -= g.dloss;
    }
    p.v[k] = from_float<T>(d);
  }
  return p;
}

template <typename T>
__device__ __forceinline__ float target_logit(const T* x, int target, int V) {
  return target < V ? to_float(x[target]) : NAN;  // a target past the vocabulary: NaN loss
}

// A row without a target: loss 0 and, in training, a zero row.
template <int kThreads, typename T, int VEC>
__device__ void ignored_row(float* loss, T* x, int Vp, bool backward) {
  if (threadIdx.x == 0) *loss = 0.0f;
  if (!backward) return;
  Packed<T, VEC> zero;
#pragma unroll
  for (int k = 0; k < VEC; ++k) zero.v[k] = from_float<T>(0.0f);
  for (int i = threadIdx.x * VEC; i < Vp; i += kThreads * VEC) store_packed<T, VEC>(x + i, zero);
}

// Merges the block's states; thread 0 writes the loss; every thread gets the row's (M, S).
template <int kThreads>
__device__ __forceinline__ MaxSum row_total(MaxSum st, float* loss, float target_logit) {
  __shared__ MaxSum warp_states[kThreads / kWarpSize];
  __shared__ MaxSum row_state;
  const MaxSum total = block_merge<kThreads>(st, warp_states);
  if (threadIdx.x == 0) {
    row_state = total;
    *loss = logf(total.s) + total.m - target_logit;
  }
  __syncthreads();
  return row_state;
}

// Hides a chunk's value from the optimizer, so that the gradient converts the packed registers
// again: otherwise it keeps the fp32 copies of a bf16 row made for the sum (twice the registers)
// and spills.
template <typename T, int VEC>
__device__ __forceinline__ void keep_packed(Packed<T, VEC>& p) {
  uint32_t* w = reinterpret_cast<uint32_t*>(p.v);
#pragma unroll
  for (int i = 0; i < VEC * int(sizeof(T)) / 4; ++i) asm("" : "+r"(w[i]));
}

// Training with the row on chip (see the header): needs Vp % VEC == 0, a 16-byte aligned row and
// dynamic shared memory for the chunks past the registers, (Vp / VEC - kThreads * kRegChunks) * 16
// bytes (chunk c at c - kThreads * kRegChunks).
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)  // 64 registers: 1024 threads fill an SM
    cross_entropy_on_chip_kernel(float* losses, T* logits, const int32_t* targets, int V, int Vp, float dloss) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int kInRegisters = kThreads * kRegChunks;
  extern __shared__ int4 staged[];
  const int row = blockIdx.x;
  T* x = logits + static_cast<size_t>(row) * Vp;
  const int chunks = Vp / VEC;
  const int target = targets[row];

  // Every load before any math (also for a row that turns out to have no target: rare, and not
  // waiting for the target keeps its latency off the row's).
  Packed<T, VEC> p[kRegChunks];
#pragma unroll
  for (int j = 0; j < kRegChunks; ++j) {
    const int c = j * kThreads + threadIdx.x;
    if (c < chunks) p[j] = load_packed<T, VEC>(x + c * VEC);
  }
  for (int c = kInRegisters + threadIdx.x; c < chunks; c += kThreads)
    __pipeline_memcpy_async(&staged[c - kInRegisters], x + c * VEC, 16);
  __pipeline_commit();
  if (target < 0) {
    __pipeline_wait_prior(0);  // no copy may still be landing when the block exits
    ignored_row<kThreads, T, VEC>(losses + row, x, Vp, true);
    return;
  }
  const float tl = target_logit(x, target, V);

  MaxSum st{-INFINITY, 0.0f};
#pragma unroll
  for (int j = 0; j < kRegChunks; ++j) {
    const int c = j * kThreads + threadIdx.x;
    if (c < chunks) {
      add_chunk(st, p[j], c * VEC, V);
      keep_packed(p[j]);
    }
  }
  __pipeline_wait_prior(0);  // each thread reads back only the chunks it copied: no barrier
  auto staged_chunk = [&](int c) {
    return load_packed<T, VEC>(reinterpret_cast<const T*>(&staged[c - kInRegisters]));
  };
  for (int c = kInRegisters + threadIdx.x; c < chunks; c += kThreads) add_chunk(st, staged_chunk(c), c * VEC, V);
  const MaxSum total = row_total<kThreads>(st, losses + row, tl);

  const RowGrad g{V, target, total.m, dloss / total.s, dloss};
#pragma unroll
  for (int j = 0; j < kRegChunks; ++j) {
    const int c = j * kThreads + threadIdx.x;
    if (c < chunks) store_packed<T, VEC>(x + c * VEC, grad_chunk(p[j], c * VEC, g));
  }
  for (int c = kInRegisters + threadIdx.x; c < chunks; c += kThreads)
    store_packed<T, VEC>(x + c * VEC, grad_chunk(staged_chunk(c), c * VEC, g));
}

// The two-pass fallback (see the header): VEC = 16 / sizeof(T) when the row is in aligned 16-byte
// chunks, else 1.
template <typename T, int VEC>
__global__ void __launch_bounds__(kFallbackThreads)
    cross_entropy_two_pass_kernel(float* losses, T* logits, const int32_t* targets, int V, int Vp, float dloss) {
  const int row = blockIdx.x;
  T* x = logits + static_cast<size_t>(row) * Vp;
  const int target = targets[row];
  const bool backward = dloss != 0.0f;
  if (target < 0) {
    ignored_row<kFallbackThreads, T, VEC>(losses + row, x, Vp, backward);
    return;
  }
  const float tl = target_logit(x, target, V);

  MaxSum st{-INFINITY, 0.0f};
  for (int i = threadIdx.x * VEC; i < V; i += kFallbackThreads * VEC)
    add_chunk(st, load_packed<T, VEC>(x + i), i, V);  // within the row: i + VEC <= Vp (Vp % VEC == 0)
  const MaxSum total = row_total<kFallbackThreads>(st, losses + row, tl);
  if (!backward) return;

  const RowGrad g{V, target, total.m, dloss / total.s, dloss};
  for (int i = threadIdx.x * VEC; i < Vp; i += kFallbackThreads * VEC)
    store_packed<T, VEC>(x + i, grad_chunk(load_packed<T, VEC>(x + i), i, g));
}

template <typename T, int kThreads>
void launch_on_chip(float* losses, T* x, const int32_t* targets, int N, int V, int Vp, float dloss, int smem,
                    cudaStream_t stream) {
  auto kernel = cross_entropy_on_chip_kernel<T, kThreads>;
  use_dynamic_shared(kernel, smem, [] { return "softmax_cross_entropy"; });  // the caller checked the limit
  kernel<<<N, kThreads, smem, stream>>>(losses, x, targets, V, Vp, dloss);
}

template <typename T>
void launch(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
            cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  T* x = static_cast<T*>(logits);
  const bool chunked = vec16_ok<T>(Vp, {logits});
  const int chunks = Vp / VEC;
  // Training on chip: 512 threads (two rows per SM) while they can hold the row, else 1024.
  const int threads = chunks <= 512 * kMaxChunks ? 512 : 1024;
  const long long smem = 16LL * std::max(0, chunks - threads * kRegChunks);
  if (chunked && dloss != 0.0f && chunks <= threads * kMaxChunks && smem <= max_dynamic_shared_bytes()) {
    if (threads == 512)
      launch_on_chip<T, 512>(losses, x, targets, N, V, Vp, dloss, static_cast<int>(smem), stream);
    else
      launch_on_chip<T, 1024>(losses, x, targets, N, V, Vp, dloss, static_cast<int>(smem), stream);
  } else if (chunked) {
    cross_entropy_two_pass_kernel<T, VEC><<<N, kFallbackThreads, 0, stream>>>(losses, x, targets, V, Vp, dloss);
  } else {
    cross_entropy_two_pass_kernel<T, 1><<<N, kFallbackThreads, 0, stream>>>(losses, x, targets, V, Vp, dloss);
  }
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
