// Flash attention forward, bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators), causal,
// head size 64 or 128, sm_80 and later. Our own kernel, in the FlashAttention-2 arrangement.
//
// Computes, per (b, h) and query i (scale = 1/sqrt(HS), keys j <= i):
//   lse_i = log sum_j exp(scale q_i.k_j),   out_i = sum_j exp(scale q_i.k_j - lse_i) v_j
// from qkv [B, T, (NH + 2 NKV) HS] into out [B, T, C] (bf16) and lse [B, NH, T] (fp32), where
// k and v are those of key/value head h / (NH / NKV) (grouped-query attention; NKV == NH is
// multi-head). The key/value head is only an address: no K/V head is ever repeated in memory.
//
// Tiles: one block of 4 warps (128 threads) per (128-query tile, b*h), the tiles launched longest
// first (the last query tile attends to the most keys). Each warp owns 32 query rows as two
// 16-row m-tiles, so every K or V fragment read from shared memory feeds two mma (32 FLOP per
// shared byte). Keys go by 64-row tiles, double-buffered: while the block computes on tile kt,
// cp.async copies tile kt + 1 into the other buffer (zero-filled past T).
// Per key tile and warp:
//   1. S = Q K^T (32 x 64): Q fragments by ldmatrix (kept in registers for the whole loop at
//      HS = 64), K fragments by ldmatrix (two n-tiles per instruction);
//   2. the causal mask only where the tile reaches past the warp's first row (one tile per warp
//      at most); tiles wholly after the warp's rows are skipped;
//   3. online softmax in the base-2 domain: the running max m stays in raw score units and the
//      scale is folded into one FFMA per element, p = 2^(s scale log2(e) - m scale log2(e));
//      the output and sum are rescaled by 2^((m_old - m_new) scale log2(e)); each thread keeps a
//      partial row sum for its columns, added over the row's 4 lanes only at the end;
//   4. O += P V: the fp32 P accumulators, rounded to bf16, are the A fragments directly; V
//      fragments by ldmatrix.trans.
// At the end O / l goes through shared memory (the warp's own Q rows) so that each row is written
// with 16-byte stores, and lse = (m scale log2(e) + log2 l) ln 2. The keys are visited from key 0,
// which every row sees, so the running max is finite from the first tile; a guard still keeps a
// fully masked row at 0 instead of NaN.
//
// Resources (ptxas, sm_90a; test/attention_ptx_check.sh prints them): 128 threads, shared memory
// (128 + 4 x 64) x (HS + 8) x 2 bytes = 55,296 (HS 64) / 104,448 (HS 128), so two blocks fit an
// SM; launch bounds (128, 2) give each thread up to 255 registers: HS 128 holds O (128), S (64)
// and the fragments; no spills.
// Cost (causal): 2 * 2 * B*NH * (T^2/2) * HS FLOPs on tensor cores (S and P V), e.g. GPT-2 124M at
// B = 8, T = 1024: 12.9 GFLOP per layer, ~13 us at 989 TFLOP/s (the same under GQA: every query
// head still meets every key). Bytes: Q, O once (2 * B*T*NH*HS * 2), K/V once per query tile
// (from L2) but once from DRAM: 2 * B*T*NKV*HS * 2; lse 4 B per row. Measured on an H200
// (2026-11-27, bench/RESULTS.md): 220-326 TFLOP/s at T 1k-16k, head sizes 64 and 128, MHA and GQA
// alike: FlashAttention-2's published H100 level (the 64-query kernel before it did 104-150 on an
// H100). cuDNN's Hopper kernels reach 280-620 with wgmma, which mma.sync cannot.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"

namespace pt::gpu {

namespace {

using namespace flash;

constexpr int kFwdWarps = 4;
constexpr int kFwdThreads = kFwdWarps * kWarpSize;
constexpr int kFwdMTiles = 2;                           // 16-row m-tiles per warp
constexpr int kFwdWarpRows = 16 * kFwdMTiles;           // 32
constexpr int kFwdBlockM = kFwdWarps * kFwdWarpRows;    // 128 queries per block
constexpr int kFwdBlockN = 64;                        // keys per tile

template <int HS>
constexpr size_t forward_smem_bytes() {
  return size_t(kFwdBlockM + 4 * kFwdBlockN) * row_stride<HS>() * sizeof(bf16);  // Q, K x 2, V x 2
}

template <int HS>
__global__ void __launch_bounds__(kFwdThreads, 2)
    flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, int NKV, float scale_log2) {
  constexpr int LD = row_stride<HS>(), BM = kFwdBlockM, BN = kFwdBlockN, MT = kFwdMTiles, KS = HS / 16;
  constexpr bool kQInRegs = HS <= 64;  // 32 registers at HS 64; at HS 128 O needs them
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BM][LD]
  bf16* sK = sQ + BM * LD;                        // [2][BN][LD]
  bf16* sV = sK + 2 * BN * LD;                    // [2][BN][LD]

  const int C = NH * HS;
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;  // qkv row stride
  const int qt = gridDim.x - 1 - blockIdx.x;                 // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const bf16* row_b = qkv + static_cast<size_t>(b) * T * rs;
  const bf16* qhead = row_b + static_cast<size_t>(h) * HS;
  const bf16* khead = row_b + static_cast<size_t>(NH + kvh) * HS;
  const bf16* vhead = row_b + static_cast<size_t>(NH + NKV + kvh) * HS;
  const int q0 = qt * BM;
  const int n_kt = ceil_div(min(q0 + BM, T), BN);  // key tiles up to the block's last row
  const int wrow = warp * kFwdWarpRows;            // the warp's first row within the tile
  const int wq0 = q0 + wrow;                       // ... and in the sequence

