// FP8 casts: the largest magnitudes of a tensor (amax: whole, per row or per column) and its
// quantisation to FP8 codes with power-of-two scales (one, or one per row of the codes), stored
// as is or transposed (the FP8 products take both operands K-major).
//
// Computes (core/common/fp8.h, Ops "FP8 linear layers"):
//   amax:      tensor: amax[0] = max_i |x[i]|; rows: amax[r] = max_c |x[r, c]|; cols: amax[c] =
//              max_r |x[r, c]|                                          (f32; 0 for an empty set)
//   quantize:  k = fp8_scale_exponent(max_k amaxes[k], format), s = 2^k,
//              q[r, c] = fp8_encode(x[r, c] * s)   or, transposed, q[c, r] = the same code,
//              scale_inv[0] = 2^-k
//              per_row: q's row i (x's row i, or x's column i transposed) has its own
//              k_i = fp8_scale_exponent(max_k amaxes[k * R + i]), scale_inv[i] = 2^-k_i
//              record (optional, tensorwise only): record_amax[0] = max(record_amax[0], max_i |x[i]|)
//              in magnitude-bit order (delayed scaling records what it quantised); accumulates
//              across calls (the caller zeroes it once per step), so no memset here
// x is f32 or bf16; the codes are e4m3 or e5m2. The codes are bit for bit CpuOps' (the oracle):
// the same fp8_encode (round to nearest even, satfinite, NaN -> NaN), and the same float
// inputs. Two details keep them so under the target's --use_fast_math (-ftz=true), which would
// flush a subnormal float to zero wherever fp32 arithmetic touches it: magnitudes are compared
// as integer bits (a bf16 or f32 subnormal is not lost from amax; for non-negative floats the
// bits order as the values, a NaN's above an infinity, as CpuOps' max of bits), and x * s is an
// explicit `mul.rn.f32` (no .ftz: a subnormal x scaled up by s stays the exact product CpuOps
// computes). bf16 -> f32 is a 16-bit shift, exact for subnormals too.
//
// Algorithm:
//  - amax: a grid-stride pass in 16-byte chunks (4 f32 / 8 bf16; scalar loads for a misaligned
//    slice), kUnroll chunks in flight per thread (visit_packed_chunks, packed_visit.cuh: the
//    loop reduce.cu's sums use), each thread's max of magnitude bits, a warp
//    butterfly and a block max, then one atomicMax of the bits per block on amax (zeroed first by
//    a memset on the stream). A float atomic would not do; an integer max is order-independent,
//    so the result is deterministic (bitwise the same every run) although atomics merge it.
//  - quantize, plain: one 16-byte chunk of x per thread, its VEC codes written with one 8-byte
//    (bf16) or 4-byte (f32) store; a warp moves 512 contiguous bytes in and 256 / 128 out. The
//    last n % VEC elements by scalar accesses; all scalar when a pointer is misaligned.
//  - quantize, transposed: 64 x 64 tiles through shared memory (4.3 KB of codes, rows padded to
//    68 bytes). Loads: 8 (bf16) or 16 (f32) threads per tile row with 16-byte loads, so a warp
//    reads 4 or 2 rows of 128 / 256 contiguous bytes; each thread encodes its chunk and writes
//    the codes into the tile as 4-byte words. Stores: 4 threads per output row, 16 codes each
//    (gathered down a tile column, 16 byte loads from shared memory, a 2-way bank conflict at
//    most) in one 16-byte store, so a warp writes 8 rows of 64 contiguous bytes. Edge tiles and
//    shapes without 16-byte chunks (cols % VEC, rows % 16, misaligned pointers) take guarded
//    scalar paths. Encoding happens once per element, before the transpose: shared memory holds
//    1 byte per element, not 2 or 4.
//  - amax per row: one warp per row (8 rows per block), 16-byte loads when every row starts
//    aligned (x aligned, cols % VEC == 0), else scalar; a butterfly max, one plain store per row.
//  - amax per column: blocks of 256 columns x 64 rows (more rows when there would be over 65535
//    row tiles), each thread one column strip (a warp reads 32 contiguous elements of a row),
//    then one integer atomicMax per column per tile after a memset: deterministic, as above.
//  - per-row quantize: the same kernels; plain: each 16-byte chunk lies in one row (vector path
//    only when cols % VEC == 0) and derives its row's scale (n_amax L1-resident loads);
//    transposed: a tile's 64 column scales derived once into shared memory. scale_inv's R
//    entries are written by a small kernel after (scale_inv_kernel).
//  - quantize with record_amax: the same two tensorwise kernels, instantiated with kRecord (the
//    kRecord = false instantiations are the plain casts, unchanged: no register, no branch, no
//    shared memory for it). Each thread also takes the max of the magnitude bits of the
//    elements it already holds to encode (vector chunks, the partial last chunk, the scalar and
//    misaligned paths alike: every element of x once), then as the amax kernel: a warp
//    butterfly, each warp's max in shared memory, thread 0's max of the 8, and one integer
//    atomicMax per block on record_amax's bits (none for a max of 0). The plain kernel adds one
//    barrier for it (its threads may not leave early); the transposed kernel uses the tile's
//    own barrier. Integer max: order-independent, deterministic, bit for bit CpuOps' max of
//    fp8_magnitude_bits (record_amax must hold a magnitude, sign bit clear, as zeroing gives).
//  Every block derives the scale itself from amaxes (n_amax loads, broadcast in L1), so the
//  kernel needs no host round trip and no second launch; block 0's thread 0 writes scale_inv.
//
// Memory traffic (the floor; s = 2 for bf16, 4 for f32):
//   amax      n*s read                                  e.g. N*4C = 65536*3072 bf16: 403 MB
//   quantize  n*s read + n written (plain or transposed)     same tensor: 604 MB, ~180 us at
//                                                            3.35 TB/s (H100 SXM)
//   + record  nothing more: x is read once for both; one 4-byte atomic per block (n / 2048 for
//             bf16's vector path: 98304 on that tensor, merged in L2)
// Arithmetic: fp8_encode with the scaling is ~35 instructions per element (PTX of the bf16
// plain kernel: 692 for a chunk of 8 plus its scalar tail), exact integer rounding, the code
// CpuOps runs. At ~30 T thread-instructions/s (H100 SXM) that is ~0.85 T elements/s, i.e. ~2.5
// TB/s of bf16 traffic (3 bytes per element): the quantize kernels may end ALU-bound at ~70% of
// the copy bandwidth rather than at it. The hardware's cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+)
// would be cheaper, but its NaN codes (sign, payload) are not documented to be fp8_encode's, and
// bit-identity with CpuOps comes first; bench/kernel_bench_fp8.cpp measures the rate.
// Deterministic: no float atomics; the integer atomicMax is order-independent.
#include <algorithm>
#include <cstdint>

