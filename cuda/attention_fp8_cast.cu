// FP8 attention's casts (core/common/fp8_attention.h): the e4m3 codes of a packed qkv and their
// per-(sequence, head) scales, which the FP8 flash forward (flash_attention_fp8.cu) multiplies,
// and the dequantised qkv its backward differentiates.
//
// Computes, from qkv [B, T, H HS] (bf16, H = NH + 2 NKV heads per row: q heads, k heads, v heads;
// x_{b,t,head,c} = qkv[b, t, head HS + c]):
//   amax[b, head]      = max_{t, c} |x|      (f32; magnitudes compared as integer bits: a NaN wins)
//   e = fp8_scale_exponent(amax[b, head], e4m3),  s = 2^e,  scale_inv[b, head] = 2^-e
//   code(x)            = fp8_encode(x * s, e4m3)
// quantize writes amax, scale_inv and the codes (Fp8AttentionCodes, attention.h):
//   q  [B, NH, T, HS]      q[b, h, t, c]                         = code(x_{b,t,h,c})
//   k  [B, NKV, T, HS]     k[b, g, t, c]                         = code(x_{b,t,NH+g,c})
//   vt [B, NKV, HS, Tpad]  vt[b, g, c, fp8_attn_v_position(t)]   = code(x_{b,t,NH+NKV+g,c}), 0 for t >= T
// dequantize writes qkv_dq (qkv's layout, bf16) = fp8_decode(code(x)) * scale_inv: exact (an e4m3
// value has 4 significant bits, scale_inv is a power of two).
// Bit for bit CpuOps' (core/cpu/cpu_attention_fp8.cpp): the same fp8_encode on the same floats,
// with fp8_cast.cu's care for --use_fast_math (fp8_exact.cuh: bf16 -> f32 by a shift, magnitudes
// as integer bits, x * s an explicit mul.rn.f32 without .ftz).
//
// How: every kernel runs one block of 128 threads per (64-token tile, sequence and head), grid
// (Tpad / 64, B H): a block reads its head's HS channels of 64 rows in 16-byte chunks (8 bf16; a
// warp reads runs of HS * 2 contiguous bytes, whole 32-byte sectors).
//  - amax: each thread's max of magnitude bits, a warp butterfly, a block max, one integer
//    atomicMax per block on amax[b, head] after a memset: order-independent, so deterministic.
//  - quantize: each block derives its head's scale from amax (the tile of block 0 writes
//    scale_inv). q and k heads: a chunk's 8 codes in one 8-byte store (a head's codes are
//    contiguous: a warp writes 256 contiguous bytes). v heads: the codes go through shared memory
//    as [HS][64 keys] (rows padded to 80 bytes), each key at its permuted position, then each
//    thread stores 16 codes of one channel's row with one 16-byte store; rows past T are zeros.
//  - dequantize: each chunk decoded, scaled and stored back as bf16 with one 16-byte store.
// Bytes, n = B T H HS elements: amax reads 2n; quantize reads 2n again (from L2 when qkv fits:
// 37.7 MB for GPT-2 124M at B 8, T 1024) and writes n codes (+ v's padding to Tpad); dequantize
// reads 2n and writes 2n (after its own amax pass); 8 B H bytes of amax and scale_inv.
// Arithmetic: fp8_encode is ~35 integer instructions per element (fp8_cast.cu), so quantize may be
// ALU-bound rather than at the copy bandwidth. Measured on an H200 (2026-11-28, one run): amax and
// quantize 0.175 ms for 100.7 M elements (B 16, T 1024, 96 heads of 64), ~0.58 T elements/s or
// 2.9 TB/s of both passes' traffic; 0.088 ms for 41.9 M (B 4, T 4096, GQA 16:2 at HS 128). Beside
// the FP8 forward's 0.36 ms and 1.18 ms there, the cast adds 7-50%. The hardware's
// cvt.rn.satfinite.e4m3x2.f32 would be cheaper, but bit-identity with CpuOps' fp8_encode (its NaN
// codes) comes first here, as in fp8_cast.cu.
#include <cstdint>

#include "core/common/fp8_attention.h"
#include "cuda/attention.h"
#include "cuda/cuda_common.h"
#include "cuda/fp8_exact.cuh"

