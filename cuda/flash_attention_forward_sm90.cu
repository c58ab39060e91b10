// Flash attention forward on Hopper (sm_90a): wgmma, TMA, mbarriers and warp specialisation.
// The same math and outputs as flash_attention_forward.cu (the sm_80 kernel, whose header says
// what is computed: out and lse from the packed qkv, causal, grouped-query heads by address), and,
// as it does, a block of queries against keys held apart (ring attention's blocks: query i sees
// key j iff j <= i + delta and j < Tk; a row that sees no key gets out 0 and lse -inf). Arranged
// the way FlashAttention-3 is (our own code; its paper and hopper/ folder were read).
//
// Block: 3 warpgroups (384 threads) per (128-query tile, b*h), tiles launched longest first.
//  - Warpgroup 0, the producer, gives its registers to the others (setmaxnreg down to 24) and one
//    thread issues every copy: the block's Q tile once, then K and V tiles of 128 keys into a ring
//    of 2 stages, each stage with a "full" barrier per operand (K and V apart, so that Q K^T can
//    start before V has landed) and an "empty" barrier the consumers free it with.
//  - Warpgroups 1 and 2, the consumers (setmaxnreg up to 240), own 64 query rows each. Per key
//    tile: S = Q K^T (64 x 128) by wgmma from shared memory (Q and K K-major, HS/16 products of
//    k16), the causal mask only on the diagonal tile, the online softmax in the base-2 domain
//    (scale folded into one FFMA per element, as in the sm_80 kernel), P rounded to bf16 in
//    registers as wgmma's A operand, and O += P V by wgmma with V in shared memory read
//    MN-major (its [keys][HS] rows as TMA wrote them: no transpose). While one consumer does its
//    softmax the other's products keep the tensor cores busy.
//  - Copies are TMA (cp.async.bulk.tensor) through a 3-D tensor map of qkv [B][T][row]: rows past
//    T (the last tile of a sequence) arrive as zeros, never the next sequence's rows; every tile is
//    stored as 64-column sub-tiles in the 128-byte swizzle wgmma reads (hopper.cuh).
// At the end each consumer writes O / l straight from its accumulators (bf16 pairs) and lse.
//
// Head size 256 (a general path's largest size; Llama-style models use 64 and 128) takes key tiles
// of 64 (kBlockN): O holds 128 accumulators a thread, S 32, and O += P V is two products of 128
// columns.
// Resources: 384 threads, one block per SM; shared memory Q 128 x HS + 2 stages x (K + V) kBlockN x
// HS, bf16, plus 7 barriers and 1 KiB of alignment: 82,944 bytes (HS 64) / 164,864 (HS 128) /
// 197,632 (HS 256). Registers (consumer, HS 128): S 64 + O 64 fp32 and P 32 per thread (HS 256:
// S 32 + O 128 + P 16), at most 240 after setmaxnreg;
// the kernel as a whole is compiled for 168 (65,536 / 384). test/attention_ptx_check.sh checks
// wgmma, cp.async.bulk.tensor, setmaxnreg and mbarrier are in the PTX and that nothing spills.
// Cost: as the sm_80 kernel, 4 * B*NH * (T^2/2) * HS FLOPs; the target (issue #30) is
// FlashAttention-3's forward, 420-600 TFLOP/s on an H100 at T 4k-16k (the sm_80 kernel: 220-326).
//
// Status: written and checked offline (PTX, ptxas) on 2026-11-27; passed gpu_attention (every
// shape, bitwise repeats) on an H200 on 2026-11-28, where it ran 244-616 TFLOP/s against the sm_80
// kernel's 201-326 (bench/RESULTS.md), so it is the default forward wherever it is available
// (PICOTRAIN_FLASH_FORWARD=auto; flash_attention_paths.cpp). The block form (kBlock) was written
// on 2026-11-29 without a GPU: it runs only under PICOTRAIN_FLASH_FORWARD=wgmma until
// gpu_attention_block has passed it on one.
#include <cmath>

#include "core/common/flash_schedule.h"
#include "cuda/attention.h"
#include "cuda/flash_attention_mma.cuh"
#include "cuda/hopper.cuh"

