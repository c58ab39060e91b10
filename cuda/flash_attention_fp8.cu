// FP8 flash attention forward: causal, e4m3 q, k, v and probabilities on tensor cores (mma.sync,
// sm_89+), head size 64 or 128, grouped-query. Our own kernel, in flash_attention_forward.cu's
// arrangement; the algorithm is core/common/fp8_attention.h's, which CpuOps emulates.
//
// Computes, per (b, h), key/value head g = h / (NH / NKV), query row t, keys j <= t in tiles of
// kFp8AttnKeyTile = 64 from key 0, on the codes and scales of attention_fp8_cast.cu:
//   c = (sq_inv sk_inv) log2(e) / sqrt(HS),  x_j = c * dot(qcode_t, kcode_j)   (a plain multiply)
//   per tile: m' = max(m, max_j x_j), alpha = exp2(m - m') (0 while m = -inf), p_j = exp2(x_j - m'),
//             l = l alpha + sum_j p_j,  acc = acc alpha + sum_j e4m3(256 p_j) vcode_j,  m = m'
//   out_t = acc (sv_inv / 256) / l  (bf16),  lse_t = (m + log2 l) ln 2  (f32)
// into out [B, T, NH HS] and lse [B, NH, T]. x - m' is its own subtraction (__fsub_rn) and c x its
// own multiply (__fmul_rn): no FMA fuses them, as the emulation computes them.
//
// Tiles: one block of 4 warps (128 threads) per (128-query tile, b h), the tiles launched longest
// first; each warp owns 32 query rows as two 16-row m-tiles, so every K or V fragment feeds two
// products. Keys go by 64-key tiles, double-buffered with cp.async (the next tile loads while this
// one is used); K rows past T are zero-filled, V^T's are zero codes already (vt is padded to Tpad).
// Per key tile and warp, one m-tile at a time (so that one strip of scores is live beside acc):
//   1. S = Q K^T (16 x 64) in HS / 32 k-steps of m16n8k32: an e4m3 16 x 32 tile of row-major bytes
//      is, byte for byte, a 16 x 16 b16 tile, so ldmatrix.x4 (flash_attention_mma.cuh's pattern X,
//      on byte offsets) gives the A fragment (Q: kept in registers at HS 64) and pattern Y the B
//      fragments of two 8-key n-tiles of K ([key][hd] bytes);
//   2. x = c S, the causal mask (-inf) only where the tile reaches past the strip's first row;
//      tiles wholly after the warp's rows are skipped;
//   3. the online softmax of fp8_attention.h per row (max over the row's quad of lanes), each
//      thread keeping a partial l for its columns, added over the quad at the end;
//   4. P's codes: the S accumulators of 4 adjacent n-tiles (32 keys) are the A fragment of an
//      m16n8k32 after cvt.rn.satfinite.e4m3x2.f32 of 256 p: a0 = row g {tile 0 c0 c1, tile 1 c0 c1},
//      a1 = row g+8 {c2 c3 of the same}, a2/a3 with tiles 2, 3; so A's k-position 4i + e holds key
//      2i + (e & 1) + 8 (e >> 1) of each 16, which is where the cast kernel stored V^T's codes
//      (fp8_attn_v_position);
// then acc += P V for both m-tiles: V^T's [hd][key] bytes give two 8-channel n-tiles per
// ldmatrix.x4 (pattern Y). Shared-memory rows are padded by 16 bytes (row strides of 80 or 144
// bytes: the 8 rows of one ldmatrix matrix fall in 8 distinct 16-byte bank groups, conflict-free;
// rows stay 16-byte aligned for cp.async). At the end acc / l goes through shared memory (as bf16
// [128][HS + 8], over the tiles' space) so that each row is written with 16-byte stores.
//
// The products: mma.sync m16n8k32 e4m3 is a tensor-core instruction on Ada (sm_89) and consumer
// Blackwell (sm_120), which run it as is. Hopper (sm_90) and sm_100 have no such mma.sync: ptxas
// expands each into conversions to f16 and two f16 products (+17 SASS instructions per mma, from
// the cubins' code size), re-converting per product the fragments several products share, and ran
// this kernel out of registers (spills at both head sizes). There the kernel converts each fragment
// once, as it is loaded, with cvt.rn.f16x2.e4m3x2 (exact) and multiplies with m16n8k16 f16
// products (Operand and mma_k32 below): the same products, summed in fp32.
//
// Resources (ptxas, nvcc 13.0; test/attention_ptx_check.sh prints them): 128 threads; dynamic
// shared memory 128 (HS + 16) + 2 x 64 (HS + 16) + 2 x HS x 80 bytes = 30,720 (HS 64) / 57,344
// (HS 128); launch bounds (128, 2), two blocks (8 warps) per SM. Registers, no spills: sm_90a 221
// (HS 64) / 255 (HS 128: acc 128, scores 32, Q from shared memory); sm_89 197 / 233.
// Cost (causal): 2 * 2 * B NH (T^2 / 2) HS FLOPs on tensor cores, as the bf16 forward's, e.g. GPT-2
// 124M at B 8, T 1024: 12.9 GFLOP per layer; plus the cast (attention_fp8_cast.cu). Bytes: the
// codes once from DRAM (B T (NH + 2 NKV) HS, half of bf16's), K and V^T once per query tile (from
// L2), out 2 B T NH HS, lse 4 B NH T.
// Rate: on an H200 (2026-11-28, one run; the cast apart) 190-246 TFLOP/s at T 1k-16k, HS 64 and
// 128, MHA and GQA 8:1, 0.75x the bf16 sm_80 kernel's 245-323 at the same shapes: Hopper's FP8
// rate is wgmma's alone (1979 TFLOP/s dense, H100 SXM); through mma.sync the products run at the
// f16 rate, plus the conversions. (Letting ptxas expand the e4m3 mma measured 3-4% slower still.)
// Where e4m3 mma.sync is native (Ada's FP8 rate is twice its bf16's) this arrangement should gain
// up to ~1.5x over bf16, softmax-bound beyond; not measured. A Hopper FP8 speed-up needs a wgmma
// kernel (as flash_attention_forward_sm90.cu is for bf16).
#include <cmath>

