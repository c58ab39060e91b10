// SwiGLU (Llama's MLP activation) on the fused gate|up projection, forward and backward, fp32
// and bf16.
//
// Computes, for gate_up[N, 2H] whose rows are gate (H) | up (H), g = gate[n, j], u = up[n, j]:
//   forward:  out[n, j] = silu(g) * u,   silu(g) = g / (1 + exp(-g))
//   backward: d_gate = dout * u * sig (1 + g (1 - sig)),  d_up = dout * silu(g),
//             sig = 1 / (1 + exp(-g)); dgate_up [N, 2H] is overwritten (Ops::swiglu_backward).
// with bf16 tensors stored as bf16 and all math in fp32 (one rounding, at the store).
//
// Algorithm: an elementwise map over the N*H output positions in 16-byte chunks (4 fp32 or
// 8 bf16 per thread and step) with a grid-stride loop (grid_stride_blocks: any size fits one
// launch). A chunk of out maps to one chunk of gate and one of up in the same row (H is a
// multiple of the chunk on the 128-bit path), so every access is a 128-bit load/store and every
// warp request 512 contiguous bytes. When H is not a multiple of the chunk or a pointer is not
// 16-byte aligned, a VEC=1 instantiation uses scalar accesses.
// Under --use_fast_math expf is ex2.approx and the division an approximate reciprocal (a few
// ulp: within the 1e-5 fp32 agreement with CpuOps). For g < -87 exp(-g) is inf: sig = 0 and
// silu = -0, silu' = 0, the limits; for g > 17, exp(-g) < 2^-24 and sig = 1. No inf * 0 arises.
//
// Memory traffic (s = 4 for fp32, 2 for bf16), the floor the kernel should approach:
//   forward:  read gate, up + write out                      = 3 N H s bytes
//   backward: read gate, up, dout + write d_gate, d_up       = 5 N H s bytes
// e.g. TinyLlama 1.1B's MLP, N = B*T = 8*1024, H = 5632, bf16: forward 276.8 MB (~83 us at
// 3.35 TB/s, H100 SXM), backward 461.4 MB (~138 us). ~6 (fwd) / ~12 (bwd) fp32 operations per
// element, two on the special-function unit: far below the FLOP floor, so memory-bound.
// Deterministic: no reductions, no atomics.
#include "cuda/cuda_common.h"
#include "cuda/swiglu.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Calls f(row, col) for the first element of each VEC-chunk of the N x H output this thread owns.
template <int VEC, typename F>
__device__ __forceinline__ void for_each_chunk(int N, int H, F f) {
  const size_t n = static_cast<size_t>(N) * H;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * VEC;
  for (size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; i < n; i += stride)
    f(i / H, i % H);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) swiglu_forward_kernel(T* out, const T* gate_up, int N, int H) {
  for_each_chunk<VEC>(N, H, [&](size_t row, size_t col) {
    const T* g_ptr = gate_up + row * 2 * H + col;
    Packed<T, VEC> g = load_packed<T, VEC>(g_ptr);
    Packed<T, VEC> u = load_packed<T, VEC>(g_ptr + H);
    Packed<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(silu(to_float(g.v[k])) * to_float(u.v[k]));
    store_packed<T, VEC>(out + row * H + col, o);
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock)
    swiglu_backward_kernel(T* dgate_up, const T* gate_up, const T* dout, int N, int H) {
  for_each_chunk<VEC>(N, H, [&](size_t row, size_t col) {
    const size_t in = row * 2 * H + col;
    Packed<T, VEC> g = load_packed<T, VEC>(gate_up + in);
    Packed<T, VEC> u = load_packed<T, VEC>(gate_up + in + H);
    Packed<T, VEC> dy = load_packed<T, VEC>(dout + row * H + col);
    Packed<T, VEC> dg, du;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gv = to_float(g.v[k]);
      const float e1 = 1.0f + expf(-gv);
      const float sig = 1.0f / e1;
      const float d = to_float(dy.v[k]);
      dg.v[k] = from_float<T>(d * to_float(u.v[k]) * (sig * (1.0f + gv * (1.0f - sig))));
      du.v[k] = from_float<T>(d * (gv / e1));
    }
    store_packed<T, VEC>(dgate_up + in, dg);
    store_packed<T, VEC>(dgate_up + in + H, du);
  });
}

void check_shape(const char* op, int N, int H) {
  check(N >= 0 && H >= 0, std::string(op) + ": negative dimension (N=" + std::to_string(N) + ", H=" +
                              std::to_string(H) + ")");
}

}  // namespace

void swiglu_forward(DType dtype, void* out, const void* gate_up, int N, int H, void* stream) {
  check_shape("swiglu_forward", N, H);
  if (size_t(N) * H == 0) return;  // a zero-block grid is a launch error
  dispatch_act("swiglu_forward", dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    T* o = static_cast<T*>(out);
    const T* gu = static_cast<const T*>(gate_up);
    const size_t n = size_t(N) * H;
    if (H % V == 0 && is_aligned(out, 16) && is_aligned(gate_up, 16))
      swiglu_forward_kernel<T, V><<<grid_stride_blocks(n, size_t(kBlock) * V), kBlock, 0, as_stream(stream)>>>(
          o, gu, N, H);
    else
      swiglu_forward_kernel<T, 1><<<grid_stride_blocks(n, kBlock), kBlock, 0, as_stream(stream)>>>(o, gu, N, H);
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward(DType dtype, void* dgate_up, const void* gate_up, const void* dout, int N, int H, void* stream) {
  check_shape("swiglu_backward", N, H);
  if (size_t(N) * H == 0) return;
  dispatch_act("swiglu_backward", dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    T* d = static_cast<T*>(dgate_up);
    const T* gu = static_cast<const T*>(gate_up);
    const T* dy = static_cast<const T*>(dout);
    const size_t n = size_t(N) * H;
    if (H % V == 0 && is_aligned(dgate_up, 16) && is_aligned(gate_up, 16) && is_aligned(dout, 16))
      swiglu_backward_kernel<T, V><<<grid_stride_blocks(n, size_t(kBlock) * V), kBlock, 0, as_stream(stream)>>>(
          d, gu, dy, N, H);
    else
      swiglu_backward_kernel<T, 1><<<grid_stride_blocks(n, kBlock), kBlock, 0, as_stream(stream)>>>(d, gu, dy, N, H);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
