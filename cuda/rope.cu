// Rotary position embedding (Hugging Face Llama's rotate-half convention), in place on the q and
// k heads of packed q|k|v rows, forward and backward, fp32 and bf16.
//
// Computes, for each row (b, t) of qkv[B, T, row_width], each of its first rot_heads heads of HS
// (the q heads, then the k heads) and each i < HS/2:
//   angle = float(pos[t]) * inv_freq_i,  c = cos(angle),  s = sin(angle)
//   forward:  (x[i], x[i+HS/2]) <- (x[i] c - x[i+HS/2] s,  x[i+HS/2] c + x[i] s)
//   backward: the same with s -> -s (the transpose rotation)
// inv_freq_i = 1.0f / powf(theta, float(2i) / HS) is computed on the host by
// core/ops/rope_frequencies.h, the function CpuOps uses, and passed in as a kernel parameter
// (__grid_constant__: read from the constant bank, never copied), so both backends rotate by
// the same float angles. Math in fp32, one rounding to the dtype at the store.
//
// Algorithm: a grid-stride loop over (row, head group, chunk of VEC dimensions of the first half),
// the chunk fastest. The rotated heads of a row are dealt to `groups` = ceil(rot_heads /
// kHeadsPerThread) threads, thread g taking heads g, g + groups, ... (so a warp's j-th accesses
// are to neighbouring heads): it computes its chunk's VEC (c, s) pairs once, loads both halves of
// all its heads (up to kHeadsPerThread of each in flight: the loads do not wait on one another's
// stores), then rotates and stores them. (The kernel before this one walked all of a row's heads
// in one thread, one load-store round trip after another: too few threads and too little
// memory in flight at Llama shapes.) Each head's two halves are moved with one 16-byte
// load/store each (4 fp32 or 8 bf16) when HS/2 and row_width are multiples of the chunk and qkv
// is 16-byte aligned; otherwise a VEC=1 instantiation uses scalar accesses.
// Why double sin/cos: under --use_fast_math (the target's flag) sinf/cosf become sin.approx/
// cos.approx, accurate only near [-pi, pi]: their argument reduction is in low precision, so the
// error grows with |angle|, and positions in the thousands give angles in the thousands of
// radians. The double routines (untouched by fast math) reduce the argument accurately and,
// rounded to float, give the (all but always correctly rounded) cosf/sinf that CpuOps's
// std::cos/std::sin return. They cost one double sincos per dimension pair and head group
// (HS/2 ceil(rot_heads / 4) per row): one per 32 bytes moved in bf16, ~2 FP64 flops per byte at
// most, far below an H100's FP64 roof (~20 per byte): the kernel stays memory-bound.
//
// Memory traffic (s = 4 for fp32, 2 for bf16), the floor the kernel should approach:
//   read + write B*T*rot_heads*HS*s each (+ 4T for pos)   = 2 B T rot_heads HS s bytes
// e.g. TinyLlama 1.1B (32 q heads, 4 kv heads, HS = 64: rot_heads = 36), B*T = 8*1024, bf16:
// 75.5 MB, ~23 us at 3.35 TB/s (H100 SXM). v (4 heads here) is never touched.
// Deterministic: each element is written by one thread, no reductions.
#include <string>

#include "core/ops/rope_frequencies.h"
#include "cuda/cuda_common.h"
#include "cuda/rope.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kMaxHalf = 256;  // head sizes up to 512: a 1 KB parameter table

struct RopeFreqs {
  float inv_freq[kMaxHalf];
};

