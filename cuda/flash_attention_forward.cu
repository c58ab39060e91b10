// Flash attention forward, bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators), causal,
// head size 64 or 128, sm_80 and later. Our own kernel, in the FlashAttention-2 arrangement.
//
// Computes, per (b, h) and query i (scale = 1/sqrt(HS), keys j <= i):
//   lse_i = log sum_j exp(scale q_i.k_j),   out_i = sum_j exp(scale q_i.k_j - lse_i) v_j
// from qkv [B, T, (NH + 2 NKV) HS] into out [B, T, C] (bf16) and lse [B, NH, T] (fp32), where
// k and v are those of key/value head h / (NH / NKV) (grouped-query attention; NKV == NH is
// multi-head). The key/value head is only an address: no K/V head is ever repeated in memory.
//
// The same kernel body serves a block of queries against keys held apart (FlashProblem:
// flash_block_forward_kernel; Ops::attention_block_forward, as ring attention's blocks and a KV
// cache's queries call it): q [B, Tq, NH HS] and k, v [B, Tk, NKV HS], query i seeing keys
// j <= i + delta (delta = q_pos0 - k_pos0 >= 0; every key when not causal) and j < Tk. Only the
// tile bounds and the mask change: a tile's mask also covers keys past Tk, and is applied where a
// key of the tile is past the warp's first row's last visible key.
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

#include "core/common/flash_schedule.h"
#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"

namespace pt::gpu {

namespace {

using namespace flash;

template <int HS>
constexpr size_t forward_smem_bytes() {
  return size_t(kFwdBlockM + 4 * kFwdBlockN) * row_stride<HS>() * sizeof(bf16);  // Q, K x 2, V x 2
}

// The kernel body. kBlock: p is a block (its own key count and offset); else causal self-attention
// (Tk = Tq, delta = 0, known at compile time: the packed kernel pays nothing for the generality).
template <int HS, bool kBlock>
__device__ __forceinline__ void flash_forward(bf16* out, float* lse, const FlashProblem& p, float scale_log2) {
  constexpr int LD = row_stride<HS>(), BM = kFwdBlockM, BN = kFwdBlockN, MT = kFwdMTiles, KS = HS / 16;
  constexpr bool kQInRegs = HS <= 64;  // 32 registers at HS 64; at HS 128 O needs them
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [BM][LD]
  bf16* sK = sQ + BM * LD;                        // [2][BN][LD]
  bf16* sV = sK + 2 * BN * LD;                    // [2][BN][LD]

  const int NH = p.NH, C = NH * HS, Tq = p.Tq, Tk = kBlock ? p.Tk : p.Tq, delta = kBlock ? p.delta : 0;
  const int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / p.NKV);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  // The heads' first rows: a block's q, k, v tensors, or one packed qkv row holding all three
  // (written as the packed kernel always was: ptxas' register allocation at HS 128 is at the edge).
  const bf16 *qhead, *khead, *vhead;
  size_t q_stride, kv_stride;
  if constexpr (kBlock) {
    q_stride = p.q_stride;
    kv_stride = p.kv_stride;
    qhead = p.q + static_cast<size_t>(b) * Tq * q_stride + static_cast<size_t>(h) * HS;
    khead = p.k + static_cast<size_t>(b) * p.kv_batch_stride + static_cast<size_t>(kvh) * HS;
    vhead = p.v + static_cast<size_t>(b) * p.kv_batch_stride + static_cast<size_t>(kvh) * HS;
  } else {
    const size_t rs = static_cast<size_t>(NH + 2 * p.NKV) * HS;  // qkv row stride
    const bf16* row_b = p.q + static_cast<size_t>(b) * Tq * rs;
    q_stride = kv_stride = rs;
    qhead = row_b + static_cast<size_t>(h) * HS;
    khead = row_b + static_cast<size_t>(NH + kvh) * HS;
    vhead = row_b + static_cast<size_t>(NH + p.NKV + kvh) * HS;
  }
  const int q0 = qt * BM;
  // Key tiles the block's last row sees.
  int n_kt = kBlock ? flash_schedule::forward_key_tiles(q0, BM, Tq, Tk, delta, BN) : ceil_div(min(q0 + BM, Tq), BN);
  // A split of the keys (kBlock) takes tiles [kt0, kt0 + split_tiles) of them; the tiles keep their
  // global key numbers, so the mask and the bounds stay as they are.
  const int kt0 = kBlock ? blockIdx.z * p.split_tiles : 0;
  if constexpr (kBlock) n_kt = min(n_kt, kt0 + p.split_tiles);
  const int wrow = warp * kFwdWarpRows;                                // the warp's first row within the tile
  const int wq0 = q0 + wrow;                                           // ... and in the sequence

