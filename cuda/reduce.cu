// Deterministic sums in double: sum(x) (a micro-batch's losses) and sum(x^2) (the global
// gradient norm), over f32 or bf16 input; the result a double, or rounded once to a float left on
// the device (reduce_sum_to_float: the losses, read by the host once a step).
//
// Algorithm: two passes, both with a split fixed by n alone, so the result is bitwise the
// same on every run and every GPU:
//   1. up to kPartials blocks of 256 threads walk the input in 16-byte chunks (4 f32 or 8 bf16),
//      grid-stride, each thread with kUnroll chunks in flight per step (visit_packed_chunks,
//      packed_visit.cuh, shared with the FP8 amax); a thread accumulates its
//      elements in double, in order, the block sums its threads in a fixed tree (block_sum) and
//      writes one double partial. The last n % chunk elements go to block 0's first threads.
//   2. one block sums the partials in the same fixed tree and writes the result.
// A pointer that is not 16-byte aligned (an odd slice) takes the same chunks with scalar loads,
// so the result does not depend on the alignment either. No atomics. fp64 adds cost nothing
// here: the pass is memory-bound on every GPU with a usable fp64 rate (on consumer GPUs with
// 1/64-rate fp64 it would be ALU-bound; accepted).
//
// Memory traffic (the floor): n*s bytes read (s = 4 for f32, 2 for bf16) plus 8*kPartials; e.g.
// the fp32 gradients of GPT-2 124M (124.5M elements, 498 MB) take ~118 us at 4.2 TB/s (H200),
// those of 1.5B (1.56G, 6.2 GB) ~1.5 ms. 1024 x 256 threads with 64 bytes in flight each keep
// ~16 MB in flight, several times what HBM needs to stream at full rate.
#include "cuda/cuda_common.h"
#include "cuda/packed_visit.cuh"
#include "cuda/reduce.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kPartials = 1024;  // fixed: part of what makes the sum deterministic
constexpr int kUnroll = 4;       // 16-byte chunks a thread has in flight

template <bool kSquare>
__device__ __forceinline__ double term(float x) {
  const double v = static_cast<double>(x);
  return kSquare ? v * v : v;
}

// kAligned: x is 16-byte aligned and each chunk is one load; otherwise VEC scalar loads.
template <typename T, bool kSquare, bool kAligned>
__global__ void __launch_bounds__(kBlock) partial_sums_kernel(double* partial, const T* x, size_t n) {
  constexpr int VEC = kChunkElems<T>;
  __shared__ double shared[kBlock / kWarpSize];
  double acc = 0.0;
  visit_packed_chunks<kBlock, kUnroll, kAligned>(x, n, [&](T v) { acc += term<kSquare>(to_float(v)); });
  if (blockIdx.x == 0 && threadIdx.x < n % VEC) acc += term<kSquare>(to_float(x[n / VEC * VEC + threadIdx.x]));
  acc = block_sum<kBlock>(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// R: double (the sum itself) or float (the sum rounded once, left on the device for later).
template <typename R>
__global__ void __launch_bounds__(kBlock) final_sum_kernel(R* result, const double* partial, int count) {
  __shared__ double shared[kBlock / kWarpSize];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlock) acc += partial[i];
  acc = block_sum<kBlock>(acc, shared);
  if (threadIdx.x == 0) *result = static_cast<R>(acc);
}

template <typename T, bool kSquare>
void launch_partials(double* partial, const T* x, size_t n, unsigned blocks, cudaStream_t stream) {
  if (is_aligned(x, 16))
    partial_sums_kernel<T, kSquare, true><<<blocks, kBlock, 0, stream>>>(partial, x, n);
  else
    partial_sums_kernel<T, kSquare, false><<<blocks, kBlock, 0, stream>>>(partial, x, n);
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename R>
void launch(R* result, const void* x, size_t n, bool square, double* partial, cudaStream_t stream) {
  const unsigned blocks = grid_stride_blocks(n / (16 / sizeof(T)), size_t(kBlock) * kUnroll, kPartials);
  const T* p = static_cast<const T*>(x);
  if (square)
    launch_partials<T, true>(partial, p, n, blocks, stream);
  else
    launch_partials<T, false>(partial, p, n, blocks, stream);
  final_sum_kernel<<<1, kBlock, 0, stream>>>(result, partial, static_cast<int>(blocks));
  CUDA_CHECK_LAUNCH();
}

template <typename R>
void reduce_into(DType dtype, R* result, const void* x, size_t n, bool square, void* scratch, void* stream) {
  double* partial = static_cast<double*>(scratch);
  switch (dtype) {
    case DType::f32: return launch<float>(result, x, n, square, partial, as_stream(stream));
    case DType::bf16: return launch<__nv_bfloat16>(result, x, n, square, partial, as_stream(stream));
    default:
      throw RuntimeError(std::string("reduce_sum: dtype ") + dtype_name(dtype) + " is not supported (f32 or bf16)");
  }
}

}  // namespace

size_t reduce_scratch_bytes() { return kPartials * sizeof(double); }

void reduce_sum(DType dtype, double* result, const void* x, size_t n, bool square, void* scratch, void* stream) {
  reduce_into(dtype, result, x, n, square, scratch, stream);
}

void reduce_sum_to_float(DType dtype, float* result, const void* x, size_t n, void* scratch, void* stream) {
  reduce_into(dtype, result, x, n, false, scratch, stream);
}

}  // namespace pt::gpu
