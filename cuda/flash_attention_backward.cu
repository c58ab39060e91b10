// Flash attention backward, bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators), causal,
// head size 64 or 128, deterministic. Our own kernels, recomputing the probabilities from lse.
//
// Computes, per (b, h), with S = scale Q K^T (keys j <= query i), P = exp(S - lse),
// D_i = dO_i . O_i (attention_row_dot, computed before these kernels):
//   dP = dO V^T,  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO
// written (overwritten, one bf16 rounding) into the q | k | v parts of dqkv [B, T, (NH + 2 NKV) HS].
// Grouped-query attention: K, V are those of key/value head h / G (G = NH / NKV query heads per
// key/value head), and a key/value head's dK, dV are the sums of its G query heads'.
//
// Algorithm: two kernels, so that every output element has exactly one owner and is written
// once: no atomics, bitwise deterministic.
//  - dkdv: one block of 4 warps per (64-key tile, b*key/value head), key tile 0 (the most work)
//    first. Each warp owns 16 keys and keeps their dK and dV (16 x HS each) in fp32 registers.
//    The block loops over the G query heads of its group in order and, for each, walks the
//    query tiles from the diagonal to the end; per tile Q, dO (64 x HS), lse and D go to shared
//    memory, and per 16-query chunk the warp computes S^T = K Q^T and dP^T = V dO^T (2 n-tiles
//    each), P^T and dS^T in registers, then dV += P^T dO and dK += dS^T Q with the P^T / dS^T
//    accumulators reused as A fragments. Chunks wholly above the diagonal are skipped. The
//    group sum thus happens in the registers, in a fixed order (no float atomics across heads);
//    G = 1 is exactly the multi-head kernel.
//  - dq: one block per (64-query tile, b*h), longest rows first. Each warp owns 16 queries and
//    their dQ (fp32 registers); the block walks the key tiles (of its key/value head) up to the
//    diagonal, and per 16-key chunk computes S = Q K^T, dP = dO V^T, dS, then dQ += dS K.
// The split costs recomputing S and dP in both kernels: 7 T^2-sized products per head instead of
// the 5 of FlashAttention-2's single pass, which accumulates dQ with float atomics (the order of
// those adds, and so the result's last bits, would change from run to run).
// Registers: the dkdv kernel holds 2 * HS/2 fp32 accumulators per thread (128 at HS = 128);
// processing queries in 16-row chunks keeps the S^T / dP^T tiles at 8 registers each.
//
// Cost (causal): 7 * 2 * B*NH * (T^2/2) * HS FLOPs on tensor cores (independent of NKV); GPT-2
// 124M at B = 8, T = 1024: ~45 GFLOP per layer, ~46 us at 989 TFLOP/s. Bytes: qkv, dout once per
// tile pass (L2), dqkv written once ((NH + 2 NKV) * B*T*HS*2: the dK/dV part is NKV/NH of
// multi-head attention's, as are the K/V reads from DRAM), lse and D 8 B per row and tile pass.
// With G > 1 the dkdv grid has G times fewer blocks, each G times longer: at small B*NKV and T
// the GPU may be underfilled (a split over query heads would need a deterministic reduction).
#include <cmath>

#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"

