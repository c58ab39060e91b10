// The grid-stride read loop of the whole-tensor reductions, shared by the FP8 amax
// (fp8_cast.cu, amax_kernel) and the deterministic sums (reduce.cu, partial_sums_kernel), so the
// loop that keeps HBM busy is written once. Device code only.
//
// visit_packed_chunks walks x's n / VEC full 16-byte chunks (VEC = 4 f32 or 8 bf16), grid-stride,
// each thread with kUnroll chunks in flight: thread t of block b starts at chunk
// b * kBlock * kUnroll + t, takes chunks first + u * kBlock (u < kUnroll) per step and strides
// by gridDim.x * kBlock * kUnroll. All of a step's loads are issued before any of their
// elements is used (the memory-level parallelism the kernels rely on); then f(element) is called
// for chunk u = 0, 1, ... in turn and within a chunk for k = 0 .. VEC-1, so an order-dependent
// accumulation (reduce.cu's sums in double) sees a fixed order. kAligned: x is 16-byte aligned
// and a chunk is one 16-byte load (load_packed); otherwise VEC scalar loads of the same chunk, so
// the elements and their order do not depend on the alignment. The last n % VEC elements are the
// caller's, as are the block's reduction and the launch (kBlock threads per block).
#pragma once
#include <cstddef>

#include "cuda/cuda_common.h"

namespace pt::gpu {

// Elements per 16-byte chunk of T.
template <typename T>
inline constexpr int kChunkElems = 16 / sizeof(T);

template <int kBlock, int kUnroll, bool kAligned, typename T, typename F>
__device__ __forceinline__ void visit_packed_chunks(const T* x, size_t n, F&& f) {
  constexpr int VEC = kChunkElems<T>;
  const size_t chunks = n / VEC;
  const size_t step = static_cast<size_t>(gridDim.x) * kBlock * kUnroll;
  for (size_t first = static_cast<size_t>(blockIdx.x) * kBlock * kUnroll + threadIdx.x; first < chunks;
       first += step) {
    Packed<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t chunk = first + static_cast<size_t>(u) * kBlock;
      if (chunk >= chunks) continue;
      if constexpr (kAligned) {
        v[u] = load_packed<T, VEC>(x + chunk * VEC);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[u].v[k] = x[chunk * VEC + k];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (first + static_cast<size_t>(u) * kBlock < chunks)
#pragma unroll
        for (int k = 0; k < VEC; ++k) f(v[u].v[k]);
  }
}

}  // namespace pt::gpu