#include "core/common/fp8_attention.h"
#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"

// The FP8 products and conversions exist from sm_89 on; the build targets sm_80 too, where the
// kernel is a trap (never launched: flash_attention_fp8_available() is false there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PT_FP8_ATTN_DEVICE 1
#else
#define PT_FP8_ATTN_DEVICE 0
#endif

namespace pt::gpu {

namespace {

using namespace flash;

// The bf16 forward's tiles (flash_attention_mma.cuh); its key tile is the algorithm's, the tile
// of the running max under which P is cast (core/common/fp8_attention.h).
static_assert(kFwdBlockN == kFp8AttnKeyTile, "the kernel's key tile is the algorithm's");
static_assert(kFwdBlockN == 64, "the P fragments take a key tile as two 32-key k-steps");
constexpr int kVLd = kFwdBlockN + 16;  // bytes per row of a V^T tile ([hd][key])

template <int HS>
__host__ __device__ constexpr int qk_ld() {  // bytes per row of the Q and K tiles ([row][hd])
  return HS + 16;
}

template <int HS>
__host__ __device__ constexpr size_t fp8_smem_bytes() {
  return size_t(kFwdBlockM + 2 * kFwdBlockN) * qk_ld<HS>() + size_t(2) * HS * kVLd;  // Q, K x 2, V^T x 2
}

// 1 in the code compiled for sm_89 and later, 0 in an sm_80 build's: read back from the module the
// device loaded, it says whether the kernel there is the real one.
__device__ int fp8_attention_kernel_built = PT_FP8_ATTN_DEVICE;  // never written

#if PT_FP8_ATTN_DEVICE

// ---- the k32 e4m3 product (see the header: native on sm_89 and sm_120, converted to f16 elsewhere) ----
#if __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200
constexpr bool kNativeE4m3 = true;
#else
constexpr bool kNativeE4m3 = false;
#endif

// N registers of an e4m3 fragment (4 codes each, the lower k in the lower byte) as the products
// take them: the codes themselves where e4m3 is native; else 2N registers of f16 pairs, r[i] =
// bytes 0-1 of code register i and r[N + i] = its bytes 2-3. A k32 product is then two k16 ones:
// the first over every register's bytes 0-1, the second over bytes 2-3. A and B fragments put the
// same k at the same byte of the same lane's register, so both halves pair each k of A with the
// same k of B (the sum over k does not care which half adds it).
template <int N>
struct Operand {
  uint32_t r[kNativeE4m3 ? N : 2 * N];
};

// Two e4m3 codes (bits 0-15) as an f16 pair, exact. (Unused where e4m3 is native.)
[[maybe_unused]] __device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t two_codes) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(static_cast<uint16_t>(two_codes)));
  return r;
}