#include "core/common/fp8.h"
#include "cuda/cuda_common.h"
#include "cuda/fp8_cast.h"
#include "cuda/fp8_exact.cuh"
#include "cuda/packed_visit.cuh"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kUnroll = 4;          // amax: 16-byte chunks a thread has in flight
constexpr unsigned kMaxAmaxBlocks = 1024;
constexpr int kTile = 64;           // transposed quantize: a tile is kTile x kTile elements
constexpr int kTileStride = kTile + 4;  // bytes per tile row: 4-byte aligned, at most 2-way conflicts
constexpr int kOutChunk = 16;       // codes per 16-byte store of the transposed output

using namespace fp8x;  // exact_float, magnitude_bits, mul_keep_subnormals, encode<F>

// The scale exponent of scale i: the largest of the ranks' amaxes amaxes[k * stride + i], k <
// n_amax (the whole tensor's: stride 1, i 0; q's row i with per-row scales: stride R), compared
// as bits as CpuOps does (a NaN amax wins and gives k = 0).
template <Fp8Format F>
__device__ __forceinline__ int scale_exponent(const float* amaxes, int n_amax, int stride = 1, int i = 0) {
  return fp8_parts_scale_exponent(amaxes, n_amax, size_t(stride), size_t(i), F);
}

// Per-row scales: scale_inv[i] = 2^-k_i for i < R (the kernels that quantise derive k_i alike).
template <Fp8Format F>
__global__ void __launch_bounds__(kBlock) scale_inv_kernel(float* scale_inv, const float* amaxes, int n_amax, int R) {
  const int i = blockIdx.x * kBlock + threadIdx.x;
  if (i < R) scale_inv[i] = fp8_pow2(-scale_exponent<F>(amaxes, n_amax, R, i));
}

// ---- a block's largest magnitude, merged into one global max --------------------------------

