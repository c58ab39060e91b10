// Flash attention backward on Hopper (sm_90a): wgmma, TMA, mbarriers and warp specialisation.
// The same math, outputs and determinism as flash_attention_backward.cu (the sm_80 kernel, whose
// header says what is computed: with P = exp(S - lse) and D = rowsum(dO o O),
//   dP = dO V^T,  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO,
// written into dqkv, causal self-attention on a packed qkv, grouped-query heads by address), and
// as it does, a block of queries against keys held apart (ring attention's blocks: query i sees
// key j iff j <= i + delta, the gradients added to dq, dk, dv; BackwardArgs). Arranged the way
// FlashAttention-3's backward is (our own code; its paper and hopper/ folder were read): one
// block per (128-key tile, b, query head), dK and dV in registers, walking the query tiles from
// the first that sees the key tile (the diagonal's) to the end.
//
// Block: 3 warpgroups (384 threads).
//  - Warpgroup 0, the producer (setmaxnreg down to 24): thread 0 copies the block's K and V tiles
//    once, then per 64-query tile Q and dO by TMA into a ring of 2 stages; the warpgroup's 128
//    threads put the tile's lse (in log2 units; +inf past T, so P = 0 there) and D beside them
//    and arrive on the stage's "full" barrier (128 arrivals, thread 0's carrying the TMA bytes).
//  - Warpgroups 1 and 2, the consumers (setmaxnreg up to 240), own 64 keys each (wgmma's M) and
//    keep their dK and dV (64 x HS each, fp32) in registers. Per query tile:
//      1. S^T = K Q^T (64 keys x 64 queries, A and B K-major in shared memory, HS/16 products
//         of k16);
//      2. P^T = 2^(S^T scale log2(e) - lse log2(e)), the causal mask only where some query of the
//         tile precedes some key of the warp, rounded to bf16 in registers as a wgmma A operand
//         (flash::acc_to_a);
//      3. dP^T = V dO^T (as S^T) and dV += P^T dO (A from registers, dO read MN-major as TMA
//         wrote it: no transpose), one commit;
//      4. dS^T = P^T o (dP^T - D), rounded to bf16 in registers and stored to shared memory in
//         the 128-byte swizzle (the two consumers' halves make the [128 keys][64 queries] tile,
//         double-buffered by tile);
//      5. dK += dS^T Q (Q read MN-major), committed; the stage is freed once it is done;
//      6. after a barrier of the two consumers (dS^T whole): dQ_tile = dS K, 64 queries x 64 of
//         the head's columns per warpgroup (A = dS^T read MN-major, B = K read MN-major, 8
//         products of k16 over the block's 128 keys). At HS 128 each consumer takes one
//         64-column part of every tile; at HS 64 they take turns by tile (part c of tile qt
//         goes to consumer (c + qt) % 2);
//      7. the part goes through shared memory and is added, coalesced, into the tile's fp32
//         partial sum in a FIXED order of key blocks, kt = last_key_tile(qt), ..., 0
//         (flash_schedule.h), each 64-column part of each tile with its own turn counter
//         (flash_backward_order.cuh): key block 0, the last, writes scale * dQ as bf16 into
//         dqkv. A consumer waits only for its own part's turn.
//    At the end dK and dV pass through shared memory too (the tiles' space, free by then); under
//    grouped-query attention a key/value head's are summed over its query heads in head order as
//    the sm_80 kernel does (per-(b, key/value head, key tile) counters); with one query head per
//    group they are written at once.
//  Blocks take their (b, key/value head, key tile, query head) from an atomic ticket, key tiles
//  highest first and query heads in order, so a block only waits for blocks that started before
//  it (the sm_80 kernel's header says why that cannot deadlock). No float atomics: every run
//  gives the same bits.
//
// Head size 256 (a general path's largest size) is arranged otherwise (Tiles): 64 keys a block,
// both consumers on the same keys, each owning 128 of dK's and dV's columns (64 x 256 of each
// would take 256 registers a thread), both computing S^T and dP^T (2 of the 5 products twice:
// 1.4 x the FLOPs), one Q/dO stage, and two dQ parts per consumer.
// Resources: 384 threads, one block per SM; shared memory K and V 128 x HS, 2 stages x (Q and dO
// 64 x HS), 2 x dS^T 128 x 64 (bf16), lse/D 2 x 2 x 64 floats, 2 x dQ part 64 x 72 floats, 5
// barriers, the ticket and 1 KiB of alignment: 137,260 bytes (HS 64) / 202,796 (HS 128); HS 256
// (K, V 64 x 256, one stage, dS^T 64 x 64): 185,884.
// Registers (consumer, HS 128): dK and dV 128, S^T (fp32 P^T) and dP^T 64, P^T and dS^T fragments
// 32, dQ 32 (not all at once); at most 240 after setmaxnreg (the kernel as a whole is compiled
// for 168). ptxas spills nothing and serialises no wgmma (test/attention_ptx_check.sh). What it
// took: waits written as PTX loops (hopper::mbar_wait, flash::spin_until; C++ loops around the
// products cost hundreds of bytes of spills), the products of one tile in three commits (S^T
// alone, then dP^T with dV, then dK: dS^T is computed once dP^T is in, while P^T is held), and
// the dQ and dK/dV sums through shared memory (their registers would have spilled beside dK, dV).
// Cost: as the sm_80 kernel, 5 * 2 * B*NH * (T^2/2) * HS FLOPs (2.5 x the forward's); bytes: Q
// and dO once per key block (from L2), K and V once per query head, dqkv written once, the dQ
// scratch read and written once per (key block, query tile) pair (L2). Target (issue #30): with
// the Hopper forward, fwd+bwd at least the faster PyTorch SDPA back end's rate, 1.3x at T >= 4k
// (cuDNN's fwd+bwd ran 190-517 TFLOP/s on an H200, 2026-11-27, bench/RESULTS.md); the sm_80
// backward ran 127-196 TFLOP/s in that run.
//
// Status: written and checked offline (PTX, ptxas) on 2026-11-29; not yet run on a GPU. The
// trainer runs it only when PICOTRAIN_FLASH_BACKWARD says so (attention.h, FlashPath);
// gpu_attention checks it against CpuOps and bitwise repeats wherever the GPU has it, and
// kernel_bench times it (attention_backward_sm90).
#include <cmath>