template <int N>
__device__ __forceinline__ Operand<N> operand(const uint32_t (&codes)[N]) {
  Operand<N> op;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (kNativeE4m3) {
      op.r[i] = codes[i];
    } else {
      op.r[i] = f16x2_of_e4m3x2(codes[i]);
      op.r[N + i] = f16x2_of_e4m3x2(codes[i] >> 16);
    }
  }
  return op;
}

// D += A * B, A 16 x 32 and B 32 x 8 e4m3, fp32 accumulators in the m16n8 C layout. b holds two
// n-tiles (an ldmatrix.x4 of pattern Y): B is the one whose code registers are b0 and b1.
__device__ __forceinline__ void mma_k32(float d[4], const Operand<4>& a, const Operand<4>& b, int b0, int b1) {
  if constexpr (kNativeE4m3) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[b0]), "r"(b.r[b1]));
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a.r[4 * half]), "r"(a.r[4 * half + 1]), "r"(a.r[4 * half + 2]), "r"(a.r[4 * half + 3]),
            "r"(b.r[4 * half + b0]), "r"(b.r[4 * half + b1]));
  }
}

// The two adjacent n-tiles of B that one ldmatrix.x4 (pattern Y) loads: registers 0-1 and 2-3.
__device__ __forceinline__ void mma_k32_x2(float d0[4], float d1[4], const Operand<4>& a, const Operand<4>& b) {
  mma_k32(d0, a, b, 0, 1);
  mma_k32(d1, a, b, 2, 3);
}

__device__ __forceinline__ void ldmatrix_x4_bytes(uint32_t r[4], const uint8_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// An ldmatrix.x4's 16 x 32 bytes as an operand: the A fragment of a 16 x 32 tile (pattern X) or the
// B fragments of two 8-row n-tiles (pattern Y).
__device__ __forceinline__ Operand<4> load_operand(const uint8_t* p) {
  uint32_t codes[4];
  ldmatrix_x4_bytes(codes, p);
  return operand(codes);
}

// flash_attention_mma.cuh's lane patterns on byte offsets (a b16 column is 2 bytes).
__device__ __forceinline__ int byte_offset_x(int lane, int ld) { return (lane & 15) * ld + (lane >> 4) * 16; }
__device__ __forceinline__ int byte_offset_y(int lane, int ld) {
  return ((lane & 7) + ((lane >> 4) << 3)) * ld + (lane & 8) * 2;
}

// Four probabilities as e4m3 codes of 256 p, byte i = p_i (the lower k index in the lower byte).
// cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a's code in d's upper byte, b's in the lower.
__device__ __forceinline__ uint32_t pack_p(float p0, float p1, float p2, float p3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
      : "=h"(lo)
      : "f"(__fmul_rn(p1, kFp8AttnPScale)), "f"(__fmul_rn(p0, kFp8AttnPScale)));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
      : "=h"(hi)
      : "f"(__fmul_rn(p3, kFp8AttnPScale)), "f"(__fmul_rn(p2, kFp8AttnPScale)));
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// Starts copying rows [row0, row0 + ROWS) of a byte matrix (BYTES per row, src_stride apart) into
// dst (LD bytes per row), 16-byte zeros for rows >= n_rows (src is then not read). The caller
// commits the group and waits for it. flash_attention_mma.cuh's load_tile_async does the same for
// bf16 tiles; a shared byte-generic loader cost the sm_80 kernel's HS 128 build (255 registers, at
// the edge) 24 bytes of spills on sm_90a, so the two stay apart.
template <int ROWS, int BYTES, int LD>
__device__ __forceinline__ void load_bytes_async(uint8_t* dst, const uint8_t* src, size_t src_stride, int row0,
                                                 int n_rows) {
  constexpr int kChunks = BYTES / 16, kRowStep = kFwdThreads / kChunks;
  static_assert(kFwdThreads % kChunks == 0 && ROWS % kRowStep == 0, "load_bytes_async: whole rows per pass");
  // One pointer per thread, stepped by whole passes (cheaper in registers than an address per chunk).
  const int r = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 16;
  const uint8_t* from = src + static_cast<size_t>(row0 + r) * src_stride + c;
  const size_t step = static_cast<size_t>(kRowStep) * src_stride;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const bool valid = row0 + r + i * kRowStep < n_rows;
    cp_async_16(dst + (r + i * kRowStep) * LD + c, valid ? from : src, valid);
    from += step;
  }
}

