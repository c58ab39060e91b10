// Building blocks of the bf16 tensor-core flash attention (flash_attention_forward.cu,
// flash_attention_backward.cu), sm_80 and later: the mma.sync.m16n8k16 bf16 -> fp32 instruction,
// ldmatrix loads of its operand fragments from shared memory, and cp.async tile copies from
// global memory. Device code only.
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
// ldmatrix.x4 loads four 8 x 8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// and matrix i lands in register i of every lane (lane l holds row l/4, columns 2(l%4)..+1; with
// .trans, column l/4, rows 2(l%4)..+1). Two lane-to-address patterns cover every operand here:
//   pattern X (row = lane % 16, column + 8 for lanes 16-31):
//     - an A fragment of a row-major 16 x 16 block (a0..a3 as above);
//     - with .trans, the B fragments of two adjacent n-tiles of a [k][n] block (V in P V, dO and
//       Q in the backward's P^T dO and dS^T Q, K in dS K): r0, r1 = n-tile 0, r2, r3 = n-tile 1;
//   pattern Y (row = lane % 8 + 8 (lane / 16), column + 8 for lanes 8-15 and 24-31):
//     - the B fragments of two adjacent n-tiles of an [n][k] block (K in Q K^T, Q and dO in the
//       backward's K Q^T and V dO^T): r0, r1 = n-tile 0, r2, r3 = n-tile 1;
//     - with .trans, the A fragment of a 16 x 16 block stored transposed ([k][m]: dS^T in dS K).
//
// Shared-memory tiles are [rows][HS] bf16 with a row stride of HS + 8 elements (16 bytes of
// padding): the row stride is 4 words (mod 32), so the 8 row addresses of one ldmatrix matrix
// (16 bytes each) fall in 8 disjoint groups of 4 banks: conflict-free, and every row start stays
// 16-byte aligned for cp.async and ldmatrix.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_common.h"

namespace pt::gpu::flash {

using bf16 = __nv_bfloat16;

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

// D0 += A * B0 and D1 += A * B1 for the two adjacent n-tiles one ldmatrix.x4 loads (b[0..1], b[2..3]).
__device__ __forceinline__ void mma_x2(float d0[4], float d1[4], const uint32_t a[4], const uint32_t b[4]) {
  mma(d0, a, b);
  mma(d1, a, b + 2);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// This lane's element offset, within a 16 x 16 block of row stride ld, for the two patterns above.
__device__ __forceinline__ int lane_offset_x(int lane, int ld) { return (lane & 15) * ld + (lane >> 4) * 8; }
__device__ __forceinline__ int lane_offset_y(int lane, int ld) {
  return ((lane & 7) + ((lane >> 4) << 3)) * ld + (lane & 8);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// The accumulators of two adjacent 16 x 8 tiles (columns 0-7 and 8-15), rounded to bf16, as the
// A fragment of the 16 x 16 matrix they form.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// p[0..1] = (x, y) rounded to bf16, one 32-bit store.
__device__ __forceinline__ void store_pair(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

// ---- the forward's per-tile softmax, shared by the sm_80 and the Hopper kernels -----------------
// Both hold a 16-row strip of scores as NT groups of the m16n8 C layout (s[j][e]: row g + 8 (e / 2),
// column 8 j + 2 t + e % 2; wgmma's accumulators repeat it along N), and the row's output the same
// way over the head's columns.

// -inf where key key0 + 8 j + 2 t + e % 2 follows query row0 + g + 8 (e / 2) (causal). With an
// offset (a block: kBounded, see FlashProblem), where it follows the query's position + delta or
// is past the block's keys (key_end on).
template <int NT, bool kBounded = false>
__device__ __forceinline__ void causal_mask(float (&s)[NT][4], int row0, int key0, int g, int t, int delta = 0,
                                            int key_end = 0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qi = row0 + g + 8 * (e >> 1), kj = key0 + j * 8 + 2 * t + (e & 1);
      if (kBounded ? kj > qi + delta || kj >= key_end : kj > qi) s[j][e] = -INFINITY;
    }
}

// The online softmax step of row r (0: g, 1: g + 8) in the base-2 domain: the running max m stays
// in raw score units and the scale is folded into one FFMA per element, p = 2^(s scale log2(e) -
// m scale log2(e)); the scores become p, the output and the partial sum l (this thread's columns,
// added over the row's 4 lanes only at the end) are rescaled by 2^((m_old - m_new) scale log2(e)).
template <int NT, int NO>
__device__ __forceinline__ void softmax_row_step(float (&s)[NT][4], float (&o)[NO][4], int r, float& m_run,
                                                 float& l_run, float scale_log2) {
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m_run, mx);
  const float m_scaled = m_new == -INFINITY ? 0.0f : m_new * scale_log2;  // masked so far: 0, not NaN
  const float alpha = exp2f(m_run * scale_log2 - m_scaled);
  m_run = m_new;
  float rowsum = 0.0f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float p0 = exp2f(fmaf(s[j][2 * r], scale_log2, -m_scaled));
    const float p1 = exp2f(fmaf(s[j][2 * r + 1], scale_log2, -m_scaled));
    s[j][2 * r] = p0;
    s[j][2 * r + 1] = p1;
    rowsum += p0 + p1;
  }
  l_run = l_run * alpha + rowsum;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    o[j][2 * r] *= alpha;
    o[j][2 * r + 1] *= alpha;
  }
}