#include "core/common/flash_schedule.h"
#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"
#include "cuda/flash_backward_order.cuh"
#include "cuda/hopper.cuh"

namespace pt::gpu {

namespace {

using namespace flash;
using namespace hopper;

constexpr int kWgKeys = 64;  // the key rows of a consumer's dK and dV (wgmma's M)
constexpr int kBlockM = 64;  // queries per tile
// Named barriers (0 is __syncthreads'): 1 + w for consumer w alone, kBothConsumers for the two.
constexpr int kBothConsumers = 3;

// How a block is shared out, by head size. HS 64 and 128: 128 keys a block, each consumer owning
// 64 of them (every column of their dK and dV), two Q/dO stages. HS 256: 64 keys a block, both
// consumers on the same keys, each owning half the columns (a consumer's dK and dV of 64 x 256
// would take 256 registers a thread), so S^T and dP^T are computed by both, and one Q/dO stage
// (two do not fit in shared memory beside K and V).
constexpr int block_keys(int HS) { return HS > 128 ? kWgKeys : kConsumers * kWgKeys; }
template <int HS>
struct Tiles {
  static constexpr bool kSplitCols = HS > 128;
  static constexpr int kBlockN = block_keys(HS);
  static constexpr int kCols = kSplitCols ? HS / kConsumers : HS;  // dK and dV columns a consumer owns
  static constexpr int kStages = kSplitCols ? 1 : 2;                // Q/dO tiles in flight
  static_assert(kBlockN % kBlockM == 0, "a key block starts at a query tile's first row");
};

// A consumer's dQ part passes through shared memory ([64 queries][kDqLD] floats) on its way to
// the ordered sum: 8 floats of padding make the accumulators' float2 stores conflict-free.
constexpr int kDqLD = kSwizzleCols + 8;

// Shared-memory layout (byte offsets from a 1024-byte aligned base): K and V as HS/64 sub-tiles of
// [kBlockN rows][64]; Q and dO of stage s at kQ/kDO + s * kQTile, as HS/64 sub-tiles of [64
// rows][64]; dS^T of buffer s (one per tile in flight, and one more) at kDS + s * kDSTile,
// [kBlockN keys][64 queries] (one sub-tile); then lse and D ([stage][lse 64 | D 64] floats), each
// consumer's dQ part (kDQ) and the barriers.
template <int HS>
struct Layout {
  static constexpr int kStages = Tiles<HS>::kStages;
  static constexpr int kDSBuffers = 2;  // a tile's dS^T is written while the previous one's is read
  static constexpr int kSubs = HS / kSwizzleCols;
  static constexpr uint32_t kKSub = Tiles<HS>::kBlockN * kSwizzleRowBytes;  // 16 KiB (8 at HS 256)
  static constexpr uint32_t kQSub = kBlockM * kSwizzleRowBytes;             // 8 KiB
  static constexpr uint32_t kKTile = kSubs * kKSub;                         // a K or V tile: kBlockN x HS bf16
  static constexpr uint32_t kQTile = kSubs * kQSub;                         // a Q or dO tile: 64 x HS bf16
  static constexpr uint32_t kDSTile = Tiles<HS>::kBlockN * kSwizzleRowBytes;
  static constexpr uint32_t kK = 0;
  static constexpr uint32_t kV = kK + kKTile;
  static constexpr uint32_t kQ = kV + kKTile;
  static constexpr uint32_t kDO = kQ + kStages * kQTile;
  static constexpr uint32_t kDS = kDO + kStages * kQTile;
  static constexpr uint32_t kLD = kDS + kDSBuffers * kDSTile;
  static constexpr uint32_t kDQ = kLD + kStages * 2 * kBlockM * sizeof(float);
  static constexpr uint32_t kBars = kDQ + kConsumers * kBlockM * kDqLD * sizeof(float);
  static constexpr int kNumBars = 1 + 2 * kStages;  // kv_full, full[S], empty[S]; then the ticket
  static constexpr size_t kBytes = 1024 + kBars + kNumBars * sizeof(uint64_t) + sizeof(int);
};

// acc = X Y^T, X the consumer's 64 rows of a K or V tile (x_addr: the tile's start plus the rows'
// 8 KiB offset into each sub-tile), Y a Q or dO tile (y_addr), both K-major: HS/16 products of 16
// columns (32 bytes of the swizzled row) a step, the first overwriting acc. S^T = K Q^T and
// dP^T = V dO^T. The caller fences before and commits after.
template <int HS>
__device__ __forceinline__ void wgmma_rows_t(float (&acc)[kBlockM / 8][4], uint32_t x_addr, uint32_t y_addr) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    const uint32_t in_row = (kk % 4) * 32;
    wgmma_m64n64k16_ss<0, 0>(acc, sw128_desc(x_addr + (kk / 4) * Layout<HS>::kKSub + in_row, 16, 1024),
                             sw128_desc(y_addr + (kk / 4) * Layout<HS>::kQSub + in_row, 16, 1024), kk > 0);
  }
}