// The block's max of m in two halves, so that a kernel with a barrier of its own can put that
// barrier between them: m = warp_max_to_shared(warp_max, m) (every thread of the block: a
// butterfly, lane 0 stores its warp's max, which every lane gets back), a __syncthreads(), then
// block_max_atomic(out, warp_max, m) (thread 0: its warp's m and the other warps' maxes, then
// one integer atomicMax on *out unless the max cannot raise *out: 0, or no larger than the value
// *out is seen to hold. *out only grows, so a stale read only costs an atomic; the read keeps a
// one-chunk-per-thread cast, ~10^5 blocks, from queueing as many atomics on one address: after
// the first wave of blocks most find the max already there). *out holds a
// magnitude's bits (sign clear), so the integer max is the magnitudes' max, and it is
// order-independent: deterministic although the blocks' atomics land in any order.
__device__ __forceinline__ uint32_t warp_max_to_shared(uint32_t* warp_max, uint32_t m) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = m;
  return m;
}

__device__ __forceinline__ void block_max_atomic(uint32_t* out, const uint32_t* warp_max, uint32_t m) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kBlock / kWarpSize; ++w) m = max(m, warp_max[w]);
    if (m != 0 && m > *static_cast<volatile const uint32_t*>(out)) atomicMax(out, m);
  }
}

// ---- amax -----------------------------------------------------------------------------------

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kBlock) amax_kernel(uint32_t* amax, const T* x, size_t n) {
  constexpr int VEC = kChunkElems<T>;
  __shared__ uint32_t warp_max[kBlock / kWarpSize];
  uint32_t m = 0;
  visit_packed_chunks<kBlock, kUnroll, kAligned>(x, n, [&](T v) { m = max(m, magnitude_bits(v)); });
  if (blockIdx.x == 0 && threadIdx.x < n % VEC) m = max(m, magnitude_bits(x[n / VEC * VEC + threadIdx.x]));
  m = warp_max_to_shared(warp_max, m);
  __syncthreads();
  block_max_atomic(amax, warp_max, m);  // amax is zeroed before the launch
}

template <typename T>
void launch_amax(float* amax, const void* x, size_t n, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  constexpr int VEC = 16 / sizeof(T);
  // At least one block: the n % VEC tail belongs to block 0.
  const unsigned blocks = grid_stride_blocks(n / VEC, size_t(kBlock) * kUnroll, kMaxAmaxBlocks);
  uint32_t* out = reinterpret_cast<uint32_t*>(amax);
  const T* p = static_cast<const T*>(x);
  if (is_aligned(x, 16))
    amax_kernel<T, true><<<blocks, kBlock, 0, stream>>>(out, p, n);
  else
    amax_kernel<T, false><<<blocks, kBlock, 0, stream>>>(out, p, n);
  CUDA_CHECK_LAUNCH();
}

// ---- amax per row: one warp per row ---------------------------------------------------------

constexpr int kRowsPerBlock = kBlock / kWarpSize;

// Warp w of block b owns row 8 b + w: its lanes stride over the row's 16-byte chunks (kVec: x
// 16-byte aligned and cols % VEC == 0, so every row starts aligned) or elements, then a butterfly
// max; lane 0 stores amax[r] (no atomic, no memset: every row is written, an empty one with 0).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kBlock) amax_rows_kernel(float* amax, const T* x, int rows, int cols) {
  const int lane = threadIdx.x % kWarpSize;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= rows) return;
  const T* row = x + static_cast<size_t>(r) * cols;
  uint32_t m = 0;
  if constexpr (kVec) {
    constexpr int VEC = kChunkElems<T>;
    const int chunks = cols / VEC;
#pragma unroll 4
    for (int c = lane; c < chunks; c += kWarpSize) {
      const Packed<T, VEC> v = load_packed<T, VEC>(row + static_cast<size_t>(c) * VEC);
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = max(m, magnitude_bits(v.v[j]));
    }
  } else {
#pragma unroll 4
    for (int c = lane; c < cols; c += kWarpSize) m = max(m, magnitude_bits(row[c]));
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (lane == 0) amax[r] = __uint_as_float(m);
}

// ---- amax per column: tiles of columns x rows ----------------------------------------------

constexpr int kColTileRows = 64;  // rows a thread walks per tile (more when gridDim.y would overflow)