// fp8_attention.h's online-softmax step for row r (0: g, 1: g + 8) of a 16-row strip of scaled,
// masked scores x (s[j][e]: row g + 8 (e / 2), key 8 j + 2 t + e % 2): the scores become p, the
// output and this thread's partial l are rescaled by alpha.
template <int NT, int NO>
__device__ __forceinline__ void softmax_row_step(float (&s)[NT][4], float (&o)[NO][4], int r, float& m_run,
                                                 float& l_run) {
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m_run, mx);
  // Every row sees key 0 in the first tile, so m_new is finite; the guard keeps a row that saw no
  // key yet at p = 0 instead of NaN (-inf - -inf).
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = m_run == -INFINITY ? 0.0f : exp2f(__fsub_rn(m_run, m_use));
  m_run = m_new;
  float rowsum = 0.0f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 2 * r; e < 2 * r + 2; ++e) {
      s[j][e] = exp2f(__fsub_rn(s[j][e], m_use));
      rowsum += s[j][e];
    }
  }
  l_run = l_run * alpha + rowsum;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    o[j][2 * r] *= alpha;
    o[j][2 * r + 1] *= alpha;
  }
}

#endif  // PT_FP8_ATTN_DEVICE

template <int HS>
__global__ void __launch_bounds__(kFwdThreads, 2)
    flash_fp8_forward_kernel(bf16* out, float* lse, const uint8_t* qc, const uint8_t* kc, const uint8_t* vtc,
                             const float* scale_inv, int T, int NH, int NKV, float scale_log2) {
#if PT_FP8_ATTN_DEVICE
  constexpr int LD = qk_ld<HS>(), BM = kFwdBlockM, BN = kFwdBlockN, MT = kFwdMTiles, KS = HS / 32;
  constexpr bool kQInRegs = HS <= 64;  // 16 registers at HS 64; at HS 128 acc needs them
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint8_t* sQ = smem_raw;               // [BM][LD]
  uint8_t* sK = sQ + BM * LD;           // [2][BN][LD]
  uint8_t* sV = sK + 2 * BN * LD;       // [2][HS][kVLd]

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const int Tpad = fp8_attn_padded_keys(T);
  const uint8_t* qhead = qc + (static_cast<size_t>(b) * NH + h) * T * HS;
  const uint8_t* khead = kc + (static_cast<size_t>(b) * NKV + kvh) * T * HS;
  const uint8_t* vhead = vtc + (static_cast<size_t>(b) * NKV + kvh) * HS * Tpad;
  const float* inv = scale_inv + static_cast<size_t>(b) * (NH + 2 * NKV);
  const float c = __fmul_rn(__fmul_rn(inv[h], inv[NH + kvh]), scale_log2);  // exact: powers of two
  const int q0 = qt * BM;
  const int n_kt = ceil_div(min(q0 + BM, T), BN);  // key tiles up to the block's last row
  const int wrow = warp * kFwdWarpRows;              // the warp's first row within the tile
  const int wq0 = q0 + wrow;                      // ... and in the sequence

  load_bytes_async<BM, HS, LD>(sQ, qhead, HS, q0, T);
  load_bytes_async<BN, HS, LD>(sK, khead, HS, 0, T);
  load_bytes_async<HS, BN, kVLd>(sV, vhead, Tpad, 0, HS);
  cp_async_commit();

  float o[MT][HS / 8][4];
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.0f;
    m_run[m][0] = m_run[m][1] = -INFINITY;
    l_run[m][0] = l_run[m][1] = 0.0f;
  }
  Operand<4> qf[kQInRegs ? MT : 1][kQInRegs ? KS : 1];

