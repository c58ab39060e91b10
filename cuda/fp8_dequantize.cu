// FP8 decoding: out[i] = value(q[i]) * scale_inv[0], the codes of one tensor (f8e4m3 or f8e5m2)
// back to f32 or bf16. ZeRO-3's FP8 weight gather (core/train/param_gather.h) decodes the codes
// it gathered into the layer's working buffer with it.
//
// Computes (core/common/fp8.h): fp8_decode(code) is exact in f32 (every FP8 value is), and the
// power-of-two scale_inv keeps it exact wherever the product is a normal float (the scales are
// within 2^+-126, so only a tensor whose largest value is below ~2^-117 could lose bits); f32 ->
// bf16 rounding is exact too, since an FP8 value's 2 or 3 mantissa bits fit bf16's 7. So the
// result is bit for bit CpuOps' (which computes the same product).
//
// Algorithm: a grid-stride loop, 4 codes per thread per iteration (one 4-byte load when q is
// 4-byte aligned; scalar otherwise and for the tail), each decoded by fp8_decode's integer
// arithmetic (no table), scaled, and stored.
//
// Memory traffic (the floor): n bytes read, n * (2 or 4) written: for a 1600 x 6400 layer (10.2M
// values) 31 MB from bf16, ~10 us at 3.35 TB/s (H100 SXM); it runs once per layer per gather.
#include <cstdint>

#include "core/common/fp8.h"
#include "cuda/cuda_common.h"
#include "cuda/fp8_dequantize.h"

namespace pt::gpu {
namespace {

template <class T>
__global__ void dequantize_kernel(T* out, const uint8_t* q, Fp8Format f, const float* scale_inv, size_t n) {
  const float s = *scale_inv;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(q) & 3) == 0;
  const size_t words = aligned ? n / 4 : 0;
  for (size_t w = first; w < words; w += stride) {
    const uint32_t four = reinterpret_cast<const uint32_t*>(q)[w];
#pragma unroll
    for (int k = 0; k < 4; k++) out[4 * w + k] = from_float<T>(fp8_decode((four >> (8 * k)) & 0xffu, f) * s);
  }
  for (size_t i = 4 * words + first; i < n; i += stride) out[i] = from_float<T>(fp8_decode(q[i], f) * s);
}

template <class T>
void launch(T* out, const uint8_t* q, Fp8Format f, const float* scale_inv, size_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t blocks = std::min<size_t>((n / 4 + kThreads - 1) / kThreads + 1, 65535 * 8);
  dequantize_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, q, f, scale_inv, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_dequantize(DType out_dtype, void* out, DType q_dtype, const void* q, const float* scale_inv, size_t n,
                    void* stream) {
  check(q_dtype == DType::f8e4m3 || q_dtype == DType::f8e5m2,
        std::string("fp8_dequantize: codes of dtype ") + dtype_name(q_dtype) + " (f8e4m3 or f8e5m2)");
  if (n == 0) return;
  const Fp8Format f = q_dtype == DType::f8e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
  const auto* codes = static_cast<const uint8_t*>(q);
  const auto st = static_cast<cudaStream_t>(stream);
  switch (out_dtype) {
    case DType::f32: return launch(static_cast<float*>(out), codes, f, scale_inv, n, st);
    case DType::bf16: return launch(static_cast<__nv_bfloat16*>(out), codes, f, scale_inv, n, st);
    default: throw RuntimeError(std::string("fp8_dequantize: output dtype ") + dtype_name(out_dtype) + " (f32 or bf16)");
  }
}

}  // namespace pt::gpu
