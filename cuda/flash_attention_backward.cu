// Flash attention backward, bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators), causal,
// head size 64 or 128, sm_80 and later, bitwise deterministic. Our own kernel, one pass per key
// block in the FlashAttention-2 arrangement, recomputing the probabilities from lse.
//
// Computes, per (b, h), with S = scale Q K^T (keys j <= query i), P = exp(S - lse),
// D_i = dO_i . O_i (attention_row_dot, computed before this kernel):
//   dP = dO V^T,  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO
// written (overwritten, one bf16 rounding) into the q | k | v parts of dqkv [B, T, (NH + 2 NKV) HS].
// Grouped-query attention: K, V are those of key/value head h / G (G = NH / NKV query heads per
// key/value head), and a key/value head's dK, dV are the sums of its G query heads'.
//
// The same kernel body serves a block of queries against keys held apart (FlashProblem:
// flash_block_backward_kernel; Ops::attention_block_backward, as ring attention's blocks call it):
// q, dq [B, Tq, NH HS], k, v, dk, dv [B, Tk, NKV HS], query i seeing keys j <= i + delta, the
// gradients ADDED to (one rounding of the fp32 sum each; a null one is not computed into), lse and
// D those of the final, merged rows. Key block kt then starts at the query tile holding query
// kt * 128 - delta (not at the diagonal), and query tile qt is summed over key blocks
// last_key_tile(qt), ..., 0 in that order: the same turn chain, its first link moved.
//
// Tiles: one block of 8 warps (256 threads) per (128-key tile, b, query head), one block per SM;
// each warp owns 16 keys and keeps their dK and dV (16 x HS each) in fp32 registers, K and V stay
// in shared memory. The block walks the 128-query tiles from the diagonal to the end, Q, dO, lse
// and D of the next tile copied by cp.async while it computes on this one (two buffers at HS 64;
// one at HS 128, refilled as soon as step 2 is done). Per query tile:
//   1. per warp, S^T = K Q^T and dP^T = V dO^T (16 keys x 64 or 32 queries at a time; Q and dO
//      fragments by ldmatrix), P^T = 2^(S^T scale log2(e) - lse log2(e)) and
//      dS^T = P^T o (dP^T - D), the causal mask only where a query precedes a key of the warp;
//      query chunks wholly before the warp's keys are skipped;
//   2. dV += P^T dO and dK += dS^T Q, the accumulators reused as A fragments (no round trip),
//      dO and Q by ldmatrix.trans; dS^T also goes to shared memory as bf16;
//   3. dQ_tile = dS K (128 queries x HS; warp w takes 16 queries, 64 channels at a time; dS by
//      ldmatrix.trans of dS^T, K by ldmatrix.trans), key steps wholly after the queries skipped;
//   4. the tile's dQ is summed over the key blocks in a FIXED order, through fp32 scratch: the
//      key blocks that reach query tile qt are kt = qt, qt - 1, ..., 0, and each adds its part in
//      that order, waiting for a per-(b, h, query tile) turn counter: kt = qt stores, the others
//      read, add and store, and kt = 0, the last, writes scale * dQ as bf16 into dqkv.
// At the end, under GQA, the G query heads' dK and dV of a key tile are summed the same way, in
// head order (per-(b, key/value head, key tile) counters); with G = 1 they are written at once.
// Every order, and so every bit of the result, is the same on every run (no float atomics).
//
// Why the order costs little: the turns form a chain per query tile (one link per key block), so
// what counts is how long a link holds the block. Thread 0 looks at the turn before the barrier
// that ends step 2, while the other warps finish, and the block ahead (kt + 1 meets query tile qt
// one tile earlier) has almost always passed it by then; the barrier carries that acquire to
// every thread. The turn is passed on at the next iteration's first barrier, which already orders
// every thread's stores before thread 0's release (cumulative: no fence per thread). Measured on
// an H200 (2026-11-27, MHA): a first version (64-query tiles, the wait after the dQ product, a
// fence in every thread and a barrier of its own to pass the turn) ran at 87-131 TFLOP/s; with
// 64-key blocks, two per SM (twice the links), at 72-88; this one at 127-196 (bench/RESULTS.md).
// Why it cannot deadlock: blocks take their (b, key/value head, key tile, query head) from an
// atomic ticket, key tiles highest first and query heads in order, so a block only ever waits for
// a block that took its ticket earlier, which is already running (resident blocks progress; a
// ticket, unlike blockIdx, cannot name a block that has not started).
// Compared with the first design (dK/dV and dQ in two kernels, 7 T^2-sized products per head),
// this does 5; the price is the scratch (flash_attention_backward_workspace_bytes:
// B*NH*ceil(T/128)*128*HS*4 bytes, plus 2*B*NKV*ceil(T/128)*128*HS*4 under GQA) and its L2 traffic.
//
// Resources (ptxas; test/attention_ptx_check.sh prints them): 256 threads, 255 registers (launch
// bounds (256, 1): dK and dV alone hold HS of them), up to 16 bytes spilled (ptxas' choice, the
// check's documented allowance); shared memory 147,456 bytes (HS 64: K, V, two Q/dO buffers,
// dS^T, lse/D) / 175,104 (HS 128, one Q/dO buffer).
// Cost (causal): 5 * 2 * B*NH * (T^2/2) * HS FLOPs on tensor cores (independent of NKV); GPT-2
// 124M at B = 8, T = 1024: ~32 GFLOP per layer, ~33 us at 989 TFLOP/s. Bytes: Q and dO once per
// key block (from L2), K and V once per query head, dqkv written once, the dQ scratch read and
// written once per (key block, query tile) pair (L2). Measured on an H200, MHA: 127-196 TFLOP/s
// (hd 64 and 128, T 1k-16k); GQA 8:1 84-169 (the dK/dV order waits at the end of every block).
#include <cmath>