  load_tile_async<HS, BM, kFwdThreads>(sQ, qhead, rs, q0, T);
  load_tile_async<HS, BN, kFwdThreads>(sK, khead, rs, 0, T);
  load_tile_async<HS, BN, kFwdThreads>(sV, vhead, rs, 0, T);
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
  uint32_t qf[kQInRegs ? MT : 1][kQInRegs ? KS : 1][4];

#pragma unroll 1
  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {  // prefetch the next tile into the other buffer (read in iteration kt - 1)
      load_tile_async<HS, BN, kFwdThreads>(sK + (stage ^ 1) * BN * LD, khead, rs, (kt + 1) * BN, T);
      load_tile_async<HS, BN, kFwdThreads>(sV + (stage ^ 1) * BN * LD, vhead, rs, (kt + 1) * BN, T);
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
            ldmatrix_x4(qf[m][kk], sQ + (wrow + m * 16) * LD + kk * 16 + lane_offset_x(lane, LD));
      }
    }
    // Skip a tile whose keys all follow the warp's rows, and warps wholly past T.
    const bool active = kt * BN <= wq0 + kFwdWarpRows - 1 && wq0 < T;
    if (active) {
      const bf16* k_s = sK + stage * BN * LD;
      const bf16* v_s = sV + stage * BN * LD;
      float s[MT][BN / 8][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) s[m][nt][0] = s[m][nt][1] = s[m][nt][2] = s[m][nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if constexpr (kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[m][i] = qf[m][kk][i];
          } else {
            ldmatrix_x4(a[m], sQ + (wrow + m * 16) * LD + kk * 16 + lane_offset_x(lane, LD));
          }
        }
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t bk[4];
          ldmatrix_x4(bk, k_s + np * 16 * LD + kk * 16 + lane_offset_y(lane, LD));
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_x2(s[m][2 * np], s[m][2 * np + 1], a[m], bk);
          }
        }
      }

      // The causal mask, only where some key of the tile follows the warp's first row.
      if (kt * BN + BN - 1 > wq0) {
#pragma unroll
        for (int m = 0; m < MT; ++m) causal_mask(s[m], wq0 + m * 16, kt * BN, g, t);
      }

#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) softmax_row_step(s[m], o[m], r, m_run[m][r], l_run[m][r], scale_log2);

      // O += P V, 16 keys per k-step.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) acc_to_a(a[m], s[m][2 * kk], s[m][2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < HS / 16; ++np) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_s + kk * 16 * LD + np * 16 + lane_offset_x(lane, LD));
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_x2(o[m][2 * np], o[m][2 * np + 1], a[m], bv);
          }
        }
      }
    }
    __syncthreads();  // this stage is read: the next iteration's prefetch overwrites it
  }
  cp_async_wait<0>();

  // O / l into the warp's own Q rows of shared memory (only this warp read them), then out.
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = row_sum_quad(l_run[m][r]);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int row = wrow + m * 16 + g + 8 * r, qi = q0 + row;
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt)
        store_pair(sQ + row * LD + nt * 8 + 2 * t, o[m][nt][2 * r] * inv, o[m][nt][2 * r + 1] * inv);
      if (t == 0 && qi < T)
        lse[(static_cast<size_t>(b) * NH + h) * T + qi] = row_lse(m_run[m][r], l, scale_log2);
    }
  }
  __syncwarp();
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < kFwdWarpRows * kChunks / kWarpSize; ++i) {
    const int e = lane + i * kWarpSize, r = e / kChunks, c = (e % kChunks) * 8, qi = wq0 + r;
    if (qi < T)
      *reinterpret_cast<int4*>(out + (static_cast<size_t>(b) * T + qi) * C + static_cast<size_t>(h) * HS + c) =
          *reinterpret_cast<const int4*>(sQ + (wrow + r) * LD + c);
  }
}

template <int HS>
void launch_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, cudaStream_t stream) {
  const size_t smem = forward_smem_bytes<HS>();
  use_dynamic_shared(flash_forward_kernel<HS>, smem, [] { return "flash attention"; });
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kFwdBlockM)), static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  flash_forward_kernel<HS><<<grid, kFwdThreads, smem, stream>>>(
      static_cast<bf16*>(out), lse, static_cast<const bf16*>(qkv), T, NH, NKV, scale_log2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_supported(DType dtype, int HS, const void* qkv, const void* out_or_dout, const void* dqkv) {
  return dtype == DType::bf16 && (HS == 64 || HS == 128) && is_aligned(qkv, 16) && is_aligned(out_or_dout, 16) &&
         (dqkv == nullptr || is_aligned(dqkv, 16));
}

void flash_attention_forward_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                  void* stream) {
  if (B <= 0 || T <= 0) return;
  check(static_cast<long long>(B) * NH <= 65535, "flash attention: B * n_heads exceeds the grid's y limit 65535");
  check(NKV > 0 && NH % NKV == 0, "flash attention: n_kv_heads must divide n_heads");
  const FlashForwardPath path = flash_forward_path();
  if (path == FlashForwardPath::wgmma || (path == FlashForwardPath::automatic && flash_forward_sm90_available()))
    return flash_attention_forward_sm90_bf16(out, lse, qkv, B, T, NH, NKV, HS, stream);
  switch (HS) {
    case 64:
      return launch_forward<64>(out, lse, qkv, B, T, NH, NKV, as_stream(stream));
    case 128:
      return launch_forward<128>(out, lse, qkv, B, T, NH, NKV, as_stream(stream));
    default:
      throw RuntimeError("flash attention: head size " + std::to_string(HS) +
                         " has no tensor-core kernel (64 or 128); the CUDA-core kernels handle it");
  }
}

}  // namespace pt::gpu