#pragma unroll 1
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {  // prefetch the next tile into the other buffer (read in iteration kt - 1)
      load_bytes_async<BN, HS, LD>(sK + (stage ^ 1) * BN * LD, khead, HS, (kt + 1) * BN, T);
      load_bytes_async<HS, BN, kVLd>(sV + (stage ^ 1) * HS * kVLd, vhead + (kt + 1) * BN, Tpad, 0, HS);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "tile kt"
    cp_async_wait<1>();
    __syncthreads();

    if constexpr (kQInRegs) {
      if (kt == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int kk = 0; kk < KS; ++kk)
            qf[m][kk] = load_operand(sQ + (wrow + m * 16) * LD + kk * 32 + byte_offset_x(lane, LD));
      }
    }
    // Skip a tile whose keys all follow the warp's rows, and warps wholly past T.
    const bool active = kt * BN <= wq0 + kFwdWarpRows - 1 && wq0 < T;
    if (active) {
      const uint8_t* k_s = sK + stage * BN * LD;
      const uint8_t* v_s = sV + stage * HS * kVLd;
      // One m-tile at a time: S = Q K^T (16 x 64), x = c S, the mask, the softmax step, and P as
      // e4m3 codes (4 per register), so that one strip of scores (32 registers) is live beside acc
      // rather than two; K's fragments are loaded once per m-tile for it.
      uint32_t pc[MT][BN / 32][4];  // P's codes: the A fragments of the k-steps of P V
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float s[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        // The k-steps in a loop where Q comes from shared memory (HS 128): unrolled, ptxas loads
        // every step's K fragments ahead and runs out of registers beside acc.
#pragma unroll(kQInRegs ? KS : 1)
        for (int kk = 0; kk < KS; ++kk) {
          Operand<4> a;
          if constexpr (kQInRegs)
            a = qf[m][kk];
          else
            a = load_operand(sQ + (wrow + m * 16) * LD + kk * 32 + byte_offset_x(lane, LD));
#pragma unroll
          for (int np = 0; np < BN / 16; ++np)
            mma_k32_x2(s[2 * np], s[2 * np + 1], a,
                       load_operand(k_s + np * 16 * LD + kk * 32 + byte_offset_y(lane, LD)));
        }
        // x = c S (its own multiply), the causal mask where some key follows the strip's first row.
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn(s[nt][e], c);
        if (kt * BN + BN - 1 > wq0 + m * 16) causal_mask(s, wq0 + m * 16, kt * BN, g, t);
#pragma unroll
        for (int r = 0; r < 2; ++r) softmax_row_step(s, o[m], r, m_run[m][r], l_run[m][r]);
        // S's n-tiles 4 kk .. 4 kk + 3 are k-step kk's A fragment: a0 = row g: tile 0 c0 c1, tile 1
        // c0 c1; a1 = row g + 8: their c2 c3; a2, a3: the same of tiles 2 and 3.
#pragma unroll
        for (int kk = 0; kk < BN / 32; ++kk) {
          const int j = 4 * kk;
          pc[m][kk][0] = pack_p(s[j][0], s[j][1], s[j + 1][0], s[j + 1][1]);
          pc[m][kk][1] = pack_p(s[j][2], s[j][3], s[j + 1][2], s[j + 1][3]);
          pc[m][kk][2] = pack_p(s[j + 2][0], s[j + 2][1], s[j + 3][0], s[j + 3][1]);
          pc[m][kk][3] = pack_p(s[j + 2][2], s[j + 2][3], s[j + 3][2], s[j + 3][3]);
        }
      }

      // acc += P V, 32 keys per k-step; each V^T fragment feeds both m-tiles. A loop, not unrolled,
      // for the same reason as above (the two steps' V fragments at once do not fit at HS 128); a
      // select picks the step's P codes, so that pc stays in registers.
      static_assert(BN / 32 == 2, "P V: two k-steps per key tile");
#pragma unroll 1
      for (int kk = 0; kk < BN / 32; ++kk) {
        Operand<4> a[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          uint32_t codes[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) codes[i] = kk == 0 ? pc[m][0][i] : pc[m][1][i];
          a[m] = operand(codes);
        }
#pragma unroll
        for (int np = 0; np < HS / 16; ++np) {
          const Operand<4> bv = load_operand(v_s + np * 16 * kVLd + kk * 32 + byte_offset_y(lane, kVLd));
#pragma unroll
          for (int m = 0; m < MT; ++m) mma_k32_x2(o[m][2 * np], o[m][2 * np + 1], a[m], bv);
        }
      }
    }
    __syncthreads();  // this stage is read: the next iteration's prefetch overwrites it
  }
  cp_async_wait<0>();

  // acc (sv_inv / 256) / l as bf16 into shared memory (over the tiles: every warp is past the
  // loop's last barrier), the warp's own 32 rows, then out with 16-byte stores.
  constexpr int OLD = HS + 8;  // bf16 per staged row (16 bytes of padding)
  static_assert(size_t(BM) * OLD * sizeof(bf16) <= fp8_smem_bytes<HS>(), "the output stage fits the tiles' space");
  bf16* stage_out = reinterpret_cast<bf16*>(smem_raw);
  const float out_scale = __fmul_rn(inv[NH + NKV + kvh], 1.0f / kFp8AttnPScale);  // sv_inv / 256: exact
  const int C = NH * HS;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = row_sum_quad(l_run[m][r]);
      const float scale = l > 0.0f ? out_scale / l : 0.0f;
      const int row = wrow + m * 16 + g + 8 * r, qi = q0 + row;
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt)
        store_pair(stage_out + row * OLD + nt * 8 + 2 * t, o[m][nt][2 * r] * scale, o[m][nt][2 * r + 1] * scale);
      if (t == 0 && qi < T) lse[(static_cast<size_t>(b) * NH + h) * T + qi] = (m_run[m][r] + log2f(l)) * kLn2;
    }
  }
  __syncwarp();
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < kFwdWarpRows * kChunks / kWarpSize; ++i) {
    const int e = lane + i * kWarpSize, r = e / kChunks, col = (e % kChunks) * 8, qi = wq0 + r;
    if (qi < T)
      *reinterpret_cast<int4*>(out + (static_cast<size_t>(b) * T + qi) * C + static_cast<size_t>(h) * HS + col) =
          *reinterpret_cast<const int4*>(stage_out + (wrow + r) * OLD + col);
  }