#include "core/common/flash_schedule.h"
#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"
#include "cuda/flash_backward_order.cuh"

namespace pt::gpu {

namespace {

using namespace flash;

constexpr int kBwdWarps = 8;
constexpr int kBwdThreads = kBwdWarps * kWarpSize;
constexpr int kBwdBlockN = kBwdWarps * 16;  // 128 keys per block, 16 per warp
constexpr int kBwdBlockM = 128;             // queries per tile (= kBwdBlockN: key tile kt first meets query tile kt)
constexpr int kDsLD = kBwdBlockM + 8;       // dS^T's row stride: conflict-free ldmatrix, as row_stride
static_assert(kBwdBlockM == kBwdBlockN, "the dQ turn order assumes square tiles");

// Q and dO buffers: two at HS 64 (the next tile's copy overlaps this one's products); one at HS
// 128, refilled as soon as the products that read it are done (two would exceed shared memory).
template <int HS>
__host__ __device__ constexpr int bwd_stages() {
  return HS <= 64 ? 2 : 1;
}

template <int HS>
constexpr size_t backward_smem_bytes() {
  return size_t(2 * kBwdBlockN + 2 * bwd_stages<HS>() * kBwdBlockM) * row_stride<HS>() * sizeof(bf16)  // K, V; Q, dO
         + size_t(kBwdBlockN) * kDsLD * sizeof(bf16)                                                   // dS^T
         + 2 * bwd_stages<HS>() * kBwdBlockM * sizeof(float);                                           // lse, D
}

// A fixed-order sum across blocks: block number `pos` of the contributors to one tile waits for its
// turn (the counter equals pos), then adds its part. Every thread of the block calls it.
__device__ __forceinline__ void wait_turn(const int* turn, int pos) {
  if (pos > 0) {
    if (threadIdx.x == 0) spin_until(turn, pos);
    __syncthreads();
  }
}
// ... and passes the turn on once every thread's part is written: the barrier orders the block's
// stores before thread 0's release, which is cumulative (no fence per thread needed).
__device__ __forceinline__ void pass_turn(int* turn, int pos) {
  __syncthreads();
  if (threadIdx.x == 0) store_release(turn, pos + 1);
}

// The kernel body. kBlock: p is a block (its own key count and offset) whose gradients are added
// to; else causal self-attention (Tk = Tq, delta = 0, known at compile time) whose gradients are
// written.
template <int HS, bool kBlock>
__device__ __forceinline__ void flash_backward(const FlashProblem& p, const FlashGrads& gr, const float* lse,
                                               const float* Dvec, float* dq_acc, float* dkv_acc, int* dq_turns,
                                               int* dkv_turns, int* ticket, float scale, float scale_log2) {
  constexpr int LD = row_stride<HS>(), BN = kBwdBlockN, BM = kBwdBlockM, KS = HS / 16, STAGES = bwd_stages<HS>();
  constexpr int QC = HS <= 64 ? 64 : 32;  // queries per chunk of the S^T / dP^T products
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [BN][LD]
  bf16* sV = sK + BN * LD;                        // [BN][LD]
  bf16* sQ = sV + BN * LD;                        // [STAGES][BM][LD]
  bf16* sdO = sQ + STAGES * BM * LD;              // [STAGES][BM][LD]
  bf16* sdS = sdO + STAGES * BM * LD;             // [BN][kDsLD]: dS^T, keys x queries
  float* sL = reinterpret_cast<float*>(sdS + BN * kDsLD);  // [STAGES][BM] lse in log2 units
  float* sD = sL + STAGES * BM;                             // [STAGES][BM]
  __shared__ int s_ticket;
  __shared__ int s_turn_ready;  // thread 0's early look at this tile's dQ turn

  // Which (b, h, key tile) this block takes: by ticket, the group's key tiles highest first and,
  // within a key tile, the group's query heads in order (the two sums below rely on both).
  if (threadIdx.x == 0) s_ticket = atomicAdd(ticket, 1);
  __syncthreads();
  const int NH = p.NH, NKV = p.NKV, Tq = p.Tq, Tk = kBlock ? p.Tk : p.Tq, delta = kBlock ? p.delta : 0;
  const int G = NH / NKV, nk = gridDim.x;
  const int j = s_ticket % G, rest = s_ticket / G;
  const int kt = nk - 1 - rest % nk, bkv = rest / nk;
  const int b = bkv / NKV, kvh = bkv % NKV, h = kvh * G + j;
  const int C = NH * HS, nq = ceil_div(Tq, BM);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const int key0 = kt * BN + warp * 16;  // the warp's first key
  // Where the block reads and writes: a block's own q, k, v (and dq, dk, dv) tensors, or the packed
  // qkv (and dqkv) rows holding all three. Offsets are recomputed from ints where used (a 64-bit
  // offset held across the loop costs two of the registers this kernel is out of).
  const size_t q_stride = kBlock ? p.q_stride : static_cast<size_t>(NH + 2 * NKV) * HS;
  const size_t kv_stride = kBlock ? p.kv_stride : q_stride;
  const auto q_index = [&](int i) {  // position i of query head h
    return (static_cast<size_t>(b) * Tq + i) * q_stride + static_cast<size_t>(h) * HS;
  };
  const auto k_index = [&](int j) {  // position j of key head kvh (packed: after the NH query heads)
    return (static_cast<size_t>(b) * Tk + j) * kv_stride + static_cast<size_t>(kBlock ? kvh : NH + kvh) * HS;
  };
  const size_t v_from_k = kBlock ? 0 : static_cast<size_t>(NKV) * HS;  // packed: v heads follow the k heads
  const bf16* qhead = p.q + q_index(0);
  const bf16* dohead = gr.dout + static_cast<size_t>(b) * Tq * C + static_cast<size_t>(h) * HS;
  const size_t lbase = (static_cast<size_t>(b) * NH + h) * Tq;
  // The query tiles this key block meets: from the one holding the first query that sees its first
  // key (kt: the diagonal, under causal self-attention). Query tile qt meets the key blocks up to
  // last_key_tile(qt); both are from the tiles' bounds alone, so the two agree.
  const int qt_begin = kBlock ? flash_schedule::first_query_tile(kt, delta, BN, BM) : kt;
  const auto last_key_tile = [&](int qt) {
    return kBlock ? flash_schedule::last_key_tile(qt, delta, nk, BN, BM) : qt;
  };

  // Starts the copies of query tile qt's Q, dO, lse and D into buffer `stage`.
  auto issue_tile = [&](int qt, int stage) {
    load_tile_async<HS, BM, kBwdThreads>(sQ + stage * BM * LD, qhead, q_stride, qt * BM, Tq);
    load_tile_async<HS, BM, kBwdThreads>(sdO + stage * BM * LD, dohead, C, qt * BM, Tq);
    if (threadIdx.x < BM) {
      const int q = qt * BM + threadIdx.x;
      // Past Tq: lse = +inf makes P = 0 with no mask, and dS = 0 with it. (Keys past Tk need no
      // mask: their K and V are zero-filled, so they add nothing to dQ, and their dK, dV are
      // never stored.)
      sL[stage * BM + threadIdx.x] = q < Tq ? lse[lbase + q] * kLog2e : INFINITY;
      sD[stage * BM + threadIdx.x] = q < Tq ? Dvec[lbase + q] : 0.0f;
    }
  };

  load_tile_async<HS, BN, kBwdThreads>(sK, (kBlock ? p.k : p.q) + k_index(0), kv_stride, kt * BN, Tk);
  load_tile_async<HS, BN, kBwdThreads>(sV, (kBlock ? p.v : p.q) + k_index(0) + v_from_k, kv_stride, kt * BN, Tk);
  const bool meets_queries = !kBlock || qt_begin < nq;  // a block's key tile may precede every query
  if (meets_queries) issue_tile(qt_begin, 0);
  cp_async_commit();

  float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
  for (int nt = 0; nt < HS / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;

  const size_t turn_base = (static_cast<size_t>(b) * NH + h) * nq;  // this head's dQ turn counters
#pragma unroll 1
  for (int qt = qt_begin; qt < nq; ++qt) {
    const int stage = STAGES == 2 ? (qt - qt_begin) & 1 : 0;
    if constexpr (STAGES == 2) {
      if (qt + 1 < nq) issue_tile(qt + 1, stage ^ 1);  // that buffer was last read before the mid-loop barrier
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile qt is in; the previous tile's dS^T is no longer read; its dQ part is stored
    // Pass the previous tile's dQ turn on (the barrier ordered every thread's part before it);
    // key block 0 is the last of every tile and passes nothing.
    if (threadIdx.x == 0 && qt > qt_begin && kt > 0)
      store_release(dq_turns + turn_base + qt - 1, last_key_tile(qt - 1) - kt + 1);

    const int q_first = qt * BM;
    const bf16* q_s = sQ + stage * BM * LD;
    const bf16* do_s = sdO + stage * BM * LD;
    const float* L_s = sL + stage * BM;
    const float* D_s = sD + stage * BM;
    bf16* ds_w = sdS + warp * 16 * kDsLD;  // the warp's 16 rows of dS^T

    // Queries in chunks of QC: S^T and dP^T take QC / 2 registers each (at HS 128 the whole tile's
    // 64 beside dK and dV's 128 would spill).
#pragma unroll
    for (int qc = 0; qc < BM; qc += QC) {
      if (q_first + qc + QC - 1 + delta < key0) {  // no query of these sees a key of the warp: dS^T = 0
#pragma unroll
        for (int i = 0; i < 16 * (QC / 8) / kWarpSize; ++i) {
          const int e = lane + i * kWarpSize, r = e / (QC / 8), c = qc + (e % (QC / 8)) * 8;
          *reinterpret_cast<int4*>(ds_w + r * kDsLD + c) = make_int4(0, 0, 0, 0);
        }
        continue;
      }
      float st[QC / 8][4], dpt[QC / 8][4];
#pragma unroll
      for (int nt = 0; nt < QC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t ak[4], av[4];
        ldmatrix_x4(ak, sK + warp * 16 * LD + kk * 16 + lane_offset_x(lane, LD));
        ldmatrix_x4(av, sV + warp * 16 * LD + kk * 16 + lane_offset_x(lane, LD));
#pragma unroll
        for (int np = 0; np < QC / 16; ++np) {
          uint32_t bq[4], bo[4];
          ldmatrix_x4(bq, q_s + (qc + np * 16) * LD + kk * 16 + lane_offset_y(lane, LD));
          mma_x2(st[2 * np], st[2 * np + 1], ak, bq);
          ldmatrix_x4(bo, do_s + (qc + np * 16) * LD + kk * 16 + lane_offset_y(lane, LD));
          mma_x2(dpt[2 * np], dpt[2 * np + 1], av, bo);
        }
      }
      // Element e of n-tile nt: key key0 + g + 8 (e / 2), query column qc + 8nt + 2t + e % 2 of the tile.
      const bool need_mask = q_first + qc + delta < key0 + 15;  // some query of the chunk misses some key of the warp
#pragma unroll
      for (int nt = 0; nt < QC / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = qc + nt * 8 + 2 * t + (e & 1);
          float p = exp2f(fmaf(st[nt][e], scale_log2, -L_s[col]));
          if (need_mask && q_first + col + delta < key0 + g + 8 * (e >> 1)) p = 0.0f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - D_s[col]);  // dS^T
        }
        store_pair(ds_w + g * kDsLD + qc + nt * 8 + 2 * t, dpt[nt][0], dpt[nt][1]);
        store_pair(ds_w + (g + 8) * kDsLD + qc + nt * 8 + 2 * t, dpt[nt][2], dpt[nt][3]);
      }
      // dV += P^T dO, dK += dS^T Q: 16 queries per k-step.
#pragma unroll
      for (int kk = 0; kk < QC / 16; ++kk) {
        uint32_t ap[4], ads[4];
        acc_to_a(ap, st[2 * kk], st[2 * kk + 1]);
        acc_to_a(ads, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < HS / 16; ++np) {
          uint32_t bo[4], bq[4];
          ldmatrix_x4_trans(bo, do_s + (qc + kk * 16) * LD + np * 16 + lane_offset_x(lane, LD));
          mma_x2(dv[2 * np], dv[2 * np + 1], ap, bo);
          ldmatrix_x4_trans(bq, q_s + (qc + kk * 16) * LD + np * 16 + lane_offset_x(lane, LD));
          mma_x2(dk[2 * np], dk[2 * np + 1], ads, bq);
        }
      }
    }
    // The tile's dQ is summed over key blocks kt = last_key_tile(qt), ..., 0 in that order
    // (header, step 4). Thread 0 looks at the turn now, while other warps finish: the block ahead
    // is usually done by then, and the barrier below then carries its acquire to every thread.
    const int pos = last_key_tile(qt) - kt;
    const bool first = pos == 0, last = kt == 0;
    int* turn = dq_turns + turn_base + qt;
    float* acc = dq_acc + (turn_base + qt) * BM * HS;  // the tile's partial sum, beside its counter's index
    if (threadIdx.x == 0) s_turn_ready = first || load_acquire(turn) >= pos;
    __syncthreads();  // dS^T of the block's keys is in shared memory; Q and dO are no longer read
    if constexpr (STAGES == 1) {
      if (qt + 1 < nq) issue_tile(qt + 1, 0);  // overlaps the dQ product and the ordered add below
      cp_async_commit();
    }

    // dQ part of this key block: warp w takes queries 16w .. 16w + 15, 64 channels at a time (32
    // accumulators: at HS 128 all of them at once would spill beside dK and dV).
    if (!s_turn_ready) wait_turn(turn, pos);
    const int qw = warp * 16;
#pragma unroll
    for (int c0 = 0; c0 < HS; c0 += 64) {
      float dq[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        if (kt * BN + kk * 16 > q_first + qw + 15 + delta) break;  // no query of the warp sees these keys
        uint32_t a[4];
        ldmatrix_x4_trans(a, sdS + kk * 16 * kDsLD + qw + lane_offset_y(lane, kDsLD));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, sK + kk * 16 * LD + c0 + np * 16 + lane_offset_x(lane, LD));
          mma_x2(dq[2 * np], dq[2 * np + 1], a, bk);
        }
      }
      float2 prev[8][2];  // all loads in flight at once: one L2 round trip
      if (!first) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            prev[nt][r] = __ldcg(reinterpret_cast<const float2*>(acc + (qw + g + 8 * r) * HS + c0 + nt * 8 + 2 * t));
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = qw + g + 8 * r, col = c0 + nt * 8 + 2 * t, qi = q_first + row;
          float2 v = make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]);
          if (!first) v = make_float2(prev[nt][r].x + v.x, prev[nt][r].y + v.y);
          if (!last)
            __stcg(reinterpret_cast<float2*>(acc + row * HS + col), v);
          else if (qi < Tq && (!kBlock || gr.dq))  // (a block's dq, dk or dv may be null: not wanted)
            store_gradient(gr.dq + q_index(qi) + col, v.x, v.y, scale, kBlock);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0 && kt > 0 && meets_queries)
    store_release(dq_turns + turn_base + nq - 1, last_key_tile(nq - 1) - kt + 1);

  // dK and dV: a key/value head's are the sum of its group's query heads, added in head order
  // through fp32 scratch (G = 1: written at once).
  float* kacc = dkv_acc + ((static_cast<size_t>(b) * NKV + kvh) * nk + kt) * 2 * BN * HS;
  float* vacc = kacc + BN * HS;
  int* turn = dkv_turns + (static_cast<size_t>(b) * NKV + kvh) * nk + kt;
  const bool first = j == 0, last = j == G - 1;
  wait_turn(turn, j);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r, kj = kt * BN + row;
    const size_t at = k_index(kj) + 2 * t;  // (b, kj, kvh, column 2t)
    bf16* dkrow = kj < Tk && (!kBlock || gr.dk) ? (kBlock ? gr.dk : gr.dq) + at : nullptr;
    bf16* dvrow = kj < Tk && (!kBlock || gr.dv) ? (kBlock ? gr.dv : gr.dq) + at + v_from_k : nullptr;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      ordered_add(kacc + row * HS + col, dkrow ? dkrow + nt * 8 : nullptr, dk[nt][2 * r], dk[nt][2 * r + 1], first,
                  last, scale, kBlock);
      ordered_add(vacc + row * HS + col, dvrow ? dvrow + nt * 8 : nullptr, dv[nt][2 * r], dv[nt][2 * r + 1], first,
                  last, 1.0f, kBlock);
    }
  }
  if (!last) pass_turn(turn, j);
}