// A row's final sum over its quad of lanes (l) and its lse = (m scale log2(e) + log2 l) ln 2.
__device__ __forceinline__ float row_sum_quad(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  return l + __shfl_xor_sync(0xffffffffu, l, 2);
}
__device__ __forceinline__ float row_lse(float m_run, float l, float scale_log2) {
  return (m_run * scale_log2 + log2f(l)) * kLn2;
}

// ---- what the sm_80 kernels compute on --------------------------------------------------------
// Where the operands live and which keys each query sees. Causal self-attention on a packed qkv
// (q, k and v interleaved in one row per position) and a block of queries against keys held
// apart (another context-parallel rank's block, a KV cache) are both this. Element c of head h of
// position i in batch b is at q[(b Tq + i) q_stride + h HS + c] (k, v: Tk, kv_stride, their
// key/value head); out and dout are [B, Tq, NH HS]; lse and D [B, NH, Tq].
struct FlashProblem {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  size_t q_stride, kv_stride;  // elements from one position to the next (q and dq; k, v, dk and dv)
  size_t kv_batch_stride;      // ... and from one sequence's keys to the next's: Tk kv_stride (a
                               // field, not derived in the kernel: deriving it there cost the HS
                               // 128 block forward 32 bytes of spills on sm_80)
  int Tq, Tk, NH, NKV;
  // Query i sees key j iff j <= i + delta (and j < Tk); -Tq <= delta <= Tk: 0 is causal attention
  // of a sequence on itself, Tk sees every key. The backward needs delta >= 0 (every query sees
  // key 0); the forward takes any (a row that sees no key gets out 0 and lse -inf, as may a split
  // of a KV cache's keys).
  int delta;
  // Key tiles (of the forward's 64 keys) per split of the keys (flash-decoding: blockIdx.z takes
  // tiles [z split_tiles, (z + 1) split_tiles)); kOneSplit: one split, every tile.
  int split_tiles;
  // The softmax scale; 0: 1/sqrt(HS). (Host side only: the launchers pass it to the kernels.)
  float scale = 0.0f;
};
// The scale of the scores: `scale` where given (a head zero-padded to the kernel's head size keeps
// its own, 1/sqrt of its real size), else 1/sqrt(HS).
inline float softmax_scale(float scale, int HS) {
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(HS));
}
// The backward's gradients, in the layouts of q, k, v (a block's are added to, packed ones written).
struct FlashGrads {
  const bf16* dout;
  bf16* dq;
  bf16* dk;
  bf16* dv;
};