  load_tile_async<HS, BM, kFwdThreads>(sQ, qhead, q_stride, q0, Tq);
  load_tile_async<HS, BN, kFwdThreads>(sK, khead, kv_stride, kt0 * BN, Tk);
  load_tile_async<HS, BN, kFwdThreads>(sV, vhead, kv_stride, kt0 * BN, Tk);
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
  for (int kt = kt0; kt < n_kt; ++kt) {
    const int stage = (kt - kt0) & 1;
    if (kt + 1 < n_kt) {  // prefetch the next tile into the other buffer (read in iteration kt - 1)
      load_tile_async<HS, BN, kFwdThreads>(sK + (stage ^ 1) * BN * LD, khead, kv_stride, (kt + 1) * BN, Tk);
      load_tile_async<HS, BN, kFwdThreads>(sV + (stage ^ 1) * BN * LD, vhead, kv_stride, (kt + 1) * BN, Tk);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "tile kt"
    cp_async_wait<1>();
    __syncthreads();

    if constexpr (kQInRegs) {
      if (kt == kt0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int kk = 0; kk < KS; ++kk)
            ldmatrix_x4(qf[m][kk], sQ + (wrow + m * 16) * LD + kk * 16 + lane_offset_x(lane, LD));
      }
    }
    // Skip a tile whose keys all follow the warp's rows' visible ones, and warps wholly past Tq.
    const bool active = kt * BN <= wq0 + kFwdWarpRows - 1 + delta && wq0 < Tq;
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

      // The mask, only where some key of the tile is past the warp's first row's last visible key.
      if (kt * BN + BN - 1 > (kBlock ? min(wq0 + delta, Tk - 1) : wq0)) {
#pragma unroll
        for (int m = 0; m < MT; ++m) causal_mask<BN / 8, kBlock>(s[m], wq0 + m * 16, kt * BN, g, t, delta, Tk);
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

  if constexpr (kBlock) {  // a split's part of out and lse (computed here, late: registers are short)
    const size_t rows = static_cast<size_t>(gridDim.y) * Tq;  // B NH Tq
    out += blockIdx.z * rows * HS;
    lse += blockIdx.z * rows;
  }
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
      if (t == 0 && qi < Tq)
        lse[(static_cast<size_t>(b) * NH + h) * Tq + qi] = row_lse(m_run[m][r], l, scale_log2);
    }
  }
  __syncwarp();
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < kFwdWarpRows * kChunks / kWarpSize; ++i) {
    const int e = lane + i * kWarpSize, r = e / kChunks, c = (e % kChunks) * 8, qi = wq0 + r;
    if (qi < Tq)
      *reinterpret_cast<int4*>(out + (static_cast<size_t>(b) * Tq + qi) * C + static_cast<size_t>(h) * HS + c) =
          *reinterpret_cast<const int4*>(sQ + (wrow + r) * LD + c);
  }
}

// The kernels' parameters are scalars (the strides follow from the head counts): ptxas allocates
// these kernels' registers at the 255 limit, and a parameter struct moved them to spilling.
// Causal self-attention on a packed qkv:
template <int HS>
__global__ void __launch_bounds__(kFwdThreads, 2)
    flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, int NKV, float scale_log2) {
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;
  const FlashProblem p{qkv, nullptr, nullptr, rs, rs, rs * T, T, T, NH, NKV, 0, kOneSplit};
  flash_forward<HS, false>(out, lse, p, scale_log2);
}
// ... and a block of queries against keys held apart, its key tiles in splits of split_tiles, one
// per blockIdx.z (kOneSplit: one split), each split's (out, lse) into its own part of out and lse
// ([gridDim.z][B, Tq, NH HS] and [gridDim.z][B, NH, Tq]; merge_attention_splits_gpu adds them up).
template <int HS>
__global__ void __launch_bounds__(kFwdThreads, 2)
    flash_block_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int Tq, int Tk,
                               int NH, int NKV, int delta, int split_tiles, float scale_log2) {
  const size_t kv_stride = static_cast<size_t>(NKV) * HS;
  const FlashProblem p{q, k, v, static_cast<size_t>(NH) * HS, kv_stride, kv_stride * Tk, Tq, Tk, NH, NKV, delta,
                       split_tiles};
  flash_forward<HS, true>(out, lse, p, scale_log2);
}

template <int HS, bool kBlock>
void launch_forward(void* out, float* lse, const FlashProblem& p, int B, int splits, int split_tiles,
                    cudaStream_t stream) {
  const size_t smem = forward_smem_bytes<HS>();
  if constexpr (kBlock)
    use_dynamic_shared(flash_block_forward_kernel<HS>, smem, [] { return "flash attention (block)"; });
  else
    use_dynamic_shared(flash_forward_kernel<HS>, smem, [] { return "flash attention"; });
  const dim3 grid(static_cast<unsigned>(ceil_div(p.Tq, kFwdBlockM)), static_cast<unsigned>(B * p.NH),
                  static_cast<unsigned>(splits));
  const float scale_log2 = kLog2e * softmax_scale(p.scale, HS);
  if constexpr (kBlock)
    flash_block_forward_kernel<HS><<<grid, kFwdThreads, smem, stream>>>(static_cast<bf16*>(out), lse, p.q, p.k, p.v,
                                                                        p.Tq, p.Tk, p.NH, p.NKV, p.delta, split_tiles,
                                                                        scale_log2);
  else
    flash_forward_kernel<HS><<<grid, kFwdThreads, smem, stream>>>(static_cast<bf16*>(out), lse, p.q, p.Tq, p.NH,
                                                                  p.NKV, scale_log2);
  CUDA_CHECK_LAUNCH();
}