// The kernels' parameters are scalars (the strides follow from the head counts): ptxas allocates
// these kernels' registers at the 255 limit, and parameter structs moved them to spilling more.
// Causal self-attention on a packed qkv, its gradient written into dqkv:
template <int HS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    flash_backward_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* Dvec,
                          float* dq_acc, float* dkv_acc, int* dq_turns, int* dkv_turns, int* ticket, int T, int NH,
                          int NKV, float scale, float scale_log2) {
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;
  const FlashProblem p{qkv, nullptr, nullptr, rs, rs, rs * T, T, T, NH, NKV, 0, kOneSplit};
  const FlashGrads gr{dout, dqkv, nullptr, nullptr};  // (dk and dv are within dqkv's rows)
  flash_backward<HS, false>(p, gr, lse, Dvec, dq_acc, dkv_acc, dq_turns, dkv_turns, ticket, scale, scale_log2);
}
// ... and a block of queries against keys held apart, its gradients added to dq, dk and dv:
template <int HS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    flash_block_backward_kernel(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                                const bf16* v, const float* lse, const float* Dvec, float* dq_acc, float* dkv_acc,
                                int* dq_turns, int* dkv_turns, int* ticket, int Tq, int Tk, int NH, int NKV, int delta,
                                float scale, float scale_log2) {
  const size_t kv_stride = static_cast<size_t>(NKV) * HS;
  const FlashProblem p{q, k, v, static_cast<size_t>(NH) * HS, kv_stride, kv_stride * Tk, Tq, Tk, NH, NKV, delta,
                       kOneSplit};
  const FlashGrads gr{dout, dq, dk, dv};
  flash_backward<HS, true>(p, gr, lse, Dvec, dq_acc, dkv_acc, dq_turns, dkv_turns, ticket, scale, scale_log2);
}