// dK and dV's row stride (floats) where they pass through shared memory at the end: 8 floats of
// padding make the accumulators' float2 stores conflict-free.
template <int HS>
constexpr int kAccLD = HS + 8;
template <int HS>
constexpr bool kStagingFits = 2 * Tiles<HS>::kBlockN * kAccLD<HS> * sizeof(float) <= Layout<HS>::kLD;
static_assert(kStagingFits<64> && kStagingFits<128> && kStagingFits<256>, "dK and dV fit where the tiles were");

// What a launch computes on, besides its tensor maps: causal self-attention on a packed qkv (its
// gradient written into dqkv) or a block of queries against keys held apart (ring attention's
// blocks: the gradients added to dq, dk and dv, each of which may be null: not wanted). Element c
// of head h of position i of batch b of dQ is at dq[(b Tq + i) q_stride + h HS + c]; dK and dV
// likewise with Tk, kv_stride and the key/value head. Query i sees key j iff j <= i + delta
// (0 <= delta <= Tk; 0 for self-attention).
struct BackwardArgs {
  bf16* dq;
  bf16* dk;
  bf16* dv;
  size_t q_stride, kv_stride;
  const float* lse;  // [B, NH, Tq] (natural log), and D = rowsum(dO o O) likewise
  const float* D;
  BackwardScratch scratch;
  int Tq, Tk, NH, NKV, delta;
  int k_col0, v_col0;  // the column of K's and V's head 0 in their tensor maps
  float scale, scale_log2;
  bool accumulate;
};