namespace pt::gpu {

namespace {

using namespace flash;
using namespace hopper;

constexpr int kWgRows = 64;                     // query rows per consumer (wgmma's M)
constexpr int kBlockM = kConsumers * kWgRows;          // 128 queries per block
// Keys per tile: 128, or 64 at head size 256 (O's 128 accumulators per thread leave room for 32
// of S, not 64).
template <int HS>
constexpr int kBlockN = HS > 128 ? 64 : 128;
constexpr int kStages = 2;                             // K/V tiles in flight

// Shared-memory layout (byte offsets from a 1024-byte aligned base): Q of consumer w at
// kQ + w * kQWg, as HS/64 sub-tiles of [64 rows][64]; K and V of stage s at kK/kV + s * kTile, as
// HS/64 sub-tiles of [kBlockN rows][64]; then the barriers.
template <int HS>
struct Layout {
  static constexpr int kSubs = HS / kSwizzleCols;
  static constexpr uint32_t kQSub = kWgRows * kSwizzleRowBytes;       // 8 KiB
  static constexpr uint32_t kKVSub = kBlockN<HS> * kSwizzleRowBytes;  // 16 KiB (8 at HS 256)
  static constexpr uint32_t kQWg = kSubs * kQSub;
  static constexpr uint32_t kTile = kSubs * kKVSub;                   // one K or V tile: kBlockN x HS bf16
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + kConsumers * kQWg;
  static constexpr uint32_t kV = kK + kStages * kTile;
  static constexpr uint32_t kBars = kV + kStages * kTile;
  static constexpr int kNumBars = 1 + 3 * kStages;  // q_full, k_full[S], v_full[S], kv_empty[S]
  static constexpr size_t kBytes = 1024 + kBars + kNumBars * sizeof(uint64_t);
};

// O += P V for 16 keys, V's columns from desc_v on (each 64 one sub-tile further: HS 256 as two
// products of 128 columns, the second from sub-tile 2).
template <int HS>
__device__ __forceinline__ void wgmma_pv(float (&o)[HS / 8][4], const uint32_t (&p)[4], uint32_t v_addr) {
  using L = Layout<HS>;
  if constexpr (HS == 64) {
    wgmma_m64n64k16_rs_tb(o, p, sw128_desc(v_addr, L::kKVSub, 1024), 1);
  } else if constexpr (HS == 128) {
    wgmma_m64n128k16_rs_tb(o, p, sw128_desc(v_addr, L::kKVSub, 1024), 1);
  } else {
    static_assert(HS == 256, "head sizes 64, 128 and 256");
    wgmma_m64n128k16_rs_tb(*reinterpret_cast<float(*)[16][4]>(&o[0]), p, sw128_desc(v_addr, L::kKVSub, 1024), 1);
    wgmma_m64n128k16_rs_tb(*reinterpret_cast<float(*)[16][4]>(&o[16]), p,
                           sw128_desc(v_addr + 2 * L::kKVSub, L::kKVSub, 1024), 1);
  }
}
// S = Q K^T for one 16-column step: kBlockN<HS> keys.
template <int HS>
__device__ __forceinline__ void wgmma_scores(float (&sc)[kBlockN<HS> / 8][4], uint64_t desc_q, uint64_t desc_k,
                                             int accumulate) {
  if constexpr (kBlockN<HS> == 128)
    wgmma_m64n128k16_ss(sc, desc_q, desc_k, accumulate);
  else
    wgmma_m64n64k16_ss<0, 0>(sc, desc_q, desc_k, accumulate);
}

// 1 in the code compiled for sm_90a, 0 in every other arch's: read back from the module the device
// loaded, it says whether the kernel there is the real one (a build for plain sm_90 has only the
// trap).
__device__ int hopper_kernel_built = PT_HOPPER_DEVICE;  // never written

// kBlock: a block of Tq queries against Tk keys held apart, query i seeing key j iff j <= i + delta
// and j < Tk (ring attention's blocks); else causal self-attention (Tk = Tq, delta = 0, known at
// compile time). K's and V's head 0 start at columns k_col0 and v_col0 of their tensor maps.
template <int HS, bool kBlock>
__global__ void __launch_bounds__(kThreads, 1)
    flash_forward_sm90_kernel(bf16* out, float* lse, const __grid_constant__ CUtensorMap map_q,
                              const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                              int Tq, int Tk, int NH, int NKV, int delta, int k_col0, int v_col0, float scale_log2) {
#if PT_HOPPER_DEVICE
  using L = Layout<HS>;
  constexpr int BN = kBlockN<HS>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = aligned_1024(smem_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* kv_empty = v_full + kStages;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, kvh = h / (NH / NKV);
  const int q0 = qt * kBlockM;
  // The key tiles holding a key the block's last row sees (a block's rows may see none: out 0, lse -inf).
  const int n_kt = kBlock ? flash_schedule::forward_key_tiles(q0, kBlockM, Tq, Tk, delta, BN)
                          : ceil_div(min(q0 + kBlockM, Tq), BN);
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(kv_empty + s, kConsumers * 4);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_k);
      tma_prefetch_map(&map_v);
      mbar_arrive_expect_tx(q_full, kBlockM * HS * sizeof(bf16));
      for (int w = 0; w < kConsumers; ++w)
        for (int c = 0; c < L::kSubs; ++c)
          tma_load_3d(smem + L::kQ + w * L::kQWg + c * L::kQSub, &map_q, q_full, h * HS + c * kSwizzleCols,
                      q0 + w * kWgRows, b);
      const int k_col = k_col0 + kvh * HS, v_col = v_col0 + kvh * HS;
      for (int kt = 0; kt < n_kt; ++kt) {
        const int s = kt % kStages, use = kt / kStages;
        if (use > 0) mbar_wait(kv_empty + s, (use - 1) & 1);  // both consumers are done with it
        mbar_arrive_expect_tx(k_full + s, L::kTile);
        for (int c = 0; c < L::kSubs; ++c)
          tma_load_3d(smem + L::kK + s * L::kTile + c * L::kKVSub, &map_k, k_full + s, k_col + c * kSwizzleCols,
                      kt * BN, b);
        mbar_arrive_expect_tx(v_full + s, L::kTile);
        for (int c = 0; c < L::kSubs; ++c)
          tma_load_3d(smem + L::kV + s * L::kTile + c * L::kKVSub, &map_v, v_full + s, v_col + c * kSwizzleCols,
                      kt * BN, b);
      }
    }
    return;
  }