// The workspace (flash_backward_order.cuh) of this kernel's 128-query tiles, one dQ turn each.
BackwardWorkspace workspace_layout(int B, int Tq, int Tk, int NH, int NKV, int HS) {
  return backward_workspace(B, Tq, Tk, NH, NKV, HS, kBwdBlockM, kBwdBlockN, 1);
}

template <int HS, bool kBlock>
void launch_backward(const FlashProblem& p, const FlashGrads& gr, const float* lse, const float* D, int B,
                     void* workspace, cudaStream_t stream) {
  const size_t smem = backward_smem_bytes<HS>();
  if constexpr (kBlock)
    use_dynamic_shared(flash_block_backward_kernel<HS>, smem, [] { return "flash attention backward (block)"; });
  else
    use_dynamic_shared(flash_backward_kernel<HS>, smem, [] { return "flash attention backward"; });
  const BackwardWorkspace ws = workspace_layout(B, p.Tq, p.Tk, p.NH, p.NKV, HS);
  const BackwardScratch sc = backward_scratch(workspace, ws);
  CUDA_CHECK(cudaMemsetAsync(sc.dq_turns, 0, ws.counters() * sizeof(int), stream));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.Tk, kBwdBlockN)), static_cast<unsigned>(B * p.NH));
  const float scale = softmax_scale(p.scale, HS);
  if constexpr (kBlock)
    flash_block_backward_kernel<HS><<<grid, kBwdThreads, smem, stream>>>(
        gr.dq, gr.dk, gr.dv, gr.dout, p.q, p.k, p.v, lse, D, sc.dq_acc, sc.dkv_acc, sc.dq_turns, sc.dkv_turns,
        sc.ticket, p.Tq, p.Tk, p.NH, p.NKV, p.delta, scale, scale * kLog2e);
  else
    flash_backward_kernel<HS><<<grid, kBwdThreads, smem, stream>>>(gr.dq, gr.dout, p.q, lse, D, sc.dq_acc,
                                                                   sc.dkv_acc, sc.dq_turns, sc.dkv_turns, sc.ticket,
                                                                   p.Tq, p.NH, p.NKV, scale, scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

template <bool kBlock>
void launch_backward(const FlashProblem& p, const FlashGrads& gr, const float* lse, const float* D, int B, int HS,
                     void* workspace, cudaStream_t stream) {
  if (B <= 0 || p.Tq <= 0 || p.Tk <= 0) return;
  check_flash_heads("flash attention", B, p.NH, p.NKV);
  check(workspace != nullptr && is_aligned(workspace, 16),
        "flash attention backward: needs a 16-byte aligned workspace");
  with_flash_head_size("flash attention", HS, [&](auto hs) {
    launch_backward<decltype(hs)::value, kBlock>(p, gr, lse, D, B, workspace, stream);
  });
}

}  // namespace

