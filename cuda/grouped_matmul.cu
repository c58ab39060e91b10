// The routed experts' grouped products, bf16 in, fp32 accumulation (sm_80 and later): G matmuls
// whose row groups [offsets[g], offsets[g + 1]) the kernels read from device memory, so a
// sparse block's experts run without the host learning how many rows each expert got.
//
// Computes, for group g with rows [r0, r1) (the contracts are Ops', core/ops/ops.h):
//   forward:  out[r0:r1]  = inp[r0:r1] @ W_g^T        M = r1 - r0, N = OC, K = IC   (row-grouped)
//   dinp:     dinp[r0:r1] = dout[r0:r1] @ W_g         M = r1 - r0, N = IC, K = OC   (row-grouped)
//   dW:       dW_g       += dout[r0:r1]^T @ inp[r0:r1]  M = OC, N = IC, K = r1 - r0 (k-grouped)
// as C[M, N] = A[M, K] B[K, N], each operand read in its stored layout: A "K-major" (element
// (m, k) at a[m lda + k]: inp, dout in forward and dinp) or "M-major" (a[k lda + m]: dout in dW);
// B "K-major" (b[n ldb + k]: W_g in forward) or "N-major" (b[k ldb + n]: W_g in dinp, inp in dW).
//
// How: one 256-thread block per 128 x 128 output tile, 8 warps of 64 x 32, K in steps of 32
// through a 3-stage cp.async pipeline into padded shared-memory tiles (row stride + 16 bytes:
// conflict-free ldmatrix), fragments by ldmatrix (.trans for the M- and N-major tiles) into
// mma.sync.m16n8k16 (cuda/flash_attention_mma.cuh's building blocks). Rows and columns past an
// operand's extent load as zeros and are not stored. Row-grouped launches enumerate (group,
// 128-row tile) pairs along grid y (at most rows/128 + G of them; a block past the last exits):
// each block finds its pair from the offsets in shared memory. The k-grouped dW takes group g at
// grid z and walks its rows as K. No atomics, one fixed summation order: bitwise deterministic.
// Each group's product is the same sum as a plain matmul of its rows, though not cuBLASLt's bits.
//
// FLOPs and bytes: each product is 2 rows IC OC FLOPs over all groups (e.g. Mixtral-like
// experts, 16k routed rows, C 4096, H 14336: 1.9 TFLOP for the up product, ~2.9 ms at
// mma.sync's ~660 TFLOP/s dense bf16 on an H100). Every block reads its A and B panels once per
// tile: A is re-read N/128 times and B M/128 times, from L2 for neighbouring blocks; compute-bound
// for K >= a few hundred. The floor is the matmul's: mma.sync reaches ~2/3 of Hopper's wgmma peak.
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/flash_attention_mma.cuh"
#include "cuda/grouped_matmul.h"