// Block (bx, by): columns [256 bx, +256), one per thread (a warp reads 32 contiguous elements of
// a row), rows [tile_rows by, +tile_rows); each thread's max over its column strip, then one
// integer atomicMax per column per tile on amax (zeroed first by a memset): order-independent.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    amax_cols_kernel(uint32_t* amax, const T* x, int rows, int cols, int tile_rows) {
  const int c = blockIdx.x * kBlock + threadIdx.x;
  if (c >= cols) return;
  const int r0 = blockIdx.y * tile_rows, r1 = min(rows, r0 + tile_rows);
  const T* p = x + static_cast<size_t>(r0) * cols + c;
  uint32_t m = 0;
#pragma unroll 8
  for (int r = r0; r < r1; ++r, p += cols) m = max(m, magnitude_bits(*p));
  if (m != 0) atomicMax(amax + c, m);
}

template <typename T>
void launch_amax_rows(float* amax, const void* x, int rows, int cols, cudaStream_t stream) {
  if (rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  const T* p = static_cast<const T*>(x);
  if (is_aligned(x, 16) && cols % kChunkElems<T> == 0)
    amax_rows_kernel<T, true><<<blocks, kBlock, 0, stream>>>(amax, p, rows, cols);
  else
    amax_rows_kernel<T, false><<<blocks, kBlock, 0, stream>>>(amax, p, rows, cols);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_amax_cols(float* amax, const void* x, int rows, int cols, cudaStream_t stream) {
  if (cols == 0) return;
  CUDA_CHECK(cudaMemsetAsync(amax, 0, size_t(cols) * sizeof(float), stream));
  if (rows == 0) return;
  const int tile_rows = std::max(kColTileRows, static_cast<int>(ceil_div(rows, 65535)));
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kBlock)), static_cast<unsigned>(ceil_div(rows, tile_rows)));
  amax_cols_kernel<T><<<grid, kBlock, 0, stream>>>(reinterpret_cast<uint32_t*>(amax), static_cast<const T*>(x), rows,
                                                   cols, tile_rows);
  CUDA_CHECK_LAUNCH();
}

// ---- quantize, plain ------------------------------------------------------------------------

// VEC codes packed little-endian into one word of VEC bytes (VEC = 8: two 32-bit halves).
template <int VEC>
struct CodeWord;
template <>
struct CodeWord<8> {
  using type = uint2;
};
template <>
struct CodeWord<4> {
  using type = uint32_t;
};

// kPerRow: x's row r (q's row) has its own scale from amaxes[k * rows + r], derived where it is
// used (n_amax loads, L1 hits); scale_inv is scale_inv_kernel's. kVec with kPerRow needs cols %
// VEC == 0, so a chunk lies in one row.
// kRecord (tensorwise only): *record = max(*record, the magnitude bits of every element of x),
// from the values already in registers for encoding: each thread's max, warp_max_to_shared and
// one atomicMax per block (no thread may leave before the butterfly, hence no early return).
// Without it, `record` is unused and the kernel is the plain cast.
template <typename T, Fp8Format F, bool kVec, bool kPerRow, bool kRecord>
__global__ void __launch_bounds__(kBlock) quantize_kernel(uint8_t* q, float* scale_inv, const T* x,
                                                          const float* amaxes, int n_amax, size_t n, int rows,
                                                          int cols, uint32_t* record) {
  static_assert(!(kRecord && kPerRow), "record_amax is one tensor's amax: tensorwise scales only");
  constexpr int VEC = kVec ? 16 / sizeof(T) : 1;
  float s = 1.0f;
  if constexpr (!kPerRow) {
    const int k = scale_exponent<F>(amaxes, n_amax);
    s = fp8_pow2(k);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = fp8_pow2(-k);
  }
  const size_t i = (static_cast<size_t>(blockIdx.x) * kBlock + threadIdx.x) * VEC;
  uint32_t m = 0;  // kRecord: the largest magnitude bits of this thread's elements
  if (i < n) {
    // The scale of element j (j in i's chunk: one row when kPerRow and kVec).
    const auto scale_of = [&](size_t j) {
      if constexpr (kPerRow) return fp8_pow2(scale_exponent<F>(amaxes, n_amax, rows, static_cast<int>(j / cols)));
      return s;
    };
    if constexpr (kVec) {
      if (i + VEC <= n) {
        const Packed<T, VEC> v = load_packed<T, VEC>(x + i);
        const float sc = scale_of(i);
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          w[j / 4] |= encode<F>(v.v[j], sc) << (8 * (j % 4));
          if constexpr (kRecord) m = max(m, magnitude_bits(v.v[j]));
        }
        if constexpr (VEC == 8)
          *reinterpret_cast<uint2*>(q + i) = make_uint2(w[0], w[1]);
        else
          *reinterpret_cast<uint32_t*>(q + i) = w[0];
      } else {
        for (size_t j = i; j < n; ++j) {  // the partial last chunk
          const T xj = x[j];
          q[j] = static_cast<uint8_t>(encode<F>(xj, scale_of(j)));
          if constexpr (kRecord) m = max(m, magnitude_bits(xj));
        }
      }
    } else {
      const T xi = x[i];
      q[i] = static_cast<uint8_t>(encode<F>(xi, scale_of(i)));
      if constexpr (kRecord) m = max(m, magnitude_bits(xi));
    }
  }
  if constexpr (kRecord) {
    __shared__ uint32_t warp_max[kBlock / kWarpSize];
    m = warp_max_to_shared(warp_max, m);
    __syncthreads();
    block_max_atomic(record, warp_max, m);
  }
}