size_t flash_attention_backward_workspace_bytes(int B, int T, int NH, int NKV, int HS) {
  return flash_attention_block_backward_workspace_bytes(B, T, T, NH, NKV, HS);
}

void flash_attention_backward_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
                                   int B, int T, int NH, int NKV, int HS, void* workspace, void* stream, float scale) {
  if (HS > 128 || uses_sm90_kernel(flash_backward_path()))  // (above 128 only the Hopper kernel has a size)
    return flash_attention_backward_sm90_bf16(dqkv, dout, qkv, lse, D, B, T, NH, NKV, HS, workspace, stream, scale);
  const FlashProblem p = packed_problem(qkv, T, NH, NKV, HS, scale);
  bf16* dq = static_cast<bf16*>(dqkv);
  const FlashGrads gr{static_cast<const bf16*>(dout), dq, nullptr, nullptr};  // (dk and dv are within dqkv's rows)
  launch_backward<false>(p, gr, lse, D, B, HS, workspace, as_stream(stream));
}

size_t flash_attention_block_backward_workspace_bytes(int B, int Tq, int Tk, int NH, int NKV, int HS) {
  // Enough for either kernel, whichever flash_backward_path() picks when it runs.
  const size_t sm80 = workspace_layout(B, Tq, Tk, NH, NKV, HS).bytes();
  const size_t sm90 = flash_backward_sm90_workspace_bytes(B, Tq, Tk, NH, NKV, HS);
  return sm80 > sm90 ? sm80 : sm90;
}

void flash_attention_block_backward_bf16(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                                         const void* v, const float* lse, const float* D, int B, int Tq, int Tk,
                                         int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                         void* workspace, void* stream) {
  if (uses_sm90_kernel(flash_backward_path()))
    return flash_attention_block_backward_sm90_bf16(dq, dk, dv, dout, q, k, v, lse, D, B, Tq, Tk, NH, NKV, HS, q_pos0,
                                                    k_pos0, causal, workspace, stream);
  const FlashGrads gr{static_cast<const bf16*>(dout), static_cast<bf16*>(dq), static_cast<bf16*>(dk),
                      static_cast<bf16*>(dv)};
  launch_backward<true>(block_problem(q, k, v, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal), gr, lse, D, B, HS,
                        workspace, as_stream(stream));
}

}  // namespace pt::gpu