// Host checks and dispatch shared by the flash kernels' launchers (bf16, FP8, Hopper), `what`
// naming the kernel in their messages: the grid's y limit (B NH blocks), whole key/value groups,
// and fn(std::integral_constant<int, HS>{}) for the head sizes the kernels are compiled for (64,
// 128; their callers check first and send other head sizes elsewhere).
inline void check_flash_heads(const char* what, int B, int NH, int NKV) {
  check(static_cast<long long>(B) * NH <= 65535, std::string(what) + ": B * n_heads exceeds the grid's y limit 65535");
  check(NKV > 0 && NH % NKV == 0, std::string(what) + ": n_kv_heads must divide n_heads");
}
template <int... Sizes, typename Fn>
void with_head_size(const char* what, int HS, Fn&& fn) {
  bool found = false;
  ((HS == Sizes && !found ? (fn(std::integral_constant<int, Sizes>{}), found = true) : false), ...);
  if (found) return;
  std::string sizes;
  ((sizes += (sizes.empty() ? "" : ", ") + std::to_string(Sizes)), ...);
  throw RuntimeError(std::string(what) + ": head size " + std::to_string(HS) + " has no kernel (" + sizes + ")");
}
template <typename Fn>
void with_flash_head_size(const char* what, int HS, Fn&& fn) {
  with_head_size<64, 128>(what, HS, std::forward<Fn>(fn));
}
// The same for the Hopper kernels (flash_attention_*_sm90.cu), which add head size 256.
template <typename Fn>
void with_hopper_head_size(const char* what, int HS, Fn&& fn) {
  with_head_size<64, 128, 256>(what, HS, std::forward<Fn>(fn));
}
// The forward kernels' tiles (flash_attention_forward.cu, and flash_attention_fp8.cu in the same
// arrangement): 4 warps, each owning 32 query rows as two 16-row m-tiles, so 128 queries a block,
// against tiles of 64 keys.
constexpr int kFwdWarps = 4;
constexpr int kFwdThreads = kFwdWarps * kWarpSize;
constexpr int kFwdMTiles = 2;                         // 16-row m-tiles per warp
constexpr int kFwdWarpRows = 16 * kFwdMTiles;         // 32
constexpr int kFwdBlockM = kFwdWarps * kFwdWarpRows;  // 128 queries per block
constexpr int kFwdBlockN = 64;                        // keys per tile

constexpr int kOneSplit = 1 << 30;  // FlashProblem::split_tiles of a call that does not split its keys

// Causal self-attention on a packed qkv [B, T, (NH + 2 NKV) HS] (attention_forward's layout).
inline FlashProblem packed_problem(const void* qkv, int T, int NH, int NKV, int HS, float scale = 0.0f) {
  const bf16* base = static_cast<const bf16*>(qkv);
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;
  return {base, base + static_cast<size_t>(NH) * HS, base + static_cast<size_t>(NH + NKV) * HS, rs, rs, rs * T, T, T, NH,
          NKV, 0, kOneSplit, scale};
}
// q [B, Tq, NH HS] against k, v [B, Tk, NKV HS], query i at position q_pos0 + i and key j at
// k_pos0 + j (Ops::attention_block_forward); delta clamped to [-Tq, Tk] (beyond either end nothing
// changes).
inline FlashProblem block_problem(const void* q, const void* k, const void* v, int Tq, int Tk, int NH, int NKV, int HS,
                                  int q_pos0, int k_pos0, bool causal) {
  const long long gap = causal ? static_cast<long long>(q_pos0) - k_pos0 : Tk;
  const size_t kv_stride = static_cast<size_t>(NKV) * HS;
  return {static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
          static_cast<size_t>(NH) * HS, kv_stride, kv_stride * Tk, Tq, Tk, NH, NKV,
          static_cast<int>(gap < -Tq ? -Tq : gap > Tk ? Tk : gap), kOneSplit};
}

// ---- cp.async: global -> shared without a trip through registers (sm_80+) ----------------------

// 16 bytes from src to dst, or 16 zero bytes when !valid (src is then not read, but must still be a
// valid address: the callers pass the tile's base).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying rows [row0, row0 + ROWS) of a [T][src_stride] bf16 matrix (columns [0, HS)) into
// dst[r * (HS + 8) + c], zeros for rows >= T, with THREADS threads. src and src_stride * 2 bytes
// must be 16-byte aligned (the launchers check: HS % 8 == 0 and aligned base pointers). The
// caller commits the group and waits for it.
template <int HS, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, size_t src_stride, int row0, int T) {
  constexpr int kChunks = HS / 8;                // 16-byte chunks per row
  constexpr int kRowStep = THREADS / kChunks;    // rows covered by one pass of the block
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "load_tile_async: whole rows per pass");
  // One pointer per thread, stepped by whole passes: cheaper in registers than an address per chunk.
  const int r = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
  const bf16* from = src + static_cast<size_t>(row0 + r) * src_stride + c;
  const size_t step = static_cast<size_t>(kRowStep) * src_stride;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const bool valid = row0 + r + i * kRowStep < T;
    cp_async_16(dst + (r + i * kRowStep) * row_stride<HS>() + c, valid ? from : src, valid);
    from += step;
  }
}

}  // namespace pt::gpu::flash