namespace pt::gpu {

namespace {

using flash::bf16;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3, kThreads = 256;
constexpr int kWarpM = 64, kWarpN = 32;  // 2 x 4 warps
constexpr int kMFrags = kWarpM / 16, kNFrags = kWarpN / 8;
constexpr int kMaxGroups = 1024;  // the offsets a row-grouped block scans, kept in shared memory
static_assert(kBM == kBN, "one tile shape serves both operands");

// An operand tile in shared memory: K-major [128 rows][32 + 8] or MN-major [32 k][128 + 8].
template <bool kKMajor>
struct Tile {
  static constexpr int ld = kKMajor ? kBK + 8 : kBM + 8;
  static constexpr int elems = kKMajor ? kBM * ld : kBK * ld;
};

template <bool kAKMajor, bool kBKMajor>
constexpr int smem_bytes() {
  return kStages * (Tile<kAKMajor>::elems + Tile<kBKMajor>::elems) * static_cast<int>(sizeof(bf16));
}

struct Problem {
  const bf16* a;
  const bf16* b;
  void* c;
  const int32_t* offsets;
  int G;
  int M, N, K;  // the extents that do not vary by group (row-grouped: N, K; k-grouped: M, N)
  int lda, ldb, ldc;
  size_t b_group, c_group;  // elements between groups' weights (row-grouped: b; k-grouped: c)
};

// Starts copying the tile of rows [row0, row0 + 128) and k [k0, k0 + 32) of an operand whose
// element (row, k) is at base[row ld + k] (K-major) or base[k ld + row] (MN-major); zeros past
// row_end or k_end. K-major operands have k_end % 8 == 0 and MN-major ones row_end % 8 == 0 (the
// launchers' IC, OC % 8), so a 16-byte chunk is wholly in or out.
template <bool kKMajor>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* base, int ld, int row0, int row_end, int k0,
                                          int k_end) {
  constexpr int kChunksPerLine = (kKMajor ? kBK : kBM) / 8;
  constexpr int kChunks = (kKMajor ? kBM : kBK) * kChunksPerLine;
#pragma unroll
  for (int c = static_cast<int>(threadIdx.x); c < kChunks; c += kThreads) {
    const int line = c / kChunksPerLine, at = (c % kChunksPerLine) * 8;
    const int row = row0 + (kKMajor ? line : at), k = k0 + (kKMajor ? at : line);
    const bool valid = row < row_end && k < k_end;
    const size_t offset = kKMajor ? size_t(row) * ld + k : size_t(k) * ld + row;
    flash::cp_async_16(dst + line * Tile<kKMajor>::ld + at, valid ? base + offset : base, valid);
  }
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = {x, y}; }
__device__ __forceinline__ void store2(bf16* p, float x, float y) { flash::store_pair(p, x, y); }

// kAKMajor, kBKMajor: the operands' layouts (above); kGroupK: the dW form (groups along K, C +=).
template <bool kAKMajor, bool kBKMajor, bool kGroupK, typename OutT>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(Problem p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sA = reinterpret_cast<bf16*>(smem_raw);
  bf16* sB = sA + kStages * Tile<kAKMajor>::elems;

  // This block's group g, its first row r0, and the extents.
  int g = -1, r0 = 0, m0 = static_cast<int>(blockIdx.y) * kBM, m_end = p.M, k_end = p.K;
  if constexpr (kGroupK) {
    g = static_cast<int>(blockIdx.z);
    r0 = p.offsets[g];
    k_end = p.offsets[g + 1] - r0;
    if (k_end <= 0) return;  // no rows: dW_g gains nothing
  } else {
    __shared__ int offsets[kMaxGroups + 1];
    for (int i = static_cast<int>(threadIdx.x); i <= p.G; i += kThreads) offsets[i] = p.offsets[i];
    __syncthreads();
    int t = static_cast<int>(blockIdx.y);
    for (int i = 0; i < p.G; ++i) {
      const int rows = offsets[i + 1] - offsets[i], tiles = rows > 0 ? (rows + kBM - 1) / kBM : 0;
      if (t < tiles) {
        g = i;
        r0 = offsets[i];
        m0 = t * kBM;
        m_end = rows;
        break;
      }
      t -= tiles;
    }
    if (g < 0) return;  // past the last group's last tile
  }
  const int n0 = static_cast<int>(blockIdx.x) * kBN;
  const bf16* a = p.a + size_t(r0) * p.lda;
  const bf16* b = p.b + (kGroupK ? size_t(r0) * p.ldb : size_t(g) * p.b_group);

  const int k_tiles = (k_end + kBK - 1) / kBK;
  auto load_stage = [&](int stage, int kt) {
    load_tile<kAKMajor>(sA + stage * Tile<kAKMajor>::elems, a, p.lda, m0, m_end, kt * kBK, k_end);
    load_tile<kBKMajor>(sB + stage * Tile<kBKMajor>::elems, b, p.ldb, n0, p.N, kt * kBK, k_end);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    flash::cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wm = (warp / 4) * kWarpM, wn = (warp % 4) * kWarpN;
  float acc[kMFrags][kNFrags][4] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    flash::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt is in; every warp is done with the stage the next load overwrites
    if (kt + kStages - 1 < k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    flash::cp_async_commit();
    const bf16* tA = sA + (kt % kStages) * Tile<kAKMajor>::elems;
    const bf16* tB = sB + (kt % kStages) * Tile<kBKMajor>::elems;
    constexpr int lda_s = Tile<kAKMajor>::ld, ldb_s = Tile<kBKMajor>::ld;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[kMFrags][4], bfr[kNFrags / 2][4];
#pragma unroll
      for (int i = 0; i < kMFrags; ++i) {
        if constexpr (kAKMajor)
          flash::ldmatrix_x4(af[i], tA + (wm + i * 16) * lda_s + kk + flash::lane_offset_x(lane, lda_s));
        else
          flash::ldmatrix_x4_trans(af[i], tA + kk * lda_s + wm + i * 16 + flash::lane_offset_y(lane, lda_s));
      }
#pragma unroll
      for (int j = 0; j < kNFrags / 2; ++j) {
        if constexpr (kBKMajor)
          flash::ldmatrix_x4(bfr[j], tB + (wn + j * 16) * ldb_s + kk + flash::lane_offset_y(lane, ldb_s));
        else
          flash::ldmatrix_x4_trans(bfr[j], tB + kk * ldb_s + wn + j * 16 + flash::lane_offset_x(lane, ldb_s));
      }
#pragma unroll
      for (int i = 0; i < kMFrags; ++i)
#pragma unroll
        for (int j = 0; j < kNFrags / 2; ++j) flash::mma_x2(acc[i][2 * j], acc[i][2 * j + 1], af[i], bfr[j]);
    }
  }
  flash::cp_async_wait<0>();

  // Each accumulator pair (row g / g + 8, columns 2t, 2t + 1) to C; dW adds to what is there.
  OutT* c = static_cast<OutT*>(p.c) + (kGroupK ? size_t(g) * p.c_group : size_t(r0) * p.ldc);
  const int gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int i = 0; i < kMFrags; ++i)
#pragma unroll
    for (int j = 0; j < kNFrags; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = m0 + wm + i * 16 + gq + 8 * half, n = n0 + wn + j * 8 + 2 * tq;
        if (m >= m_end || n >= p.N) continue;  // N is even: n < N covers n + 1
        OutT* o = c + size_t(m) * p.ldc + n;
        float x = acc[i][j][2 * half], y = acc[i][j][2 * half + 1];
        if constexpr (kGroupK) {
          x += to_f32(o[0]);
          y += to_f32(o[1]);
        }
        store2(o, x, y);
      }
}

