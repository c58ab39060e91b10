// Shared helpers for the CUDA backend's own sources (cuda/*.cu and cuda/*.cpp). It includes the
// CUDA runtime headers, so code outside cuda/ never includes it: g++-compiled code uses the
// CUDA-free headers (cuda_backend.h, cuda_memory.h, gelu.h, layernorm.h) instead.
//
//  - CUDA_CHECK(expr): a failed runtime call becomes a pt::RuntimeError naming file:line, the
//    call and CUDA's own error name and string, so main() prints one actionable line instead of
//    the process dying inside a kernel launcher.
//  - ceil_div, alignment test.
//  - Device-side dtype helpers (only under nvcc): fp32 <-> bf16 conversion and Packed<T, VEC>,
//    a chunk of VEC elements loaded/stored with one instruction (128-bit when VEC*sizeof(T)==16),
//    which is what lets memory-bound kernels reach DRAM bandwidth.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/common/error.h"
#include "core/tensor/tensor.h"

namespace pt {

// The cold path of CUDA_CHECK: builds the message and throws. A failed call also leaves its
// error as the thread's "last error", which the next CUDA_CHECK_LAUNCH would report against an
// innocent kernel (seen on the first GPU run: a failed copy blamed on the next convert launch in
// another test section): reading it here clears it. Sticky errors (a faulted context) stay.
[[noreturn]] inline void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                     cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace pt

#define CUDA_CHECK(expr)                                                                                \
  do {                                                                                                  \
    cudaError_t pt_cuda_err_ = (expr);                                                                  \
    if (pt_cuda_err_ != cudaSuccess) ::pt::cuda_fail(pt_cuda_err_, #expr, __FILE__, __LINE__);          \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site. (Errors that
// happen while the kernel runs surface at the next synchronising call.)
#define CUDA_CHECK_LAUNCH()                                                                             \
  do {                                                                                                  \
    cudaError_t pt_cuda_err_ = cudaGetLastError();                                                      \
    if (pt_cuda_err_ != cudaSuccess) ::pt::cuda_fail(pt_cuda_err_, "kernel launch", __FILE__, __LINE__); \
  } while (0)

namespace pt {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  static_assert(std::is_integral_v<T>, "ceil_div is for integers");
  return (a + b - 1) / b;
}

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

constexpr int kWarpSize = 32;

#ifdef __CUDACC__

// ---- dtype helpers: storage in T, math in fp32 ----------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
// Round to nearest even, the same rounding the host-side references use.
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- packed loads/stores ---------------------------------------------------------------------
// VEC elements of T. With VEC * sizeof(T) == 16 a load is one LDG.128 (the address must be
// 16-byte aligned: callers check the base pointers and pick VEC = 1 otherwise). Going through
// int4 rather than copying the struct guarantees the single wide instruction: a struct of
// __nv_bfloat16 (a class type) may otherwise be copied element by element.
template <typename T, int VEC>
struct Packed {
  static_assert(VEC == 1 || VEC * sizeof(T) == 16, "Packed is either one element or 16 bytes");
  alignas(VEC * sizeof(T)) T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Packed<T, VEC> load_packed(const T* p) {
  Packed<T, VEC> r;
  if constexpr (VEC == 1) {
    r.v[0] = *p;
  } else {
    *reinterpret_cast<int4*>(r.v) = *reinterpret_cast<const int4*>(p);
  }
  return r;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_packed(T* p, const Packed<T, VEC>& x) {
  if constexpr (VEC == 1) {
    *p = x.v[0];
  } else {
    *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(x.v);
  }
}

// Sum over the 32 lanes of a warp; every lane gets the result. The butterfly order is fixed, so
// the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Maximum over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32, at most 1024); every thread gets the
// result. Fixed order (warp butterflies, then warp 0 over the warp sums), so deterministic.
// `shared` holds kThreads / 32 values of T; the call waits at a barrier before it writes
// `shared`, so consecutive calls may use one buffer. Every thread of the block must call it.
template <int kThreads, typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block_sum: whole warps, at most 1024 threads");
  constexpr int kWarps = kThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = shared[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total += shared[w];
  return total;
}

// Whether rows of C elements of T at every pointer in `ptrs` can be moved in 16-byte chunks: C a
// multiple of the chunk and every pointer 16-byte aligned (else a kernel takes its scalar path).
template <typename T>
bool vec16_ok(int C, std::initializer_list<const void*> ptrs) {
  if (C % (16 / sizeof(T)) != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned(p, 16)) return false;
  return true;
}

// Calls f(T{}, G{}) with the element types of the (activation, parameter-gradient) dtype pair:
// f32/f32 (fp32 compute), bf16/f32 (bf16 compute, fp32 gradients: the model's layout) and
// bf16/bf16. Any other pair throws, naming the op.
// Throws, naming the op, unless dispatch_act_grad takes the pair: so that a launcher can refuse
// a call before its first launch has written anything.
inline void check_act_grad(const char* op, DType act, DType grad) {
  const bool ok = (act == DType::f32 && grad == DType::f32) || (act == DType::bf16 && grad == DType::f32) ||
                  (act == DType::bf16 && grad == DType::bf16);
  if (!ok)
    throw RuntimeError(std::string(op) + ": activations in " + dtype_name(act) + " with gradients in " +
                       dtype_name(grad) + " are not supported (f32/f32, bf16/f32 or bf16/bf16)");
}

template <typename F>
void dispatch_act_grad(const char* op, DType act, DType grad, F&& f) {
  check_act_grad(op, act, grad);
  if (act == DType::f32 && grad == DType::f32) return f(float{}, float{});
  if (act == DType::bf16 && grad == DType::f32) return f(__nv_bfloat16{}, float{});
  return f(__nv_bfloat16{}, __nv_bfloat16{});  // bf16/bf16, the last pair check_act_grad lets through
}

// Calls f(T{}) with the element type of an activation dtype (f32 or bf16); others throw.
template <typename F>
void dispatch_act(const char* op, DType act, F&& f) {
  if (act == DType::f32) return f(float{});
  if (act == DType::bf16) return f(__nv_bfloat16{});
  throw RuntimeError(std::string(op) + ": dtype " + dtype_name(act) + " is not supported (f32 or bf16)");
}

#endif  // __CUDACC__

// Blocks for `n` work items of `per_block` each, capped for a grid-stride loop: kernels that
// use it loop over the remainder, so any n fits in one launch and the split is a function of n
// alone (which keeps reductions deterministic across devices).
inline unsigned grid_stride_blocks(size_t n, size_t per_block, size_t cap = 65535) {
  size_t blocks = (n + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

// The most dynamic shared memory one block of the current device may use (after opting in).
int max_dynamic_shared_bytes();

// Lets `kernel` launch with `bytes` of dynamic shared memory: above the 48 KB every kernel may use
// without asking, it opts in, or throws "<describe()> needs N bytes of shared memory per block,
// more than this GPU's M" when the device allows less (describe() runs only then).
template <typename Kernel, typename Describe>
void use_dynamic_shared(Kernel kernel, size_t bytes, Describe describe) {
  if (bytes <= size_t(48) * 1024) return;
  const int limit = max_dynamic_shared_bytes();
  if (bytes > static_cast<size_t>(limit))
    throw RuntimeError(std::string(describe()) + " needs " + std::to_string(bytes) +
                       " bytes of shared memory per block, more than this GPU's " + std::to_string(limit));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace pt