// ---- quantize, transposed -------------------------------------------------------------------

// Block (bx, by) owns rows [64 bx, +64) and columns [64 by, +64) of x, i.e. rows [64 by, +64) and
// columns [64 bx, +64) of q [cols, rows]. kVec: x and q 16-byte aligned, cols % VEC == 0 and
// rows % 16 == 0, so every chunk that starts inside the matrix is whole.
// kPerRow: q's row c (x's column c) has its own scale from amaxes[k * cols + c]; the block's 64
// column scales are derived once into shared memory; scale_inv is scale_inv_kernel's.
// kRecord (tensorwise only): *record = max(*record, the magnitude bits of the tile's elements),
// taken from the loaded chunks as they are encoded; the warps' maxes cross the tile's own
// barrier (no extra one), then one atomicMax per block. Without it, `record` is unused.
template <typename T, Fp8Format F, bool kVec, bool kPerRow, bool kRecord>
__global__ void __launch_bounds__(kBlock) quantize_transpose_kernel(uint8_t* q, float* scale_inv, const T* x,
                                                                    const float* amaxes, int n_amax, int rows,
                                                                    int cols, uint32_t* record) {
  static_assert(!(kRecord && kPerRow), "record_amax is one tensor's amax: tensorwise scales only");
  constexpr int VEC = 16 / sizeof(T);  // elements of x per 16-byte chunk
  constexpr int kChunksPerRow = kTile / VEC;
  constexpr int kOutChunksPerRow = kTile / kOutChunk;
  __shared__ __align__(16) uint8_t tile[kTile * kTileStride];  // tile[r * kTileStride + c]: code of x[r0 + r, c0 + c]
  __shared__ float col_scale[kPerRow ? kTile : 1];  // col_scale[c]: the scale of x's column c0 + c
  const int r0 = blockIdx.x * kTile, c0 = blockIdx.y * kTile;
  float s = 1.0f;
  if constexpr (kPerRow) {
    for (int c = threadIdx.x; c < kTile; c += kBlock)
      col_scale[c] = c0 + c < cols ? fp8_pow2(scale_exponent<F>(amaxes, n_amax, cols, c0 + c)) : 1.0f;
    __syncthreads();
  } else {
    const int k = scale_exponent<F>(amaxes, n_amax);
    s = fp8_pow2(k);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = fp8_pow2(-k);
  }

  uint32_t m = 0;  // kRecord: the largest magnitude bits of this thread's elements
  for (int idx = threadIdx.x; idx < kTile * kChunksPerRow; idx += kBlock) {
    const int r = idx / kChunksPerRow, cc = (idx % kChunksPerRow) * VEC;
    const int gr = r0 + r, gc = c0 + cc;
    if (gr >= rows || gc >= cols) continue;  // never read back: the stores are guarded alike
    const T* src = x + static_cast<size_t>(gr) * cols + gc;
    uint8_t* dst = tile + r * kTileStride + cc;
    if constexpr (kVec) {
      const Packed<T, VEC> v = load_packed<T, VEC>(src);
#pragma unroll
      for (int w = 0; w < VEC / 4; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          word |= encode<F>(v.v[4 * w + j], kPerRow ? col_scale[cc + 4 * w + j] : s) << (8 * j);
          if constexpr (kRecord) m = max(m, magnitude_bits(v.v[4 * w + j]));
        }
        reinterpret_cast<uint32_t*>(dst)[w] = word;
      }
    } else {
      for (int j = 0; j < VEC && gc + j < cols; ++j) {
        const T xj = src[j];
        dst[j] = static_cast<uint8_t>(encode<F>(xj, kPerRow ? col_scale[cc + j] : s));
        if constexpr (kRecord) m = max(m, magnitude_bits(xj));
      }
    }
  }
  if constexpr (kRecord) {  // the tile's barrier between the warps' maxes and the block's
    __shared__ uint32_t warp_max[kBlock / kWarpSize];
    m = warp_max_to_shared(warp_max, m);
    __syncthreads();
    block_max_atomic(record, warp_max, m);
  } else {
    __syncthreads();
  }

  for (int idx = threadIdx.x; idx < kTile * kOutChunksPerRow; idx += kBlock) {
    const int c = idx / kOutChunksPerRow, rr = (idx % kOutChunksPerRow) * kOutChunk;
    const int gc = c0 + c, gr = r0 + rr;
    if (gc >= cols || gr >= rows) continue;
    uint8_t* dst = q + static_cast<size_t>(gc) * rows + gr;
    const uint8_t* col = tile + rr * kTileStride + c;
    if constexpr (kVec) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[j] = uint32_t(col[(4 * j) * kTileStride]) | uint32_t(col[(4 * j + 1) * kTileStride]) << 8 |
               uint32_t(col[(4 * j + 2) * kTileStride]) << 16 | uint32_t(col[(4 * j + 3) * kTileStride]) << 24;
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int j = 0; j < kOutChunk && gr + j < rows; ++j) dst[j] = col[j * kTileStride];
    }
  }
}