namespace pt::gpu {

namespace {

using namespace flash;

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* Dvec,
                               int T, int NH, int NKV, float scale, float scale_log2) {
  constexpr int LD = row_stride<HS>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kRows * LD;
  bf16* sQ = sV + kRows * LD;
  bf16* sdO = sQ + kRows * LD;
  float* sL = reinterpret_cast<float*>(sdO + kRows * LD);  // lse in log2 units, per query of the tile
  float* sD = sL + kRows;

  const int C = NH * HS, G = NH / NKV;
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;
  const int kt = blockIdx.x, nq = gridDim.x;
  const int b = blockIdx.y / NKV, kvh = blockIdx.y % NKV;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const bf16* row_b = qkv + static_cast<size_t>(b) * T * rs;
  const size_t k_off = static_cast<size_t>(NH + kvh) * HS, v_off = static_cast<size_t>(NH + NKV + kvh) * HS;
  const int key0 = kt * kRows + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

  load_tile<HS>(sK, row_b + k_off, rs, kt * kRows, T);
  load_tile<HS>(sV, row_b + v_off, rs, kt * kRows, T);
  float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
  for (int nt = 0; nt < HS / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;

#pragma unroll 1
  for (int h = kvh * G; h < (kvh + 1) * G; ++h) {  // the group's query heads, in order
    const bf16* head = row_b + static_cast<size_t>(h) * HS;
    const bf16* dhead = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS;
    const size_t lbase = (static_cast<size_t>(b) * NH + h) * T;
    for (int qt = kt; qt < nq; ++qt) {
      __syncthreads();  // the previous query tile is no longer read
      load_tile<HS>(sQ, head, rs, qt * kRows, T);
      load_tile<HS>(sdO, dhead, C, qt * kRows, T);
      for (int i = threadIdx.x; i < kRows; i += kThreads) {
        const int q = qt * kRows + i;
        sL[i] = q < T ? lse[lbase + q] * kLog2e : 0.0f;
        sD[i] = q < T ? Dvec[lbase + q] : 0.0f;
      }
      __syncthreads();

#pragma unroll 1
      for (int qc = 0; qc < 4; ++qc) {
        if (qt == kt && qc < warp) continue;  // these 16 queries all precede the warp's 16 keys
        float st[2][4], dpt[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk) {
          uint32_t ak[4], av[4];
          load_a(ak, sK + warp * 16 * LD + kk * 16, LD, g, t);
          load_a(av, sV + warp * 16 * LD + kk * 16, LD, g, t);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            uint32_t bq[2], bo[2];
            load_b_nk(bq, sQ + (qc * 16 + n * 8) * LD + kk * 16, LD, g, t);
            mma(st[n], ak, bq);
            load_b_nk(bo, sdO + (qc * 16 + n * 8) * LD + kk * 16, LD, g, t);
            mma(dpt[n], av, bo);
          }
        }
        // Element e of n-tile n: key key0 + 8*(e/2), query column qc*16 + n*8 + 2t + e%2 of the tile.
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kj = key0 + 8 * (e >> 1);
            const int col = qc * 16 + n * 8 + 2 * t + (e & 1);
            const int qi = qt * kRows + col;
            const bool valid = qi >= kj && qi < T && kj < T;
            const float p = valid ? exp2f(st[n][e] * scale_log2 - sL[col]) : 0.0f;
            st[n][e] = p;
            dpt[n][e] = p * (dpt[n][e] - sD[col]);  // dS^T
          }
        }
        uint32_t ap[4], ads[4];
        acc_to_a(ap, st[0], st[1]);
        acc_to_a(ads, dpt[0], dpt[1]);
#pragma unroll
        for (int nt = 0; nt < HS / 8; ++nt) {
          uint32_t bo[2], bq[2];
          load_b_kn(bo, sdO + qc * 16 * LD + nt * 8, LD, g, t);
          mma(dv[nt], ap, bo);
          load_b_kn(bq, sQ + qc * 16 * LD + nt * 8, LD, g, t);
          mma(dk[nt], ads, bq);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = key0 + 8 * r;
    if (kj >= T) continue;
    bf16* row = dqkv + (static_cast<size_t>(b) * T + kj) * rs + 2 * t;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
      store_pair(row + k_off + nt * 8, dk[nt][2 * r] * scale, dk[nt][2 * r + 1] * scale);
      store_pair(row + v_off + nt * 8, dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

// (kThreads, 1): without the explicit minimum ptxas capped HS = 128 at 128 registers on sm_90a
// and spilled; at ~160 registers three blocks still fit on an SM.
template <int HS>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* Dvec, int T,
                             int NH, int NKV, float scale, float scale_log2) {
  constexpr int LD = row_stride<HS>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdO = sQ + kRows * LD;
  bf16* sK = sdO + kRows * LD;
  bf16* sV = sK + kRows * LD;

  const int C = NH * HS;
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;
  const int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const bf16* row_b = qkv + static_cast<size_t>(b) * T * rs;
  const bf16* head = row_b + static_cast<size_t>(h) * HS;
  const bf16* khead = row_b + static_cast<size_t>(NH + kvh) * HS;
  const bf16* vhead = row_b + static_cast<size_t>(NH + NKV + kvh) * HS;
  const size_t lbase = (static_cast<size_t>(b) * NH + h) * T;
  const int row0 = qt * kRows + warp * 16 + g;  // this thread's queries: row0 and row0 + 8

  load_tile<HS>(sQ, head, rs, qt * kRows, T);
  load_tile<HS>(sdO, dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS, C, qt * kRows, T);
  float lse2[2], Drow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = row0 + 8 * r;
    lse2[r] = q < T ? lse[lbase + q] * kLog2e : 0.0f;
    Drow[r] = q < T ? Dvec[lbase + q] : 0.0f;
  }
  float dq[HS / 8][4];
#pragma unroll
  for (int nt = 0; nt < HS / 8; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();
    load_tile<HS>(sK, khead, rs, kt * kRows, T);
    load_tile<HS>(sV, vhead, rs, kt * kRows, T);
    __syncthreads();

#pragma unroll 1
    for (int kc = 0; kc < 4; ++kc) {
      if (kt == qt && kc > warp) continue;  // these 16 keys all follow the warp's 16 queries
      float s[2][4], dp[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        uint32_t aq[4], ao[4];
        load_a(aq, sQ + warp * 16 * LD + kk * 16, LD, g, t);
        load_a(ao, sdO + warp * 16 * LD + kk * 16, LD, g, t);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t bk[2], bv[2];
          load_b_nk(bk, sK + (kc * 16 + n * 8) * LD + kk * 16, LD, g, t);
          mma(s[n], aq, bk);
          load_b_nk(bv, sV + (kc * 16 + n * 8) * LD + kk * 16, LD, g, t);
          mma(dp[n], ao, bv);
        }
      }
      // Element e of n-tile n: query row0 + 8*(e/2), key kt*64 + kc*16 + n*8 + 2t + e%2.
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int qi = row0 + 8 * r;
          const int kj = kt * kRows + kc * 16 + n * 8 + 2 * t + (e & 1);
          const bool valid = kj <= qi && qi < T;  // kj <= qi < T also keeps kj inside the sequence
          const float p = valid ? exp2f(s[n][e] * scale_log2 - lse2[r]) : 0.0f;
          s[n][e] = p * (dp[n][e] - Drow[r]);  // dS
        }
      }
      uint32_t ads[4];
      acc_to_a(ads, s[0], s[1]);
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt) {
        uint32_t bk[2];
        load_b_kn(bk, sK + kc * 16 * LD + nt * 8, LD, g, t);
        mma(dq[nt], ads, bk);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = row0 + 8 * r;
    if (qi >= T) continue;
    bf16* dst = dqkv + (static_cast<size_t>(b) * T + qi) * rs + static_cast<size_t>(h) * HS + 2 * t;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) store_pair(dst + nt * 8, dq[nt][2 * r] * scale, dq[nt][2 * r + 1] * scale);
  }
}