// D (+)= A B with N = 64 or 128: dV += P^T dO and dK += dS^T Q over a consumer's columns (A from
// registers, B MN-major).
template <int N>
__device__ __forceinline__ void wgmma_rs_n(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (N == 64)
    wgmma_m64n64k16_rs_tb(d, a, desc_b, 1);
  else
    wgmma_m64n128k16_rs_tb(d, a, desc_b, 1);
}

template <int HS>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_sm90_kernel(const __grid_constant__ BackwardArgs a, const __grid_constant__ CUtensorMap map_q,
                               const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                               const __grid_constant__ CUtensorMap map_do) {
#if PT_HOPPER_DEVICE
  using L = Layout<HS>;
  constexpr int BN = Tiles<HS>::kBlockN, STAGES = Tiles<HS>::kStages, COLS = Tiles<HS>::kCols;
  constexpr bool kSplitCols = Tiles<HS>::kSplitCols;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = aligned_1024(smem_raw);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + STAGES;
  float* sLD = reinterpret_cast<float*>(smem + L::kLD);
  int& s_ticket = *reinterpret_cast<int*>(empty + STAGES);

  if (threadIdx.x == 0) {
    s_ticket = atomicAdd(a.scratch.ticket, 1);
    mbar_init(kv_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + s, 128);                // every producer thread (lse and D), thread 0 with the bytes
      mbar_init(empty + s, kConsumers * 4);    // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Which (b, h, key tile) this block takes: by ticket, the group's key tiles highest first and,
  // within a key tile, the group's query heads in order (the two sums rely on both).
  const int NH = a.NH, NKV = a.NKV, Tq = a.Tq, Tk = a.Tk, delta = a.delta;
  const int G = NH / NKV, nk = gridDim.x, nq = ceil_div(Tq, kBlockM);
  const int j = s_ticket % G, rest = s_ticket / G;
  const int kt = nk - 1 - rest % nk, bkv = rest / nk;
  const int b = bkv / NKV, kvh = bkv % NKV, h = kvh * G + j;
  // The first query tile that sees a key of the block (self-attention: the diagonal's).
  const int qt_begin = flash_schedule::first_query_tile(kt, delta, BN, kBlockM);
  const size_t lbase = (static_cast<size_t>(b) * NH + h) * Tq;  // lse and D of (b, h)
  const int wg = threadIdx.x / 128;

  if (wg == 0) {  // ---- producer ----
    regs_release<kProducerRegs>();
    const int tid = threadIdx.x;
    if (tid == 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_k);
      tma_prefetch_map(&map_v);
      tma_prefetch_map(&map_do);
      mbar_arrive_expect_tx(kv_full, 2 * L::kKTile);
      for (int c = 0; c < L::kSubs; ++c) {
        tma_load_3d(smem + L::kK + c * L::kKSub, &map_k, kv_full, a.k_col0 + kvh * HS + c * kSwizzleCols,
                    kt * BN, b);
        tma_load_3d(smem + L::kV + c * L::kKSub, &map_v, kv_full, a.v_col0 + kvh * HS + c * kSwizzleCols,
                    kt * BN, b);
      }
    }
    for (int qt = qt_begin, i = 0; qt < nq; ++qt, ++i) {
      const int s = i % STAGES, use = i / STAGES;
      if (use > 0) mbar_wait(empty + s, (use - 1) & 1);  // both consumers are done with it
      const int q = qt * kBlockM + tid % kBlockM;
      const bool in = q < Tq;
      sLD[s * 2 * kBlockM + tid] =
          tid < kBlockM ? (in ? a.lse[lbase + q] * kLog2e : INFINITY) : (in ? a.D[lbase + q] : 0.0f);
      if (tid == 0) {  // (the arrival orders the store above before the consumers' wait)
        mbar_arrive_expect_tx(full + s, 2 * L::kQTile);
        for (int c = 0; c < L::kSubs; ++c) {
          tma_load_3d(smem + L::kQ + s * L::kQTile + c * L::kQSub, &map_q, full + s, h * HS + c * kSwizzleCols,
                      qt * kBlockM, b);
          tma_load_3d(smem + L::kDO + s * L::kQTile + c * L::kQSub, &map_do, full + s, h * HS + c * kSwizzleCols,
                      qt * kBlockM, b);
        }
      } else {
        mbar_arrive(full + s);
      }
    }
    return;
  }

  // ---- consumers ----
  regs_claim<kConsumerRegs>();
  const int cw = wg - 1, wg_tid = threadIdx.x % 128;
  const int warp = wg_tid / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  // The consumer's key rows in the block's tile (HS 256: both consumers have all 64) and its
  // columns of dK and dV (below HS 256: all of them).
  const int wg_key0 = kSplitCols ? 0 : cw * kWgKeys, col0 = kSplitCols ? cw * COLS : 0;
  const int krow0 = wg_key0 + warp * 16;  // the warp's first key row in the block's tile
  const int key0 = kt * BN + krow0;
  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  const uint32_t q_addr = smem_u32(smem + L::kQ), do_addr = smem_u32(smem + L::kDO);
  const uint32_t ds_addr = smem_u32(smem + L::kDS);
  const uint32_t wg_rows = wg_key0 * kSwizzleRowBytes;  // the consumer's rows of K and V
  const uint32_t col_subs = col0 / kSwizzleCols * L::kQSub;  // its columns of Q and dO

  float dk[COLS / 8][4], dv[COLS / 8][4];
#pragma unroll
  for (int nt = 0; nt < COLS / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;

  mbar_wait(kv_full, 0);
#pragma unroll 1
  for (int qt = qt_begin, i = 0; qt < nq; ++qt, ++i) {
    const int s = i % STAGES;
    const uint32_t parity = (i / STAGES) & 1;
    const int q0 = qt * kBlockM;

    // 1. S^T = K Q^T.
    float st[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
    mbar_wait(full + s, parity);
    fence_regs(st);
    wgmma_fence();
    wgmma_rows_t<HS>(st, k_addr + wg_rows, q_addr + s * L::kQTile);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(st);

    // 2. P^T. Element e of n-tile n: key key0 + g + 8 (e / 2), query q0 + 8 n + 2 t + e % 2.
    const float* L_s = sLD + s * 2 * kBlockM;
    const float* D_s = L_s + kBlockM;
    const bool need_mask = q0 + delta < key0 + 15;  // some query of the tile misses some key of the warp
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + 2 * t + (e & 1);
        float p = exp2f(fmaf(st[n][e], a.scale_log2, -L_s[col]));
        if (need_mask && q0 + col + delta < key0 + g + 8 * (e >> 1)) p = 0.0f;
        st[n][e] = p;
      }
    uint32_t pa[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) acc_to_a(pa[kk], st[2 * kk], st[2 * kk + 1]);

    // 3. dP^T = V dO^T (as S^T) and dV += P^T dO (P^T from registers, dO read MN-major: 16
    //    queries a step, 16 rows = 2 KiB further; the next 64 of the head's columns one sub-tile
    //    (LBO) further), one commit.
    float dpt[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
    fence_regs(dpt);
    fence_regs(dv);
    wgmma_fence();
    wgmma_rows_t<HS>(dpt, v_addr + wg_rows, do_addr + s * L::kQTile);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      wgmma_rs_n<COLS>(dv, pa[kk],
                       sw128_desc(do_addr + s * L::kQTile + col_subs + kk * 16 * kSwizzleRowBytes, L::kQSub, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dpt);
    fence_regs(dv);
    fence_regs(pa);

    // 4. dS^T = P^T o (dP^T - D), rounded to bf16 as dK's A operand and stored to buffer dsb for
    //    dQ: row r (key) at r * 128 bytes, 16-byte chunk n of the row at n ^ (r % 8); dsa[kk][2 x
    //    + y] holds row g + 8 y, columns 8 (2 kk + x) + 2 t, +1 (the A fragment layout).
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[n][e] = st[n][e] * (dpt[n][e] - D_s[n * 8 + 2 * t + (e & 1)]);
    uint32_t dsa[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) acc_to_a(dsa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
    const int dsb = i % L::kDSBuffers;  // this tile's dS^T buffer
    if (!kSplitCols || cw == 0) {     // (HS 256: both consumers hold the same dS^T; one stores it)
      unsigned char* ds_tile = smem + L::kDS + dsb * L::kDSTile;
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int y = 0; y < 2; ++y) {
            const int row = krow0 + g + 8 * y, chunk = (2 * kk + x) ^ (row & 7);
            *reinterpret_cast<uint32_t*>(ds_tile + row * kSwizzleRowBytes + chunk * 16 + 4 * t) = dsa[kk][2 * x + y];
          }
    }

    // 5. dK += dS^T Q (Q read MN-major, as dO above).
    fence_regs(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      wgmma_rs_n<COLS>(dk, dsa[kk],
                       sw128_desc(q_addr + s * L::kQTile + col_subs + kk * 16 * kSwizzleRowBytes, L::kQSub, 1024));
    wgmma_commit();

    // 6. dS^T whole in shared memory (and made visible to wgmma's reads); once dV and dK are done
    //    (their fragments free: dQ's accumulators take their registers), this consumer's 64-column
    //    parts of dQ, if it has any: dS (64 queries x BN keys) K (BN keys x 64).
    fence_proxy_async_shared();
    named_barrier(kBothConsumers, kConsumers * 128);
    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dsa);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + s);  // this warp is done with Q, dO, lse and D of stage s
    // The consumer's 64-column parts of dQ: part c of tile qt goes to consumer (c + qt) % 2 (HS
    // 64: one part, the consumers take turns by tile; HS 128: one each; HS 256: two each).
#pragma unroll 1
    for (int part = (cw + qt) & 1; part < L::kSubs; part += kConsumers) {
      float dq[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
      fence_regs(dq);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_m64n64k16_ss<1, 1>(
            dq, sw128_desc(ds_addr + dsb * L::kDSTile + kk * 16 * kSwizzleRowBytes, L::kDSTile, 1024),
            sw128_desc(k_addr + part * L::kKSub + kk * 16 * kSwizzleRowBytes, L::kKSub, 1024), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);

      // 7. The part, summed over key blocks kt = last_key_tile(qt), ..., 0 in that order, through
      //    this consumer's shared-memory tile (coalesced adds, no accumulators held).
      float* sdq = reinterpret_cast<float*>(smem + L::kDQ) + cw * kBlockM * kDqLD;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(sdq + (warp * 16 + g + 8 * r) * kDqLD + n * 8 + 2 * t) =
              make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
      const int pos = flash_schedule::last_key_tile(qt, delta, nk, BN, kBlockM) - kt;
      const bool first = pos == 0, last = kt == 0;
      const size_t tile = (static_cast<size_t>(b) * NH + h) * nq + qt;
      int* turn = a.scratch.dq_turns + tile * L::kSubs + part;
      float* acc = a.scratch.dq_acc + tile * kBlockM * HS + part * kSwizzleCols;
      if (!first && wg_tid == 0) spin_until(turn, pos);
      named_barrier(1 + cw, 128);  // the part is in shared memory, and the turn is ours
#pragma unroll 1
      for (int idx = wg_tid; idx < kBlockM * kSwizzleCols / 4; idx += 128) {
        const int row = idx / (kSwizzleCols / 4), col = idx % (kSwizzleCols / 4) * 4, qi = q0 + row;
        bf16* out = qi < Tq && a.dq
                        ? a.dq + (static_cast<size_t>(b) * Tq + qi) * a.q_stride + h * HS + part * kSwizzleCols + col
                        : nullptr;
        ordered_add4(acc + row * HS + col, out, *reinterpret_cast<const float4*>(sdq + row * kDqLD + col), first,
                     last, a.scale, a.accumulate);
      }
      // Every thread's part stored before the release, and the staging tile free for the next part.
      named_barrier(1 + cw, 128);
      if (!last && wg_tid == 0) store_release(turn, pos + 1);
    }
  }

  // dK and dV, through shared memory (free now: every product is done once both consumers are
  // here) so that the sums below are coalesced and hold no accumulators: a key/value head's are
  // the sum of its group's query heads, added in head order through fp32 scratch (G = 1: written
  // at once).
  named_barrier(kBothConsumers, kConsumers * 128);
  float* sdk = reinterpret_cast<float*>(smem);  // [BN keys][kAccLD]: each consumer its rows and columns
  float* sdv = sdk + BN * kAccLD<HS>;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < COLS / 8; ++nt) {
      const int at = (krow0 + g + 8 * r) * kAccLD<HS> + col0 + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(sdk + at) = make_float2(dk[nt][2 * r], dk[nt][2 * r + 1]);
      *reinterpret_cast<float2*>(sdv + at) = make_float2(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  const bool first = j == 0, last = j == G - 1;
  float* kacc = a.scratch.dkv_acc + ((static_cast<size_t>(b) * NKV + kvh) * nk + kt) * 2 * BN * HS;
  float* vacc = kacc + BN * HS;
  int* turn = a.scratch.dkv_turns + (static_cast<size_t>(b) * NKV + kvh) * nk + kt;
  if (!first && threadIdx.x == 128) spin_until(turn, j);
  named_barrier(kBothConsumers, kConsumers * 128);  // both halves in shared memory, and the turn is ours
#pragma unroll 1
  for (int idx = threadIdx.x - 128; idx < BN * HS / 4; idx += kConsumers * 128) {
    const int row = idx / (HS / 4), col = idx % (HS / 4) * 4, kj = kt * BN + row;
    const size_t at = (static_cast<size_t>(b) * Tk + kj) * a.kv_stride + kvh * HS + col;
    ordered_add4(kacc + row * HS + col, kj < Tk && a.dk ? a.dk + at : nullptr,
                 *reinterpret_cast<const float4*>(sdk + row * kAccLD<HS> + col), first, last, a.scale, a.accumulate);
    ordered_add4(vacc + row * HS + col, kj < Tk && a.dv ? a.dv + at : nullptr,
                 *reinterpret_cast<const float4*>(sdv + row * kAccLD<HS> + col), first, last, 1.0f, a.accumulate);
  }
  if (!last) {
    named_barrier(kBothConsumers, kConsumers * 128);  // every thread's part stored before the release
    if (threadIdx.x == 128) store_release(turn, j + 1);
  }
#else
  __trap();  // never launched: flash_sm90_available() is false without sm_90a code
#endif
}

// ---- host side --------------------------------------------------------------------------------

// The workspace (flash_backward_order.cuh) of this kernel's 64-query tiles, a dQ turn per
// 64-column part.
BackwardWorkspace workspace_layout(int B, int Tq, int Tk, int NH, int NKV, int HS) {
  return backward_workspace(B, Tq, Tk, NH, NKV, HS, kBlockM, block_keys(HS), HS / kSwizzleCols);
}

// One launch: args a (its scratch and scales filled in here), with q (or qkv) rows of q_width
// elements, k and v rows of kv_width (k == v: one map serves both) and dout rows of NH HS.
template <int HS>
void launch_backward_sm90(BackwardArgs a, const void* q, size_t q_width, const void* k, const void* v,
                          size_t kv_width, const void* dout, int B, void* workspace, cudaStream_t stream) {
  const size_t smem = Layout<HS>::kBytes;
  use_dynamic_shared(flash_backward_sm90_kernel<HS>, smem, [] { return "flash attention backward (sm_90a)"; });
  const BackwardWorkspace ws = workspace_layout(B, a.Tq, a.Tk, a.NH, a.NKV, HS);
  a.scratch = backward_scratch(workspace, ws);
  CUDA_CHECK(cudaMemsetAsync(a.scratch.dq_turns, 0, ws.counters() * sizeof(int), stream));
  const CUtensorMap map_q = rows_tensor_map(q, B, a.Tq, q_width, kBlockM);
  const CUtensorMap map_k = rows_tensor_map(k, B, a.Tk, kv_width, Tiles<HS>::kBlockN);
  const CUtensorMap map_v = v == k ? map_k : rows_tensor_map(v, B, a.Tk, kv_width, Tiles<HS>::kBlockN);
  const CUtensorMap map_do = rows_tensor_map(dout, B, a.Tq, static_cast<size_t>(a.NH) * HS, kBlockM);
  a.scale = softmax_scale(a.scale, HS);
  a.scale_log2 = a.scale * kLog2e;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.Tk, Tiles<HS>::kBlockN)), static_cast<unsigned>(B * a.NH));
  flash_backward_sm90_kernel<HS><<<grid, kThreads, smem, stream>>>(a, map_q, map_k, map_v, map_do);
  CUDA_CHECK_LAUNCH();
}

void check_launch(int B, int NH, int NKV, const void* workspace) {
  check(flash_sm90_available(), "flash attention backward (sm_90a): needs a Hopper GPU and a build with sm_90a");
  check_flash_heads("flash attention backward (sm_90a)", B, NH, NKV);
  check(workspace != nullptr && is_aligned(workspace, 16),
        "flash attention backward (sm_90a): needs a 16-byte aligned workspace");
}

}  // namespace