namespace pt::gpu {

namespace {

using bf16 = __nv_bfloat16;
using namespace fp8x;

constexpr int kThreads = 128;
constexpr int kRows = kFp8AttnKeyTile;  // tokens per block: a v block fills one key tile of vt
constexpr int kVec = 8;                 // bf16 per 16-byte chunk
constexpr int kTileLd = kRows + 16;     // bytes per channel row of the v tile (16-byte aligned rows)

// Calls f(r, c, chunk) for the 16-byte chunks of head `head` in rows [row0, row0 + 64) of sequence
// b, r < 64 the row within the tile, c the head's first channel of the chunk. kAll: also rows past T
// (chunk then zero, nothing read), which the v tile needs; else those are skipped.
template <int HS, bool kAll = false, typename F>
__device__ __forceinline__ void visit_tile(const bf16* qkv, int T, int H, int b, int head, int row0, F&& f) {
  constexpr int kChunks = HS / kVec;
  static_assert(kRows * kChunks % kThreads == 0, "visit_tile: whole passes");
#pragma unroll
  for (int pass = 0; pass < kRows * kChunks / kThreads; ++pass) {
    const int i = threadIdx.x + pass * kThreads, r = i / kChunks, c = (i % kChunks) * kVec;
    Packed<bf16, kVec> v;
    if (row0 + r < T) {
      v = load_packed<bf16, kVec>(qkv + (static_cast<size_t>(b) * T + row0 + r) * H * HS + size_t(head) * HS + c);
    } else {
      if constexpr (!kAll) continue;
      *reinterpret_cast<int4*>(v.v) = make_int4(0, 0, 0, 0);
    }
    f(r, c, v);
  }
}

// The scale exponent of a (sequence, head), from its amax (one load per thread, broadcast in L1).
__device__ __forceinline__ int head_exponent(const float* amax) {
  return fp8_scale_exponent(amax[blockIdx.y], kFp8AttnFormat);
}

__device__ __forceinline__ uint32_t encode(bf16 x, float s) { return fp8x::encode<kFp8AttnFormat>(x, s); }

// ---- amax -----------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads) head_amax_kernel(uint32_t* amax, const bf16* qkv, int T, int H) {
  __shared__ uint32_t warp_max[kThreads / kWarpSize];
  const int b = blockIdx.y / H, head = blockIdx.y % H;
  uint32_t m = 0;
  visit_tile<HS>(qkv, T, H, b, head, blockIdx.x * kRows, [&](int, int, const Packed<bf16, kVec>& v) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = max(m, magnitude_bits(v.v[j]));
  });
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kThreads / kWarpSize; ++w) m = max(m, warp_max[w]);
    if (m != 0) atomicMax(amax + blockIdx.y, m);  // amax[b, head] was zeroed before the launch
  }
}

void launch_head_amax(float* amax, const bf16* qkv, int B, int T, int H, int HS, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(amax, 0, size_t(B) * H * sizeof(float), stream));
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kRows)), static_cast<unsigned>(B * H));
  uint32_t* bits = reinterpret_cast<uint32_t*>(amax);
  if (HS == 64)
    head_amax_kernel<64><<<grid, kThreads, 0, stream>>>(bits, qkv, T, H);
  else
    head_amax_kernel<128><<<grid, kThreads, 0, stream>>>(bits, qkv, T, H);
  CUDA_CHECK_LAUNCH();
}

// ---- quantize -------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads) quantize_kernel(Fp8AttentionCodes codes, const bf16* qkv, int T, int NH,
                                                            int NKV) {
  __shared__ __align__(16) uint8_t tile[HS * kTileLd];  // v heads: tile[c * kTileLd + position] (a key's code)
  const int H = NH + 2 * NKV, b = blockIdx.y / H, head = blockIdx.y % H, row0 = blockIdx.x * kRows;
  const int e = head_exponent(codes.amax);
  const float s = fp8_pow2(e);
  if (blockIdx.x == 0 && threadIdx.x == 0) codes.scale_inv[blockIdx.y] = fp8_pow2(-e);

  if (head < NH + NKV) {  // q or k: [T, HS] per (sequence, head), as qkv's rows
    uint8_t* dst = head < NH ? codes.q + (static_cast<size_t>(b) * NH + head) * T * HS
                             : codes.k + (static_cast<size_t>(b) * NKV + head - NH) * T * HS;
    visit_tile<HS>(qkv, T, H, b, head, row0, [&](int r, int c, const Packed<bf16, kVec>& v) {
      uint32_t w[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < kVec; ++j) w[j / 4] |= encode(v.v[j], s) << (8 * (j % 4));
      *reinterpret_cast<uint2*>(dst + static_cast<size_t>(row0 + r) * HS + c) = make_uint2(w[0], w[1]);
    });
    return;
  }

  // v: transposed through shared memory, key r of the tile at position fp8_attn_v_position(r) of
  // each channel's row (a bf16 0 past T encodes to the zero code).
  visit_tile<HS, true>(qkv, T, H, b, head, row0, [&](int r, int c, const Packed<bf16, kVec>& v) {
    const int position = fp8_attn_v_position(r);
#pragma unroll
    for (int j = 0; j < kVec; ++j) tile[(c + j) * kTileLd + position] = static_cast<uint8_t>(encode(v.v[j], s));
  });
  __syncthreads();
  const int g = head - NH - NKV, Tpad = fp8_attn_padded_keys(T);
  uint8_t* dst = codes.vt + (static_cast<size_t>(b) * NKV + g) * HS * Tpad + row0;
  constexpr int kParts = kRows / 16;  // 16-byte stores per channel row of the tile
  static_assert(HS * kParts % kThreads == 0, "quantize_kernel: whole passes");
#pragma unroll
  for (int pass = 0; pass < HS * kParts / kThreads; ++pass) {
    const int i = threadIdx.x + pass * kThreads, c = i / kParts, part = (i % kParts) * 16;
    *reinterpret_cast<uint4*>(dst + static_cast<size_t>(c) * Tpad + part) =
        *reinterpret_cast<const uint4*>(tile + c * kTileLd + part);
  }
}