#else
  __trap();  // never launched: flash_attention_fp8_available() is false without sm_89+ code
#endif
}

template <int HS>
void launch_fp8_forward(void* out, float* lse, const Fp8AttentionCodes& codes, int B, int T, int NH, int NKV,
                        cudaStream_t stream) {
  const size_t smem = fp8_smem_bytes<HS>();
  use_dynamic_shared(flash_fp8_forward_kernel<HS>, smem, [] { return "FP8 flash attention"; });
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kFwdBlockM)), static_cast<unsigned>(B * NH));
  flash_fp8_forward_kernel<HS><<<grid, kFwdThreads, smem, stream>>>(static_cast<bf16*>(out), lse, codes.q, codes.k,
                                                                 codes.vt, codes.scale_inv, T, NH, NKV,
                                                                 fp8_attn_scale_log2(HS));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_fp8_available() {
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (major * 10 + minor < 89) return false;
    int built = 0;  // the sm_89+ code, not an sm_80 build's trap (which an sm_89 GPU would run)
    if (cudaMemcpyFromSymbol(&built, fp8_attention_kernel_built, sizeof(built)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return built == 1;
  }();
  return available;
}

void flash_attention_fp8_forward(void* out, float* lse, const Fp8AttentionCodes& codes, int B, int T, int NH, int NKV,
                                 int HS, void* stream) {
  if (B <= 0 || T <= 0) return;
  check_flash_heads("FP8 flash attention", B, NH, NKV);
  check(flash_attention_fp8_available(),
        "FP8 flash attention: needs a GPU of compute capability 8.9+ and a build with code for it");
  with_flash_head_size("FP8 flash attention", HS, [&](auto hs) {
    launch_fp8_forward<decltype(hs)::value>(out, lse, codes, B, T, NH, NKV, as_stream(stream));
  });
}

}  // namespace pt::gpu
