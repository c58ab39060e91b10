// Building blocks of the bf16 tensor-core flash attention (flash_attention_forward.cu,
// flash_attention_backward.cu): the mma.sync.m16n8k16 bf16 -> fp32 instruction, loads of its
// operand fragments from shared memory, and the 64-row tile loader. Device code only.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; lane = 4 * g + t, g = lane / 4, t = lane % 4;
// each 32-bit register holds two bf16, the lower column/row index in the low half):
//   A (16 x 16, row-major):  a0 = (g,   2t..2t+1)   a1 = (g+8, 2t..2t+1)
//                            a2 = (g,   2t+8..+9)   a3 = (g+8, 2t+8..+9)
//   B (16 x 8, k x n):       b0 = (k = 2t..2t+1, n = g)   b1 = (k = 2t+8..+9, n = g)
//   C/D (16 x 8, fp32):      c0, c1 = (g, 2t..2t+1)       c2, c3 = (g+8, 2t..2t+1)
// So the accumulators of two adjacent 16 x 8 tiles are exactly an A fragment of a 16 x 16 matrix
// (acc_to_a): a softmax probability tile feeds the next product without a trip to memory.
//
// Shared-memory tiles are [64 rows][HS] bf16 with a row stride of HS + 8 elements: (HS + 8) / 2
// words is 4 (mod 32) for HS = 64 and 128, so the 8 rows x 4 column pairs a fragment load
// touches fall in 32 different banks, and every row start stays 16-byte aligned for the
// 128-bit tile stores. Operands whose k index runs down the tile's rows (V in P*V, dO and Q
// in the backward's P^T*dO and dS^T*Q, K in dS*K) are read as two 16-bit loads per register
// (load_b_kn) instead of ldmatrix.trans: simpler to verify, at some instruction cost.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.h"

namespace pt::gpu::flash {

using bf16 = __nv_bfloat16;

constexpr int kRows = 64;  // queries or keys per tile
constexpr int kWarps = 4;  // each warp owns 16 rows of the block's tile
constexpr int kThreads = kWarps * kWarpSize;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HS>
__host__ __device__ constexpr int row_stride() {
  return HS + 8;
}

// D += A * B, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two consecutive bf16 (p[0] low, p[1] high).
__device__ __forceinline__ uint32_t load_pair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// p[0] (low) and p[stride] (high).
__device__ __forceinline__ uint32_t load_pair_strided(const bf16* p, int stride) {
  const uint32_t lo = *reinterpret_cast<const uint16_t*>(p);
  const uint32_t hi = *reinterpret_cast<const uint16_t*>(p + stride);
  return lo | (hi << 16);
}

// A fragment of the 16 x 16 row-major block at `base` (row stride ld).
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* base, int ld, int g, int t) {
  a[0] = load_pair(base + g * ld + 2 * t);
  a[1] = load_pair(base + (g + 8) * ld + 2 * t);
  a[2] = load_pair(base + g * ld + 2 * t + 8);
  a[3] = load_pair(base + (g + 8) * ld + 2 * t + 8);
}

// B fragment (16 x 8) whose element (k, n) is base[n * ld + k]: rows of the tile are n.
__device__ __forceinline__ void load_b_nk(uint32_t b[2], const bf16* base, int ld, int g, int t) {
  b[0] = load_pair(base + g * ld + 2 * t);
  b[1] = load_pair(base + g * ld + 2 * t + 8);
}

// B fragment (16 x 8) whose element (k, n) is base[k * ld + n]: rows of the tile are k.
__device__ __forceinline__ void load_b_kn(uint32_t b[2], const bf16* base, int ld, int g, int t) {
  b[0] = load_pair_strided(base + (2 * t) * ld + g, ld);
  b[1] = load_pair_strided(base + (2 * t + 8) * ld + g, ld);
}

// The accumulators of two adjacent 16 x 8 tiles (columns 0-7 and 8-15), rounded to bf16, as the
// A fragment of the 16 x 16 matrix they form.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// dst[r * (HS + 8) + c] = src[(row0 + r) * src_stride + c] for r < 64, c < HS; zeros for rows
// >= T. 16-byte accesses: src and src_stride * 2 bytes must be 16-byte aligned (checked by the
// launchers: HS % 8 == 0, C % 8 == 0 and aligned base pointers).
template <int HS>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, size_t src_stride, int row0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8, row = row0 + r;
    int4 v = make_int4(0, 0, 0, 0);
    if (row < T) v = *reinterpret_cast<const int4*>(src + static_cast<size_t>(row) * src_stride + c);
    *reinterpret_cast<int4*>(dst + r * row_stride<HS>() + c) = v;
  }
}

// p[0..1] = (x, y) rounded to bf16, one 32-bit store (the gradient outputs).
__device__ __forceinline__ void store_pair(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

}  // namespace pt::gpu::flash