template <typename T, Fp8Format F, bool kPerRow, bool kRecord>
void launch_quantize(uint8_t* q, float* scale_inv, const T* x, const float* amaxes, int n_amax, int rows, int cols,
                     bool transpose, uint32_t* record, cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  if (transpose) {
    // Rows (tokens, the large dimension) along grid.x; at least one block, which writes scale_inv.
    const unsigned bx = static_cast<unsigned>(rows > 0 ? ceil_div(rows, kTile) : 1);
    const unsigned by = static_cast<unsigned>(cols > 0 ? ceil_div(cols, kTile) : 1);
    check(by <= 65535, "fp8_quantize: " + std::to_string(cols) + " columns exceed the transposed kernel's grid");
    const dim3 grid(bx, by);
    const bool vec = is_aligned(x, 16) && is_aligned(q, 16) && cols % VEC == 0 && rows % kOutChunk == 0;
    if (vec)
      quantize_transpose_kernel<T, F, true, kPerRow, kRecord>
          <<<grid, kBlock, 0, stream>>>(q, scale_inv, x, amaxes, n_amax, rows, cols, record);
    else
      quantize_transpose_kernel<T, F, false, kPerRow, kRecord>
          <<<grid, kBlock, 0, stream>>>(q, scale_inv, x, amaxes, n_amax, rows, cols, record);
  } else {
    const size_t n = size_t(rows) * cols;
    const bool vec = is_aligned(x, 16) && is_aligned(q, VEC) && (!kPerRow || cols % VEC == 0);
    const size_t per_block = size_t(kBlock) * (vec ? VEC : 1);
    const size_t blocks = n > 0 ? ceil_div(n, per_block) : 1;
    check(blocks <= 0x7fffffffu, "fp8_quantize: " + std::to_string(n) + " elements exceed one launch's grid");
    const unsigned g = static_cast<unsigned>(blocks);
    if (vec)
      quantize_kernel<T, F, true, kPerRow, kRecord>
          <<<g, kBlock, 0, stream>>>(q, scale_inv, x, amaxes, n_amax, n, rows, cols, record);
    else
      quantize_kernel<T, F, false, kPerRow, kRecord>
          <<<g, kBlock, 0, stream>>>(q, scale_inv, x, amaxes, n_amax, n, rows, cols, record);
  }
  CUDA_CHECK_LAUNCH();
  if constexpr (kPerRow) {
    const int R = transpose ? cols : rows;  // q's rows, one scale each
    if (R > 0) {
      scale_inv_kernel<F><<<static_cast<unsigned>(ceil_div(R, kBlock)), kBlock, 0, stream>>>(scale_inv, amaxes,
                                                                                            n_amax, R);
      CUDA_CHECK_LAUNCH();
    }
  }
}