template <typename K>
void set_shared(K kernel, size_t bytes) {
  check(bytes <= static_cast<size_t>(max_dynamic_shared_bytes()),
        "flash attention backward: " + std::to_string(bytes) +
            " bytes of shared memory exceed this GPU's per-block limit");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int HS>
void launch_backward(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D, int B, int T,
                     int NH, int NKV, cudaStream_t stream) {
  const size_t tile = size_t(kRows) * row_stride<HS>() * sizeof(bf16);
  const size_t smem_kv = 4 * tile + 2 * kRows * sizeof(float);
  const size_t smem_q = 4 * tile;
  set_shared(flash_backward_dkdv_kernel<HS>, smem_kv);
  set_shared(flash_backward_dq_kernel<HS>, smem_q);
  const unsigned tiles = static_cast<unsigned>(ceil_div(T, kRows));
  const dim3 grid_kv(tiles, static_cast<unsigned>(B * NKV)), grid_q(tiles, static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float scale_log2 = scale * kLog2e;
  bf16* dx = static_cast<bf16*>(dqkv);
  const bf16* dy = static_cast<const bf16*>(dout);
  const bf16* x = static_cast<const bf16*>(qkv);
  flash_backward_dkdv_kernel<HS>
      <<<grid_kv, kThreads, smem_kv, stream>>>(dx, dy, x, lse, D, T, NH, NKV, scale, scale_log2);
  CUDA_CHECK_LAUNCH();
  flash_backward_dq_kernel<HS><<<grid_q, kThreads, smem_q, stream>>>(dx, dy, x, lse, D, T, NH, NKV, scale, scale_log2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_attention_backward_bf16(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
                                   int B, int T, int NH, int NKV, int HS, void* stream) {
  if (B <= 0 || T <= 0) return;
  check(static_cast<long long>(B) * NH <= 65535, "flash attention: B * n_heads exceeds the grid's y limit 65535");
  check(NKV > 0 && NH % NKV == 0, "flash attention: n_kv_heads must divide n_heads");
  switch (HS) {
    case 64:
      return launch_backward<64>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, as_stream(stream));
    case 128:
      return launch_backward<128>(dqkv, dout, qkv, lse, D, B, T, NH, NKV, as_stream(stream));
    default:
      throw RuntimeError("flash attention: head size " + std::to_string(HS) +
                         " has no tensor-core kernel (64 or 128); the CUDA-core kernels handle it");
  }
}

}  // namespace pt::gpu