  // ---- consumers ----
  regs_claim<kConsumerRegs>();
  const int cw = wg - 1;
  const int warp = (threadIdx.x / kWarpSize) % 4, lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3;
  const int row0 = q0 + cw * kWgRows + warp * 16;  // this warp's first row (wgmma: 16 rows a warp)
  const uint32_t q_addr = smem_u32(smem + L::kQ + cw * L::kQWg);
  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);

  float o[HS / 8][4], sc[BN / 8][4];
#pragma unroll
  for (int j = 0; j < HS / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  mbar_wait(q_full, 0);
#pragma unroll 1
  for (int kt = 0; kt < n_kt; ++kt) {
    const int s = kt % kStages;
    const uint32_t parity = (kt / kStages) & 1;

    // S = Q K^T: HS/16 products of k16, the first overwriting S.
    mbar_wait(k_full + s, parity);
    fence_regs(sc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      const uint32_t in_sub = (kk % 4) * 32;  // 16 columns = 32 bytes along the swizzled row
      const uint64_t dq = sw128_desc(q_addr + (kk / 4) * L::kQSub + in_sub, 16, 1024);
      const uint64_t dk = sw128_desc(k_addr + s * L::kTile + (kk / 4) * L::kKVSub + in_sub, 16, 1024);
      wgmma_scores<HS>(sc, dq, dk, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sc);

    // The causal mask, only where some key of the tile follows what the warp's first row sees (a
    // block: or lies past its keys); then the online softmax of the warp's two rows (a row's 128
    // scores lie in its quad of lanes).
    if constexpr (kBlock) {
      if (kt * BN + BN - 1 > min(row0 + delta, Tk - 1))
        causal_mask<BN / 8, true>(sc, row0, kt * BN, g, t, delta, Tk);
    } else {
      if (kt * BN + BN - 1 > row0) causal_mask(sc, row0, kt * BN, g, t);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) softmax_row_step(sc, o, r, m_run[r], l_run[r], scale_log2);
    uint32_t p[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) acc_to_a(p[kk], sc[2 * kk], sc[2 * kk + 1]);

    // O += P V: 16 keys a product; V's k-th 16 rows start 16 x 128 bytes further, its next 64
    // columns one sub-tile (LBO) further.
    mbar_wait(v_full + s, parity);
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      wgmma_pv<HS>(o, p[kk], v_addr + s * L::kTile + kk * 16 * kSwizzleRowBytes);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(p);
    __syncwarp();
    if (lane == 0) mbar_arrive(kv_empty + s);  // this warp has read K and V of stage s
  }

  // O / l and lse, straight from the accumulators.
  const int C = NH * HS;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = row_sum_quad(l_run[r]);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int qi = row0 + g + 8 * r;
    if (qi < Tq) {
      bf16* orow = out + (static_cast<size_t>(b) * Tq + qi) * C + static_cast<size_t>(h) * HS;
#pragma unroll
      for (int j = 0; j < HS / 8; ++j) store_pair(orow + j * 8 + 2 * t, o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      if (t == 0) lse[(static_cast<size_t>(b) * NH + h) * Tq + qi] = row_lse(m_run[r], l, scale_log2);
    }
  }
#else
  __trap();  // never launched: flash_sm90_available() is false without sm_90a code
#endif
}

// ---- host side --------------------------------------------------------------------------------

// One launch: q (or qkv) rows of q_width elements, k and v rows of kv_width (k == v: one map
// serves both), the problem as the kernel takes it.
template <int HS, bool kBlock>
void launch_forward_sm90(void* out, float* lse, const void* q, size_t q_width, const void* k, const void* v,
                         size_t kv_width, int B, int Tq, int Tk, int NH, int NKV, int delta, int k_col0, int v_col0,
                         float scale, cudaStream_t stream) {
  const size_t smem = Layout<HS>::kBytes;
  use_dynamic_shared(flash_forward_sm90_kernel<HS, kBlock>, smem, [] { return "flash attention (sm_90a)"; });
  const CUtensorMap map_q = rows_tensor_map(q, B, Tq, q_width, kWgRows);
  const CUtensorMap map_k = rows_tensor_map(k, B, Tk, kv_width, kBlockN<HS>);
  const CUtensorMap map_v = v == k ? map_k : rows_tensor_map(v, B, Tk, kv_width, kBlockN<HS>);
  const dim3 grid(static_cast<unsigned>(ceil_div(Tq, kBlockM)), static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e * softmax_scale(scale, HS);
  flash_forward_sm90_kernel<HS, kBlock><<<grid, kThreads, smem, stream>>>(
      static_cast<bf16*>(out), lse, map_q, map_k, map_v, Tq, Tk, NH, NKV, delta, k_col0, v_col0, scale_log2);
  CUDA_CHECK_LAUNCH();
}

void check_launch(int B, int NH, int NKV) {
  check(flash_sm90_available(), "flash attention (sm_90a): needs a Hopper GPU and a build with sm_90a");
  check_flash_heads("flash attention (sm_90a)", B, NH, NKV);
}

}  // namespace

bool flash_sm90_available() {
  static const bool available = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    cudaFuncAttributes attr{};
    if (major != 9 || cudaFuncGetAttributes(&attr, flash_forward_sm90_kernel<64, false>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    int built = 0;  // the sm_90a code, not an sm_80 or plain sm_90 build's trap
    if (cudaMemcpyFromSymbol(&built, hopper_kernel_built, sizeof(built)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90 && built == 1;
  }();
  return available;
}

void flash_attention_forward_sm90_bf16(void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                                       void* stream, float scale) {
  check_launch(B, NH, NKV);
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * HS;  // a packed row: q heads | k heads | v heads
  with_hopper_head_size("flash attention (sm_90a)", HS, [&](auto hs) {
    launch_forward_sm90<decltype(hs)::value, false>(out, lse, qkv, W, qkv, qkv, W, B, T, T, NH, NKV, 0, NH * HS,
                                                    (NH + NKV) * HS, scale, as_stream(stream));
  });
}

void flash_attention_block_forward_sm90_bf16(void* out, float* lse, const void* q, const void* k, const void* v, int B,
                                             int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0,
                                             bool causal, void* stream) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return;
  check_launch(B, NH, NKV);
  const FlashProblem p = block_problem(q, k, v, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal);
  with_flash_head_size("flash attention (sm_90a)", HS, [&](auto hs) {
    launch_forward_sm90<decltype(hs)::value, true>(out, lse, q, p.q_stride, k, v, p.kv_stride, B, Tq, Tk, NH, NKV,
                                                   p.delta, 0, 0, 0.0f, as_stream(stream));
  });
}

}  // namespace pt::gpu
