// Flash attention forward, bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators), causal,
// head size 64 or 128. Our own kernel, in the FlashAttention-2 arrangement.
//
// Computes, per (b, h) and query i (scale = 1/sqrt(HS), keys j <= i):
//   lse_i = log sum_j exp(scale q_i.k_j),   out_i = sum_j exp(scale q_i.k_j - lse_i) v_j
// from qkv [B, T, (NH + 2 NKV) HS] into out [B, T, C] (bf16) and lse [B, NH, T] (fp32), where
// k and v are those of key/value head h / (NH / NKV) (grouped-query attention; NKV == NH is
// multi-head). The key/value head is only an address: no K/V head is ever repeated in memory.
//
// Algorithm: one block of 4 warps per (64-query tile, b*h); the tiles are launched longest
// first (the last query tile attends to the most keys). Each warp owns 16 query rows. For each
// 64-key tile up to the diagonal of the query head's key/value head:
//   1. K and V tiles go to shared memory (128-bit loads, rows past T zero-filled);
//   2. S = Q K^T for the warp's 16 x 64 block: 8 n-tiles x HS/16 k-steps of mma, Q and K
//      fragments read from shared memory;
//   3. online softmax in the base-2 domain: s *= scale*log2(e), the causal/past-T mask sets
//      -inf, the row max is reduced over the 4 lanes that share a row (shuffles), the running
//      output and sum are rescaled by 2^(m_old - m_new), p = 2^(s - m_new). Each thread keeps
//      a partial row sum for its 16 columns; the 4 partials are added only at the end (they
//      share the rescaling, so this is exact);
//   4. O += P V: the fp32 P accumulators are rounded to bf16 and used directly as A fragments
//      (no shared-memory round trip); V fragments come from shared memory.
// At the end O / l is written as bf16 and lse = (m + log2 l) * ln 2. Every row keeps key 0 of
// every tile it visits unmasked (tile kt <= the row's tile), so the running max is finite
// from the first tile; a guard still keeps a fully masked row at 0 instead of NaN.
// Never materialises the T x T matrix; the only O(T) state is per row (m, l, O in registers).
// Not done (yet): cp.async double buffering of the K/V tiles, ldmatrix, skipping the fully
// masked n-tiles of the diagonal tile, wgmma on sm_90a.
//
// Cost (causal): 2 * 2 * B*NH * (T^2/2) * HS FLOPs on tensor cores (S and P V), e.g. GPT-2 124M at
// B = 8, T = 1024: 12.9 GFLOP per layer, ~13 us at 989 TFLOP/s (the same under GQA: every query
// head still meets every key). Bytes: Q, O once (2 * B*T*NH*HS * 2), K/V once per query tile
// (from L2) but once from DRAM: 2 * B*T*NKV*HS * 2, NH/NKV less than multi-head attention, as
// the G = NH/NKV query heads of a group read the same K/V tiles; lse 4 B per row.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"

namespace pt::gpu {

namespace {

using namespace flash;

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, int NKV, float scale_log2) {
  constexpr int LD = row_stride<HS>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kRows * LD;
  bf16* sV = sK + kRows * LD;

  const int C = NH * HS;
  const size_t rs = static_cast<size_t>(NH + 2 * NKV) * HS;  // qkv row stride
  const int qt = gridDim.x - 1 - blockIdx.x;                 // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const bf16* row_b = qkv + static_cast<size_t>(b) * T * rs;
  const bf16* head = row_b + static_cast<size_t>(h) * HS;                // q
  const bf16* khead = row_b + static_cast<size_t>(NH + kvh) * HS;        // k of the group
  const bf16* vhead = row_b + static_cast<size_t>(NH + NKV + kvh) * HS;  // v of the group
  const int row0 = qt * kRows + warp * 16 + g;  // this thread's query rows: row0 and row0 + 8

  load_tile<HS>(sQ, head, rs, qt * kRows, T);
  float o[HS / 8][4];
#pragma unroll
  for (int nt = 0; nt < HS / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous K/V tile is no longer read
    load_tile<HS>(sK, khead, rs, kt * kRows, T);
    load_tile<HS>(sV, vhead, rs, kt * kRows, T);
    __syncthreads();

    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t a[4];
      load_a(a, sQ + warp * 16 * LD + kk * 16, LD, g, t);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t bk[2];
        load_b_nk(bk, sK + nt * 8 * LD + kk * 16, LD, g, t);
        mma(s[nt], a, bk);
      }
    }

    // Scale into the base-2 domain and mask: element e of n-tile nt is row row0 + 8*(e/2),
    // key kt*64 + nt*8 + 2t + e%2.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int qi = row0 + 8 * r, kj = kt * kRows + nt * 8 + 2 * t + (e & 1);
        const float v = (kj <= qi && kj < T) ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][e] = v;
        mx[r] = fmaxf(mx[r], v);
      }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far stays at 0, not NaN
      alpha[r] = exp2f(m_run[r] - m_use[r]);
      m_run[r] = m_new;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - m_use[e >> 1]);
        s[nt][e] = p;
        rowsum[e >> 1] += p;
      }
    }
    l_run[0] = l_run[0] * alpha[0] + rowsum[0];
    l_run[1] = l_run[1] * alpha[1] + rowsum[1];
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }

    // O += P V, 16 keys per k-step.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt) {
        uint32_t bv[2];
        load_b_kn(bv, sV + kk * 16 * LD + nt * 8, LD, g, t);
        mma(o[nt], a, bv);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int qi = row0 + 8 * r;
    if (qi >= T) continue;
    const float inv = 1.0f / l;
    bf16* dst = out + (static_cast<size_t>(b) * T + qi) * C + static_cast<size_t>(h) * HS + 2 * t;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
          __floats2bfloat162_rn(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    if (t == 0) lse[(static_cast<size_t>(b) * NH + h) * T + qi] = (m_run[r] + log2f(l)) * kLn2;
  }
}

template <int HS>
void launch_forward(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, cudaStream_t stream) {
  const size_t smem = 3 * size_t(kRows) * row_stride<HS>() * sizeof(bf16);
  check(smem <= static_cast<size_t>(max_dynamic_shared_bytes()),
        "flash attention: " + std::to_string(smem) + " bytes of shared memory exceed this GPU's per-block limit");
  CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kRows)), static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  flash_forward_kernel<HS><<<grid, kThreads, smem, stream>>>(static_cast<bf16*>(out), lse,
                                                             static_cast<const bf16*>(qkv), T, NH, NKV, scale_log2);
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
