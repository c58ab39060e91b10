// GELU, tanh approximation (GPT-2 / llm.c), forward and backward, fp32 and bf16.
//
// Computes
//   forward:  out  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   backward: dinp = dout * [0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)]
//             (overwritten: the one gradient of the fc activation, Ops::gelu_backward)
// with bf16 tensors stored as bf16 and all math in fp32 (one rounding, at the store).
//
// Algorithm: a pure elementwise map. Each thread owns one 16-byte chunk (4 fp32 or 8 bf16) and
// moves it with 128-bit loads/stores, so every warp request is 512 contiguous bytes. One chunk
// per thread (no grid-stride loop) keeps the kernel trivial; at 256 threads per block even a
// 10^9-element tensor is well inside the grid limit. The last chunk, when n is not a multiple of
// the chunk, is finished by its thread with scalar accesses. When any pointer is not 16-byte
// aligned (a slice at an odd offset), a VEC=1 instantiation does everything with scalar
// accesses: correct, slower, never used by the model's own buffers.
// The tanh is evaluated through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) =: sig:
//   gelu(x) = x * sig,   gelu'(x) = sig * (1 + 2 x (1 - sig) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
// (using 1 - tanh^2 = 4 sig (1 - sig); sig and 1 - sig both come from exp(-2|u|), see
// gelu_sigmoid, so neither overflows nor cancels).
// Why not tanhf: under --use_fast_math (the target's flag) nvcc 13 lowers tanhf to
// tanh.approx.f32, whose ~2^-11 relative error would break the 1e-5 fp32 agreement with
// CpuOps. expf becomes ex2.approx (a few ulp) and the division div.approx (2 ulp), which keeps
// fp32 results within ~1e-6 of the reference. In saturation (large |u|) the exp underflows to
// 0 and gelu returns exactly x (u > 0) or -0 (u < 0), and the gradient 1 or 0.
//
// Memory traffic (s = 4 for fp32, 2 for bf16), the floor the kernel should approach:
//   forward:  read n*s + write n*s                       = 2 n s bytes
//   backward: read inp, dout + write dinp                = 3 n s bytes
// e.g. GPT-2 124M fc activations, B*T = 8*1024, 4C = 3072, bf16: forward 100.7 MB, backward
// 151.0 MB, i.e. ~30 us / ~45 us at 3.35 TB/s (H100 SXM). The math is ~10 (fwd) / ~20 (bwd)
// fp32 operations per element, two of them on the special-function unit (ex2, rcp): far below
// the FLOP floor, so both kernels are memory-bound on A100 and H100.
// Deterministic: no reductions, no atomics.
#include "cuda/cuda_common.h"
#include "cuda/gelu.h"

namespace pt::gpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr int kBlock = 256;

// sig = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh(u)) and 1 - sig, for u = sqrt(2/pi) (x + 0.044715 x^3).
// Both come from e = exp(-2|u|) <= 1, which cannot overflow (exp(-2u) would for u < -44, and
// the inf * 0 that follows is a NaN), and the smaller of the two is a product, not 1 - (~1).
struct GeluSigmoid {
  float sig, one_minus_sig;
};

__device__ __forceinline__ GeluSigmoid gelu_sigmoid(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float e = expf(-2.0f * fabsf(u));
  float big = 1.0f / (1.0f + e);  // sigmoid(2|u|), in [0.5, 1]
  float small = e * big;          // sigmoid(-2|u|) = 1 - big
  return u >= 0.0f ? GeluSigmoid{big, small} : GeluSigmoid{small, big};
}

__device__ __forceinline__ float gelu(float x) { return x * gelu_sigmoid(x).sig; }

__device__ __forceinline__ float gelu_grad(float x) {
  GeluSigmoid s = gelu_sigmoid(x);
  return s.sig * (1.0f + 2.0f * x * s.one_minus_sig * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) gelu_forward_kernel(T* out, const T* inp, size_t n) {
  size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  if (i + VEC <= n) {
    Packed<T, VEC> x = load_packed<T, VEC>(inp + i);
    Packed<T, VEC> y;
#pragma unroll
    for (int k = 0; k < VEC; ++k) y.v[k] = from_float<T>(gelu(to_float(x.v[k])));
    store_packed<T, VEC>(out + i, y);
  } else {
    for (size_t j = i; j < n; ++j) out[j] = from_float<T>(gelu(to_float(inp[j])));  // partial last chunk
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  if (i + VEC <= n) {
    Packed<T, VEC> x = load_packed<T, VEC>(inp + i);
    Packed<T, VEC> g = load_packed<T, VEC>(dout + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g.v[k] = from_float<T>(gelu_grad(to_float(x.v[k])) * to_float(g.v[k]));
    store_packed<T, VEC>(dinp + i, g);
  } else {
    for (size_t j = i; j < n; ++j) dinp[j] = from_float<T>(gelu_grad(to_float(inp[j])) * to_float(dout[j]));
  }
}

// Blocks needed for n elements in chunks of VEC; throws before a launch the grid cannot hold.
template <int VEC>
unsigned grid_for(size_t n, const char* op) {
  size_t blocks = ceil_div(ceil_div(n, static_cast<size_t>(VEC)), static_cast<size_t>(kBlock));
  check(blocks <= 0x7fffffffu, std::string(op) + ": " + std::to_string(n) + " elements exceed one launch's grid");
  return static_cast<unsigned>(blocks);
}

template <typename T>
void launch_forward(void* out, const void* inp, size_t n, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(inp);
  if (is_aligned(out, 16) && is_aligned(inp, 16)) {
    gelu_forward_kernel<T, V><<<grid_for<V>(n, "gelu_forward"), kBlock, 0, stream>>>(o, x, n);
  } else {
    gelu_forward_kernel<T, 1><<<grid_for<1>(n, "gelu_forward"), kBlock, 0, stream>>>(o, x, n);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_backward(void* dinp, const void* inp, const void* dout, size_t n, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  T* d = static_cast<T*>(dinp);
  const T* x = static_cast<const T*>(inp);
  const T* g = static_cast<const T*>(dout);
  if (is_aligned(dinp, 16) && is_aligned(inp, 16) && is_aligned(dout, 16)) {
    gelu_backward_kernel<T, V><<<grid_for<V>(n, "gelu_backward"), kBlock, 0, stream>>>(d, x, g, n);
  } else {
    gelu_backward_kernel<T, 1><<<grid_for<1>(n, "gelu_backward"), kBlock, 0, stream>>>(d, x, g, n);
  }
  CUDA_CHECK_LAUNCH();
}

[[noreturn]] void unsupported(const char* op, DType dtype) {
  throw RuntimeError(std::string(op) + ": dtype " + dtype_name(dtype) + " is not supported (f32 or bf16)");
}

}  // namespace

void gelu_forward(DType dtype, void* out, const void* inp, size_t n, void* stream) {
  if (n == 0) return;  // a zero-block grid is a launch error
  switch (dtype) {
    case DType::f32: return launch_forward<float>(out, inp, n, as_stream(stream));
    case DType::bf16: return launch_forward<__nv_bfloat16>(out, inp, n, as_stream(stream));
    default: unsupported("gelu_forward", dtype);
  }
}

void gelu_backward(DType dtype, void* dinp, const void* inp, const void* dout, size_t n, void* stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32: return launch_backward<float>(dinp, inp, dout, n, as_stream(stream));
    case DType::bf16: return launch_backward<__nv_bfloat16>(dinp, inp, dout, n, as_stream(stream));
    default: unsupported("gelu_backward", dtype);
  }
}

}  // namespace pt::gpu
