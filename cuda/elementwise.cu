// Elementwise kernels: add, scale, dtype conversion (the casts behind upload/download/copy) and
// the broadcast bias add (used only when cuBLASLt cannot fuse a bias).
//
// Computes
//   add:      out = a + b          scale: x *= s
//   convert:  dst = (Tout) src     (f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact)
//   add_bias_rows: out[r, c] += bias[c]
// with all math in fp32 and one rounding at the store.
//
// Algorithm: a grid-stride loop over 16-byte chunks (4 fp32 or 8 bf16 per thread and step), so
// every warp request is 512 contiguous bytes; when a pointer is not 16-byte aligned (a slice at
// an odd offset) a VEC=1 instantiation does the same with scalar accesses. The last partial
// chunk is finished element by element. The grid is capped (grid_stride_blocks), so any n fits
// one launch. No reductions, no atomics: deterministic.
// convert moves quads of 4 elements (16 bytes of f32, 8 of bf16: each warp access is contiguous
// on both sides), 64 bytes of source per thread and step (4 f32 or 8 bf16 quads), all loaded
// before any is stored, so they are in flight together. When src and dst do not start at a quad
// boundary, the `head` elements before the first one (the same count on both sides: an odd slice
// of two equally aligned buffers) and the last (n - head) % 4 go one per thread; if the two sides
// lie at different offsets from a quad boundary, a scalar grid-stride loop converts everything.
//
// Memory traffic (s = bytes per element), the floor each should approach:
//   add 3ns, scale 2ns, convert n(s_in + s_out), add_bias_rows 2*rows*cols*s.
// All are memory-bound (1 FLOP per element): e.g. the residual add of GPT-2 124M at B*T = 8192,
// C = 768 in bf16 moves 37.7 MB, ~11 us at 3.35 TB/s (H100 SXM); casting its 124.5M parameters
// between f32 and bf16 moves 747 MB, ~178 us at 4.2 TB/s (H200).
#include "cuda/cuda_common.h"
#include "cuda/elementwise.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) add_kernel(T* out, const T* a, const T* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * VEC;
  for (size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    if (i + VEC <= n) {
      Packed<T, VEC> x = load_packed<T, VEC>(a + i), y = load_packed<T, VEC>(b + i), z;
#pragma unroll
      for (int k = 0; k < VEC; ++k) z.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
      store_packed<T, VEC>(out + i, z);
    } else {
      for (size_t j = i; j < n; ++j) out[j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) scale_kernel(T* x, float s, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * VEC;
  for (size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    if (i + VEC <= n) {
      Packed<T, VEC> v = load_packed<T, VEC>(x + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v.v[k] = from_float<T>(to_float(v.v[k]) * s);
      store_packed<T, VEC>(x + i, v);
    } else {
      for (size_t j = i; j < n; ++j) x[j] = from_float<T>(to_float(x[j]) * s);
    }
  }
}

// Four consecutive elements, moved with one access (16 bytes of f32, 8 of bf16).
template <typename T>
struct Quad {
  alignas(4 * sizeof(T)) T v[4];
};

template <typename T>
__device__ __forceinline__ Quad<T> load_quad(const T* p) {
  using Raw = std::conditional_t<sizeof(T) == 4, int4, int2>;
  Quad<T> q;
  *reinterpret_cast<Raw*>(q.v) = *reinterpret_cast<const Raw*>(p);
  return q;
}

template <typename T>
__device__ __forceinline__ void store_quad(T* p, const Quad<T>& q) {
  using Raw = std::conditional_t<sizeof(T) == 4, int4, int2>;
  *reinterpret_cast<Raw*>(p) = *reinterpret_cast<const Raw*>(q.v);
}

// Quads a thread has in flight: 64 bytes of source.
template <typename Tin>
constexpr int kConvertUnroll = 64 / (4 * sizeof(Tin));

// src + head and dst + head are quad-aligned: elements [0, head) and the last (n - head) % 4 go one
// per thread of block 0, the quads in between kConvertUnroll per thread and step.
template <typename Tout, typename Tin>
__global__ void __launch_bounds__(kBlock) convert_quads_kernel(Tout* dst, const Tin* src, size_t n, size_t head) {
  constexpr int kUnroll = kConvertUnroll<Tin>;
  const size_t quads = (n - head) / 4;
  const Tin* qsrc = src + head;
  Tout* qdst = dst + head;
  const size_t step = static_cast<size_t>(gridDim.x) * kBlock * kUnroll;
  for (size_t first = static_cast<size_t>(blockIdx.x) * kBlock * kUnroll + threadIdx.x; first < quads;
       first += step) {
    Quad<Tin> in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t q = first + static_cast<size_t>(u) * kBlock;
      if (q < quads) in[u] = load_quad(qsrc + 4 * q);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t q = first + static_cast<size_t>(u) * kBlock;
      if (q >= quads) continue;
      Quad<Tout> out;
#pragma unroll
      for (int k = 0; k < 4; ++k) out.v[k] = from_float<Tout>(to_float(in[u].v[k]));
      store_quad(qdst + 4 * q, out);
    }
  }
  if (blockIdx.x != 0) return;
  const size_t tail = head + 4 * quads + threadIdx.x;
  if (threadIdx.x < head) dst[threadIdx.x] = from_float<Tout>(to_float(src[threadIdx.x]));
  if (tail < n) dst[tail] = from_float<Tout>(to_float(src[tail]));
}

// The fallback when src and dst are not equally far from a quad boundary: one element per thread
// and step.
template <typename Tout, typename Tin>
__global__ void __launch_bounds__(kBlock) convert_kernel(Tout* dst, const Tin* src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = from_float<Tout>(to_float(src[i]));
}

template <typename T>
__global__ void __launch_bounds__(kBlock) add_bias_rows_kernel(T* out, const T* bias, int rows, int cols) {
  const size_t n = static_cast<size_t>(rows) * cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % cols]));
}

