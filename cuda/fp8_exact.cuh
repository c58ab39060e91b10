// The exact float steps of the FP8 casts on the device, so that codes equal CpuOps' bit for bit
// under the targets' --use_fast_math (-ftz=true, which flushes a subnormal float to zero wherever
// fp32 arithmetic touches it): a bf16 read as a float by a shift, a magnitude as integer bits, and
// the scaling as an explicit non-.ftz multiply. Used by the linear layers' casts (fp8_cast.cu) and
// the FP8 attention casts (attention_fp8_cast.cu). Device code only.
#pragma once
#include <cstdint>

#include "core/common/fp8.h"
#include "cuda/cuda_common.h"

namespace pt::gpu::fp8x {

// The element as a float, exact for subnormals whatever -ftz says (bf16 -> f32 is a shift).
__device__ __forceinline__ float exact_float(float x) { return x; }
__device__ __forceinline__ float exact_float(__nv_bfloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16);
}

// |x| as the bits of a non-negative float: integer order is value order (NaNs above infinity).
__device__ __forceinline__ uint32_t magnitude_bits(float x) { return fp8_magnitude_bits(x); }
__device__ __forceinline__ uint32_t magnitude_bits(__nv_bfloat16 x) {
  return (static_cast<uint32_t>(__bfloat16_as_ushort(x)) & 0x7fffu) << 16;
}

// x * s rounded to nearest, subnormals kept (mul.rn.f32 without .ftz). With s a power of two it is
// exact unless it overflows (fp8_encode saturates) or underflows.
__device__ __forceinline__ float mul_keep_subnormals(float x, float s) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(s));
  return r;
}

// x's code in format F at scale s: CpuOps' fp8_encode(x * s), bit for bit.
template <Fp8Format F, typename T>
__device__ __forceinline__ uint32_t encode(T x, float s) {
  return fp8_encode(mul_keep_subnormals(exact_float(x), s), F);
}

}  // namespace pt::gpu::fp8x