// record (tensorwise only, checked by the caller): the kRecord kernels; null: the plain ones.
template <typename T, Fp8Format F>
void launch_quantize_scales(uint8_t* q, float* scale_inv, const T* x, const float* amaxes, int n_amax, int rows,
                            int cols, bool transpose, bool per_row, uint32_t* record, cudaStream_t stream) {
  if (per_row)
    launch_quantize<T, F, true, false>(q, scale_inv, x, amaxes, n_amax, rows, cols, transpose, nullptr, stream);
  else if (record)
    launch_quantize<T, F, false, true>(q, scale_inv, x, amaxes, n_amax, rows, cols, transpose, record, stream);
  else
    launch_quantize<T, F, false, false>(q, scale_inv, x, amaxes, n_amax, rows, cols, transpose, nullptr, stream);
}

template <typename T>
void launch_quantize_format(DType q_dtype, void* q, float* scale_inv, const void* x, const float* amaxes, int n_amax,
                            int rows, int cols, bool transpose, bool per_row, uint32_t* record, cudaStream_t stream) {
  uint8_t* codes = static_cast<uint8_t*>(q);
  const T* in = static_cast<const T*>(x);
  if (q_dtype == DType::f8e4m3)
    launch_quantize_scales<T, Fp8Format::e4m3>(codes, scale_inv, in, amaxes, n_amax, rows, cols, transpose, per_row,
                                               record, stream);
  else
    launch_quantize_scales<T, Fp8Format::e5m2>(codes, scale_inv, in, amaxes, n_amax, rows, cols, transpose, per_row,
                                               record, stream);
}

template <typename T>
void launch_amax_over(float* amax, const void* x, int rows, int cols, Fp8Amax over, cudaStream_t stream) {
  switch (over) {
    case Fp8Amax::tensor: return launch_amax<T>(amax, x, size_t(rows) * cols, stream);
    case Fp8Amax::rows: return launch_amax_rows<T>(amax, x, rows, cols, stream);
    case Fp8Amax::cols: return launch_amax_cols<T>(amax, x, rows, cols, stream);
  }
}

[[noreturn]] void unsupported(const char* op, DType dtype) {
  throw RuntimeError(std::string(op) + ": input dtype " + dtype_name(dtype) + " is not supported (f32 or bf16)");
}

}  // namespace

void fp8_amax(DType dtype, float* amax, const void* x, int rows, int cols, Fp8Amax over, void* stream) {
  check(rows >= 0 && cols >= 0, "fp8_amax: needs rows, cols >= 0");
  switch (dtype) {
    case DType::f32: return launch_amax_over<float>(amax, x, rows, cols, over, as_stream(stream));
    case DType::bf16: return launch_amax_over<__nv_bfloat16>(amax, x, rows, cols, over, as_stream(stream));
    default: unsupported("fp8_amax", dtype);
  }
}

void fp8_quantize(DType dtype, DType q_dtype, void* q, float* scale_inv, const void* x, const float* amaxes,
                  int n_amax, int rows, int cols, bool transpose, bool per_row, float* record_amax, void* stream) {
  check(q_dtype == DType::f8e4m3 || q_dtype == DType::f8e5m2,
        std::string("fp8_quantize: codes of dtype ") + dtype_name(q_dtype) + " (f8e4m3 or f8e5m2)");
  check(rows >= 0 && cols >= 0 && n_amax >= 1, "fp8_quantize: needs rows, cols >= 0 and n_amax >= 1");
  check(!(per_row && record_amax), "fp8_quantize: record_amax with per-row scales (it records one tensor's amax)");
  // The bits of a non-negative float: the kernels' integer atomicMax is the magnitudes' max.
  uint32_t* record = reinterpret_cast<uint32_t*>(record_amax);
  switch (dtype) {
    case DType::f32:
      return launch_quantize_format<float>(q_dtype, q, scale_inv, x, amaxes, n_amax, rows, cols, transpose,
                                           per_row, record, as_stream(stream));
    case DType::bf16:
      return launch_quantize_format<__nv_bfloat16>(q_dtype, q, scale_inv, x, amaxes, n_amax, rows, cols, transpose,
                                                   per_row, record, as_stream(stream));
    default: unsupported("fp8_quantize", dtype);
  }
}

}  // namespace pt::gpu