template <bool kBlock>
void launch_forward(void* out, float* lse, const FlashProblem& p, int B, int HS, cudaStream_t stream, int splits = 1,
                    int split_tiles = kOneSplit) {
  check_flash_heads("flash attention", B, p.NH, p.NKV);
  with_flash_head_size("flash attention", HS, [&](auto hs) {
    launch_forward<decltype(hs)::value, kBlock>(out, lse, p, B, splits, split_tiles, stream);
  });
}

}  // namespace

bool flash_attention_supported(DType dtype, int HS, const void* qkv, const void* out_or_dout, const void* dqkv) {
  return dtype == DType::bf16 && (HS == 64 || HS == 128) && is_aligned(qkv, 16) && is_aligned(out_or_dout, 16) &&
         (dqkv == nullptr || is_aligned(dqkv, 16));
}

bool flash_attention_block_supported(DType dtype, int HS, int Tk, int q_pos0, int k_pos0, bool causal, bool backward,
                                     std::initializer_list<const void*> tensors) {
  if (dtype != DType::bf16 || (HS != 64 && HS != 128) || Tk <= 0) return false;
  if (backward && causal && q_pos0 < k_pos0) return false;  // some query sees no key: its P would be exp(+inf)
  for (const void* p : tensors)
    if (!is_aligned(p, 16)) return false;
  return true;
}

void flash_attention_forward_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                  void* stream, float scale) {
  if (B <= 0 || T <= 0) return;
  if (HS > 128 || uses_sm90_kernel(flash_forward_path()))  // (above 128 only the Hopper kernel has a size)
    return flash_attention_forward_sm90_bf16(out, lse, qkv, B, T, NH, NKV, HS, stream, scale);
  launch_forward<false>(out, lse, packed_problem(qkv, T, NH, NKV, HS, scale), B, HS, as_stream(stream));
}

namespace {

// The split of a block's keys (flash-decoding, flash_schedule::key_split) on this device: no
// range under kMinSplitKeys keys, at most kMaxSplits.
constexpr int kMinSplitKeys = 256;
constexpr int kMaxSplits = 64;
using flash_schedule::KeySplit;
KeySplit key_split(int B, int Tq, int Tk, int NH) {
  static thread_local int sms = 0, sms_device = -1;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device != sms_device) {
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    sms_device = device;
  }
  const long long blocks = static_cast<long long>(ceil_div(Tq, kFwdBlockM)) * B * NH;
  return flash_schedule::key_split(blocks, Tk, sms, kFwdBlockN, kMinSplitKeys, kMaxSplits);
}

// The partial results of a split: [count][B, Tq, NH HS] bf16, then [count][B, NH, Tq] fp32.
size_t split_out_bytes(const KeySplit& split, int B, int Tq, int NH, int HS) {
  return (static_cast<size_t>(split.count) * B * Tq * NH * HS * sizeof(bf16) + 255) / 256 * 256;
}

}  // namespace

size_t flash_attention_block_forward_workspace_bytes(int B, int Tq, int Tk, int NH, int HS) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return 0;
  const KeySplit split = key_split(B, Tq, Tk, NH);
  if (split.count == 1) return 0;
  return split_out_bytes(split, B, Tq, NH, HS) + static_cast<size_t>(split.count) * B * NH * Tq * sizeof(float);
}

void flash_attention_block_forward_bf16(void* out, float* lse, const void* q, const void* k, const void* v, int B,
                                        int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                        void* workspace, void* stream) {
  if (B <= 0 || Tq <= 0) return;
  const FlashProblem p = block_problem(q, k, v, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal);
  const KeySplit split = key_split(B, Tq, Tk, NH);
  // The Hopper kernel takes a block that does not split its keys, only where the forward path is
  // wgmma (not yet under auto: attention.h).
  if (split.count == 1 && flash_forward_path() == FlashPath::wgmma)
    return flash_attention_block_forward_sm90_bf16(out, lse, q, k, v, B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal,
                                                   stream);
  if (split.count == 1) return launch_forward<true>(out, lse, p, B, HS, as_stream(stream));
  check(workspace != nullptr && is_aligned(workspace, 256),
        "flash attention block: a split of the keys needs flash_attention_block_forward_workspace_bytes of workspace");
  bf16* parts = static_cast<bf16*>(workspace);
  float* lse_parts = reinterpret_cast<float*>(static_cast<char*>(workspace) + split_out_bytes(split, B, Tq, NH, HS));
  launch_forward<true>(parts, lse_parts, p, B, HS, as_stream(stream), split.count, split.len / kFwdBlockN);
  merge_attention_splits_gpu(DType::bf16, out, lse, parts, lse_parts, split.count, B, Tq, NH, HS, stream);
}

}  // namespace pt::gpu