// ---- dequantize -----------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(bf16* qkv_dq, const float* amax, const bf16* qkv, int T,
                                                              int H) {
  const int b = blockIdx.y / H, head = blockIdx.y % H, row0 = blockIdx.x * kRows;
  const int e = head_exponent(amax);
  const float s = fp8_pow2(e), s_inv = fp8_pow2(-e);
  visit_tile<HS>(qkv, T, H, b, head, row0, [&](int r, int c, const Packed<bf16, kVec>& v) {
    Packed<bf16, kVec> y;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      y.v[j] = __float2bfloat16_rn(
          mul_keep_subnormals(fp8_decode(static_cast<uint8_t>(encode(v.v[j], s)), kFp8AttnFormat), s_inv));
    store_packed<bf16, kVec>(qkv_dq + (static_cast<size_t>(b) * T + row0 + r) * H * HS + size_t(head) * HS + c, y);
  });
}

void check_shape(const char* op, int B, int T, int NH, int NKV, int HS) {
  check(HS == 64 || HS == 128, std::string(op) + ": head size " + std::to_string(HS) + " (64 or 128)");
  check(NKV > 0 && NH % NKV == 0, std::string(op) + ": n_kv_heads must divide n_heads");
  check(static_cast<long long>(B) * (NH + 2 * NKV) <= 65535,
        std::string(op) + ": B * (n_heads + 2 n_kv_heads) exceeds the grid's y limit 65535");
}

size_t aligned256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t attention_fp8_codes_bytes(int B, int T, int NH, int NKV, int HS) {
  const size_t heads = size_t(B) * (NH + 2 * NKV), Tpad = size_t(fp8_attn_padded_keys(T));
  return 2 * aligned256(heads * sizeof(float)) + aligned256(size_t(B) * NH * T * HS) +
         aligned256(size_t(B) * NKV * T * HS) + aligned256(size_t(B) * NKV * HS * Tpad);
}

Fp8AttentionCodes attention_fp8_codes_at(void* space, int B, int T, int NH, int NKV, int HS) {
  const size_t heads = size_t(B) * (NH + 2 * NKV), Tpad = size_t(fp8_attn_padded_keys(T));
  char* p = static_cast<char*>(space);
  Fp8AttentionCodes c;
  c.amax = reinterpret_cast<float*>(p);
  p += aligned256(heads * sizeof(float));
  c.scale_inv = reinterpret_cast<float*>(p);
  p += aligned256(heads * sizeof(float));
  c.q = reinterpret_cast<uint8_t*>(p);
  p += aligned256(size_t(B) * NH * T * HS);
  c.k = reinterpret_cast<uint8_t*>(p);
  p += aligned256(size_t(B) * NKV * T * HS);
  c.vt = reinterpret_cast<uint8_t*>(p);
  return c;
}

void attention_fp8_quantize(const Fp8AttentionCodes& codes, const void* qkv, int B, int T, int NH, int NKV, int HS,
                            void* stream) {
  check_shape("attention_fp8_quantize", B, T, NH, NKV, HS);
  if (B <= 0 || T <= 0) return;
  const cudaStream_t st = as_stream(stream);
  const int H = NH + 2 * NKV;
  const bf16* x = static_cast<const bf16*>(qkv);
  launch_head_amax(codes.amax, x, B, T, H, HS, st);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kRows)), static_cast<unsigned>(B * H));
  if (HS == 64)
    quantize_kernel<64><<<grid, kThreads, 0, st>>>(codes, x, T, NH, NKV);
  else
    quantize_kernel<128><<<grid, kThreads, 0, st>>>(codes, x, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
}

void attention_fp8_dequantize(void* qkv_dq, float* amax, const void* qkv, int B, int T, int NH, int NKV, int HS,
                              void* stream) {
  check_shape("attention_fp8_dequantize", B, T, NH, NKV, HS);
  if (B <= 0 || T <= 0) return;
  const cudaStream_t st = as_stream(stream);
  const int H = NH + 2 * NKV;
  const bf16* x = static_cast<const bf16*>(qkv);
  launch_head_amax(amax, x, B, T, H, HS, st);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kRows)), static_cast<unsigned>(B * H));
  bf16* out = static_cast<bf16*>(qkv_dq);
  if (HS == 64)
    dequantize_kernel<64><<<grid, kThreads, 0, st>>>(out, amax, x, T, H);
  else
    dequantize_kernel<128><<<grid, kThreads, 0, st>>>(out, amax, x, T, H);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