size_t flash_backward_sm90_workspace_bytes(int B, int Tq, int Tk, int NH, int NKV, int HS) {
  return workspace_layout(B, Tq, Tk, NH, NKV, HS).bytes();
}

void flash_attention_backward_sm90_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse,
                                        const float* D, int B, int T, int NH, int NKV, int HS, void* workspace,
                                        void* stream, float scale) {
  if (B <= 0 || T <= 0) return;
  check_launch(B, NH, NKV, workspace);
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * HS;  // a packed row: q heads | k heads | v heads
  bf16* dq = static_cast<bf16*>(dqkv);
  BackwardArgs a{};
  a.dq = dq;
  a.dk = dq + static_cast<size_t>(NH) * HS;
  a.dv = dq + static_cast<size_t>(NH + NKV) * HS;
  a.q_stride = a.kv_stride = W;
  a.lse = lse;
  a.D = D;
  a.Tq = a.Tk = T;
  a.NH = NH;
  a.NKV = NKV;
  a.delta = 0;
  a.k_col0 = NH * HS;
  a.v_col0 = (NH + NKV) * HS;
  a.scale = scale;
  a.accumulate = false;
  with_hopper_head_size("flash attention backward (sm_90a)", HS, [&](auto hs) {
    launch_backward_sm90<decltype(hs)::value>(a, qkv, W, qkv, qkv, W, dout, B, workspace, as_stream(stream));
  });
}