template <bool kAKMajor, bool kBKMajor, bool kGroupK, typename OutT>
void launch(const Problem& p, dim3 grid, void* stream) {
  constexpr int smem = smem_bytes<kAKMajor, kBKMajor>();
  auto kernel = grouped_gemm_kernel<kAKMajor, kBKMajor, kGroupK, OutT>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  CUDA_CHECK_LAUNCH();
}

// Row-grouped launches: grid x over N, y over every (group, 128-row tile) pair that can exist.
dim3 row_grouped_grid(int rows, int G, int N, const char* op) {
  const long long y = ceil_div<long long>(rows, kBM) + G;
  check(y <= 65535, std::string(op) + ": " + std::to_string(rows) + " rows in " + std::to_string(G) +
                        " groups exceed one launch's tiles");
  return dim3(static_cast<unsigned>(ceil_div(N, kBN)), static_cast<unsigned>(y));
}

void check_problem(int G, int rows, int IC, int OC, const char* op) {
  check(G >= 1 && G <= kMaxGroups && rows >= 0 && IC % 8 == 0 && OC % 8 == 0 && IC > 0 && OC > 0,
        std::string(op) + ": G " + std::to_string(G) + ", IC " + std::to_string(IC) + ", OC " + std::to_string(OC) +
            " (the tensor-core kernel takes 1-" + std::to_string(kMaxGroups) + " groups, IC and OC multiples of 8)");
}

}  // namespace

bool grouped_matmul_fits(DType act, int G, int IC, int OC) {
  return act == DType::bf16 && G >= 1 && G <= kMaxGroups && IC > 0 && OC > 0 && IC % 8 == 0 && OC % 8 == 0;
}

void grouped_matmul_forward(void* out, const void* inp, const void* weight, const int32_t* offsets, int G, int rows,
                            int IC, int OC, void* stream) {
  check_problem(G, rows, IC, OC, "grouped_matmul_forward");
  if (rows == 0) return;
  const Problem p{static_cast<const bf16*>(inp), static_cast<const bf16*>(weight), out, offsets, G, 0, OC, IC,
                  IC, IC, OC, size_t(OC) * IC, 0};
  launch<true, true, false, bf16>(p, row_grouped_grid(rows, G, OC, "grouped_matmul_forward"), stream);
}

void grouped_matmul_backward_input(void* dinp, const void* dout, const void* weight, const int32_t* offsets, int G,
                                   int rows, int IC, int OC, void* stream) {
  check_problem(G, rows, IC, OC, "grouped_matmul_backward_input");
  if (rows == 0) return;
  const Problem p{static_cast<const bf16*>(dout), static_cast<const bf16*>(weight), dinp, offsets, G, 0, IC, OC,
                  OC, IC, IC, size_t(OC) * IC, 0};
  launch<true, false, false, bf16>(p, row_grouped_grid(rows, G, IC, "grouped_matmul_backward_input"), stream);
}

void grouped_matmul_backward_weight(DType dw_type, void* dweight, const void* dout, const void* inp,
                                    const int32_t* offsets, int G, int IC, int OC, void* stream) {
  check_problem(G, 0, IC, OC, "grouped_matmul_backward_weight");
  check(dw_type == DType::bf16 || dw_type == DType::f32, "grouped_matmul_backward_weight: dW must be bf16 or f32");
  const Problem p{static_cast<const bf16*>(dout), static_cast<const bf16*>(inp), dweight, offsets, G, OC, IC, 0,
                  OC, IC, IC, 0, size_t(OC) * IC};
  const dim3 grid(static_cast<unsigned>(ceil_div(IC, kBN)), static_cast<unsigned>(ceil_div(OC, kBM)),
                  static_cast<unsigned>(G));
  if (dw_type == DType::f32) launch<false, false, true, float>(p, grid, stream);
  else launch<false, false, true, bf16>(p, grid, stream);
}

}  // namespace pt::gpu