template <typename T>
void launch_add(void* out, const void* a, const void* b, size_t n, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (is_aligned(out, 16) && is_aligned(a, 16) && is_aligned(b, 16))
    add_kernel<T, V><<<grid_stride_blocks(n, size_t(kBlock) * V), kBlock, 0, stream>>>(o, x, y, n);
  else
    add_kernel<T, 1><<<grid_stride_blocks(n, kBlock), kBlock, 0, stream>>>(o, x, y, n);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_scale(void* x, float s, size_t n, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (is_aligned(x, 16))
    scale_kernel<T, V><<<grid_stride_blocks(n, size_t(kBlock) * V), kBlock, 0, stream>>>(static_cast<T*>(x), s, n);
  else
    scale_kernel<T, 1><<<grid_stride_blocks(n, kBlock), kBlock, 0, stream>>>(static_cast<T*>(x), s, n);
  CUDA_CHECK_LAUNCH();
}

// Elements from p to the next quad boundary (p is element-aligned).
template <typename T>
size_t quad_lead(const void* p) {
  constexpr size_t kQuadBytes = 4 * sizeof(T);
  return (kQuadBytes - reinterpret_cast<uintptr_t>(p) % kQuadBytes) % kQuadBytes / sizeof(T);
}

template <typename Tout, typename Tin>
void launch_convert(void* dst, const void* src, size_t n, cudaStream_t stream) {
  Tout* d = static_cast<Tout*>(dst);
  const Tin* s = static_cast<const Tin*>(src);
  const size_t head = quad_lead<Tin>(src);
  if (head == quad_lead<Tout>(dst) && head <= n) {
    const size_t quads = (n - head) / 4;
    convert_quads_kernel<Tout, Tin>
        <<<grid_stride_blocks(quads, size_t(kBlock) * kConvertUnroll<Tin>), kBlock, 0, stream>>>(d, s, n, head);
  } else {
    convert_kernel<Tout, Tin><<<grid_stride_blocks(n, kBlock), kBlock, 0, stream>>>(d, s, n);
  }
  CUDA_CHECK_LAUNCH();
}

[[noreturn]] void unsupported(const char* op, DType dtype) {
  throw RuntimeError(std::string(op) + ": dtype " + dtype_name(dtype) + " is not supported (f32 or bf16)");
}

}  // namespace

void add(DType dtype, void* out, const void* a, const void* b, size_t n, void* stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32: return launch_add<float>(out, a, b, n, as_stream(stream));
    case DType::bf16: return launch_add<__nv_bfloat16>(out, a, b, n, as_stream(stream));
    default: unsupported("add", dtype);
  }
}

void scale(DType dtype, void* x, float s, size_t n, void* stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32: return launch_scale<float>(x, s, n, as_stream(stream));
    case DType::bf16: return launch_scale<__nv_bfloat16>(x, s, n, as_stream(stream));
    default: unsupported("scale", dtype);
  }
}

void convert(DType dst_dtype, void* dst, DType src_dtype, const void* src, size_t n, void* stream) {
  if (n == 0) return;
  cudaStream_t s = as_stream(stream);
  if (dst_dtype == src_dtype) {
    if (dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(dst_dtype), cudaMemcpyDeviceToDevice, s));
    return;
  }
  using bf = __nv_bfloat16;
  if (dst_dtype == DType::bf16 && src_dtype == DType::f32) return launch_convert<bf, float>(dst, src, n, s);
  if (dst_dtype == DType::f32 && src_dtype == DType::bf16) return launch_convert<float, bf>(dst, src, n, s);
  throw RuntimeError(std::string("convert: no conversion from ") + dtype_name(src_dtype) + " to " +
                     dtype_name(dst_dtype) + " (f32 <-> bf16 only)");
}

void add_bias_rows(DType dtype, void* out, const void* bias, int rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  const size_t n = static_cast<size_t>(rows) * cols;
  switch (dtype) {
    case DType::f32:
      add_bias_rows_kernel<float><<<grid_stride_blocks(n, kBlock), kBlock, 0, as_stream(stream)>>>(
          static_cast<float*>(out), static_cast<const float*>(bias), rows, cols);
      break;
    case DType::bf16:
      add_bias_rows_kernel<__nv_bfloat16><<<grid_stride_blocks(n, kBlock), kBlock, 0, as_stream(stream)>>>(
          static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(bias), rows, cols);
      break;
    default: unsupported("add_bias_rows", dtype);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