constexpr int kHeadsPerThread = 4;

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock)
    rope_kernel(T* qkv, const int32_t* pos, size_t rows, int seq, int row_width, int rot_heads, int HS, float sign,
                const __grid_constant__ RopeFreqs f) {
  const int half = HS / 2;
  const int chunks = half / VEC, groups = ceil_div(rot_heads, kHeadsPerThread);
  const size_t n = rows * groups * chunks;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int i0 = static_cast<int>(idx % chunks) * VEC;
    const int group = static_cast<int>(idx / chunks % groups);
    const size_t row = idx / chunks / groups;
    const float p = static_cast<float>(pos[row % seq]);
    float c[VEC], s[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float angle = p * f.inv_freq[i0 + k];  // one float multiply, as PyTorch and CpuOps
      double sd, cd;
      sincos(static_cast<double>(angle), &sd, &cd);
      c[k] = static_cast<float>(cd);
      s[k] = sign * static_cast<float>(sd);
    }
    T* lo = qkv + row * row_width + static_cast<size_t>(group) * HS + i0;
    const size_t head_step = static_cast<size_t>(groups) * HS;
    Packed<T, VEC> a[kHeadsPerThread], b[kHeadsPerThread];
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j)
      if (group + j * groups < rot_heads) {
        a[j] = load_packed<T, VEC>(lo + j * head_step);
        b[j] = load_packed<T, VEC>(lo + j * head_step + half);
      }
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j)
      if (group + j * groups < rot_heads) {
        Packed<T, VEC> ra, rb;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float x = to_float(a[j].v[k]), y = to_float(b[j].v[k]);
          ra.v[k] = from_float<T>(x * c[k] - y * s[k]);
          rb.v[k] = from_float<T>(y * c[k] + x * s[k]);
        }
        store_packed<T, VEC>(lo + j * head_step, ra);
        store_packed<T, VEC>(lo + j * head_step + half, rb);
      }
  }
}

// sign = +1: forward; -1: backward.
void rope(const char* op, DType dtype, void* qkv, const int32_t* pos, int B, int T, int row_width, int rot_heads,
          int HS, float theta, float sign, void* stream) {
  const std::string bad = rope_shape_error(B, T, row_width, rot_heads, HS, theta);
  check(bad.empty(), std::string(op) + ": " + bad);
  const int half = HS / 2;
  check(half <= kMaxHalf, std::string(op) + ": head size HS=" + std::to_string(HS) + " exceeds the kernel's " +
                              std::to_string(2 * kMaxHalf));
  const size_t rows = size_t(B) * T;
  if (rows == 0 || rot_heads == 0) return;  // a zero-block grid is a launch error
  check(qkv != nullptr && pos != nullptr, std::string(op) + ": a required device pointer is null");
  RopeFreqs f{};
  for (int i = 0; i < half; ++i) f.inv_freq[i] = rope_inv_freq(i, HS, theta);
  dispatch_act(op, dtype, [&](auto tag) {
    using E = decltype(tag);
    constexpr int V = 16 / sizeof(E);
    E* x = static_cast<E*>(qkv);
    cudaStream_t s = as_stream(stream);
    const size_t groups = ceil_div(rot_heads, kHeadsPerThread);
    if (half % V == 0 && row_width % V == 0 && is_aligned(qkv, 16))
      rope_kernel<E, V><<<grid_stride_blocks(rows * groups * (half / V), kBlock), kBlock, 0, s>>>(
          x, pos, rows, T, row_width, rot_heads, HS, sign, f);
    else
      rope_kernel<E, 1><<<grid_stride_blocks(rows * groups * half, kBlock), kBlock, 0, s>>>(
          x, pos, rows, T, row_width, rot_heads, HS, sign, f);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_forward(DType dtype, void* qkv, const int32_t* pos, int B, int T, int row_width, int rot_heads, int HS,
                  float theta, void* stream) {
  rope("rope_forward", dtype, qkv, pos, B, T, row_width, rot_heads, HS, theta, 1.0f, stream);
}

void rope_backward(DType dtype, void* dqkv, const int32_t* pos, int B, int T, int row_width, int rot_heads, int HS,
                   float theta, void* stream) {
  rope("rope_backward", dtype, dqkv, pos, B, T, row_width, rot_heads, HS, theta, -1.0f, stream);
}

}  // namespace pt::gpu