void flash_attention_block_backward_sm90_bf16(void* dq, void* dk, void* dv, const void* dout, const void* q,
                                              const void* k, const void* v, const float* lse, const float* D, int B,
                                              int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0,
                                              bool causal, void* workspace, void* stream) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return;
  check_launch(B, NH, NKV, workspace);
  const FlashProblem p = block_problem(q, k, v, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal);
  check(p.delta >= 0, "flash attention backward (sm_90a): every query must see the block's first key");
  BackwardArgs a{};
  a.dq = static_cast<bf16*>(dq);
  a.dk = static_cast<bf16*>(dk);
  a.dv = static_cast<bf16*>(dv);
  a.q_stride = p.q_stride;
  a.kv_stride = p.kv_stride;
  a.lse = lse;
  a.D = D;
  a.Tq = Tq;
  a.Tk = Tk;
  a.NH = NH;
  a.NKV = NKV;
  a.delta = p.delta;
  a.k_col0 = a.v_col0 = 0;
  a.scale = 0.0f;
  a.accumulate = true;
  with_flash_head_size("flash attention backward (sm_90a)", HS, [&](auto hs) {
    launch_backward_sm90<decltype(hs)::value>(a, q, p.q_stride, k, v, p.kv_stride, dout, B, workspace,
                                              as_stream(stream));
  });
}

}  // namespace pt::gpu
