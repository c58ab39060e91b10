// The linear layer, out[N, OC] = inp[N, IC] @ w[OC, IC]^T + bias, and its backward:
// dinp = dout @ w, dw += dout^T @ inp, dbias += sum_n dout. The GELU-fused variants
// (matmul_gelu_forward, matmul_backward_input_dgelu) are, here, the compositions Ops defines
// them as: the reference for the GPU's fused epilogues.
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward (dinp and dw). Bytes: each operand once plus
// the output (tiny next to the FLOPs at training shapes): this op is compute-bound.
//
// All three products are one routine, C (+)= A @ B, with A and B given by strides so that the
// transposes cost nothing (a GotoBLAS/BLIS-style blocked GEMM, kept short):
//  - work items are tiles of C, kRowTile rows x kColTile columns, run in parallel;
//  - a tile walks K in blocks of kK; per block it packs its rows of A into row groups
//    ([kK][kRows], the kRows values of one k adjacent) and its columns of B into panels
//    ([kK][kPanel]), both zero-padded, so the inner kernel reads memory contiguously whatever
//    the strides were (an A block is 64 KiB, L2; a B panel 8 KiB, L1);
//  - the micro-kernel keeps a kRows x kPanel tile of C in 8 SSE registers and, per k, does one
//    broadcast of A per row and kRows x kPanel multiply-adds against one row of the B panel.
//    `omp simd` over the kPanel columns is all g++ -O3 needs to vectorise it with plain SSE2
//    (no -march): each lane is its own dependency chain, so no fast-math reassociation either.
// Determinism: every C element is owned by one tile and sums its k in a fixed order
// (C + block 0 + block 1 + ..., each block k-ascending), whichever thread runs the tile.
// Measured (g++ 12 -O3, no -march, 2-core AMD EPYC VM) at N=512, IC=512, OC=2048: ~30 GFLOP/s
// on one thread, ~60 on two, forward and backward alike (run: test_cpu_ops "[bench]"); about
// a third of that while other jobs compile on the same two cores.
#include <algorithm>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_ops.h"
#include "core/cpu/cpu_parallel.h"

namespace pt {

namespace {
using cpu::Strided;

constexpr int kRows = 4;        // rows of the register tile
constexpr int kPanel = 8;       // columns of the register tile (2 SSE vectors)
constexpr int kK = 256;         // K block: one B panel block is 8 KiB (L1), an A row tile 64 KiB (L2)
constexpr int kRowTile = 64;    // rows of C per work item
constexpr int kPanelTile = 16;  // panels (128 columns) of C per work item
static_assert(kRowTile % kRows == 0, "a row tile is whole row groups (the packing buffer assumes it)");

// Packs rows [r0, r0+rows) x k [k0, k0+kc) of A into row groups: group g holds [kc][kRows].
void pack_a(float* dst, Strided a, int r0, int rows, int k0, int kc) {
  for (int g = 0; g * kRows < rows; g++) {
    float* out = dst + size_t(g) * kc * kRows;
    for (int k = 0; k < kc; k++)
      for (int r = 0; r < kRows; r++) {
        int row = g * kRows + r;
        out[k * kRows + r] = row < rows ? a.at(r0 + row, k0 + k) : 0.0f;
      }
  }
}

// Packs k [k0, k0+kc) x columns [c0, c0+cols) of B into panels: panel q holds [kc][kPanel].
void pack_b(float* dst, Strided b, int c0, int cols, int k0, int kc) {
  for (int q = 0; q * kPanel < cols; q++) {
    float* out = dst + size_t(q) * kc * kPanel;
    for (int k = 0; k < kc; k++)
      for (int j = 0; j < kPanel; j++) {
        int col = q * kPanel + j;
        out[k * kPanel + j] = col < cols ? b.at(k0 + k, c0 + col) : 0.0f;
      }
  }
}

// acc = sum_k a[k][r] * b[k][j] over one packed A row group and one packed B panel.
inline void micro_kernel(const float* a, const float* b, int kc, float acc[kRows][kPanel]) {
  float c[kRows][kPanel] = {};
  for (int k = 0; k < kc; k++) {
    const float* bk = b + k * kPanel;
    for (int r = 0; r < kRows; r++) {
      float av = a[k * kRows + r];
#pragma omp simd
      for (int j = 0; j < kPanel; j++) c[r][j] += av * bk[j];
    }
  }
  for (int r = 0; r < kRows; r++)
    for (int j = 0; j < kPanel; j++) acc[r][j] = c[r][j];
}

}  // namespace

namespace cpu {

// C[M, Ncols] (row stride ldc) = init + A[M, K] @ B[K, Ncols], where init is C itself when
// accumulating, else bias[col] (or 0 when bias is null).
// One parallel loop over the C tiles, each packing its own blocks of A and B: A is packed once
// per column tile and B once per row tile, about 1% extra work (1/(2*kColTile) + 1/(2*kRowTile)
// of the FLOPs), bought to have a single barrier per call. Packing shared blocks first would
// need a barrier per K block, and on a small shared CPU every barrier waits for the slowest
// (preempted) thread: measured, that version ran at a third of this one's speed under load.
void gemm(float* C, long long ldc, int M, int Ncols, int K, Strided a, Strided b, const float* bias,
          bool accumulate) {
  constexpr int kColTile = kPanelTile * kPanel;
  int row_tiles = (M + kRowTile - 1) / kRowTile;
  int col_tiles = (Ncols + kColTile - 1) / kColTile;
#pragma omp parallel
  {
    // Per-thread packing buffers, kept across calls (OpenMP threads persist) so that no call
    // page-faults fresh memory.
    thread_local std::vector<float> apack(size_t(kRowTile) * kK), bpack(size_t(kColTile) * kK);
    // Dynamic: a tile's result does not depend on which thread computes it, and a thread
    // that the OS preempts should not hold back a fixed share of the tiles.
#pragma omp for collapse(2) schedule(dynamic)
    for (int rt = 0; rt < row_tiles; rt++) {
      for (int ct = 0; ct < col_tiles; ct++) {
        int r0 = rt * kRowTile, rows = std::min(kRowTile, M - r0);
        int c0 = ct * kColTile, cols = std::min(kColTile, Ncols - c0);
        if (!accumulate)
          for (int i = r0; i < r0 + rows; i++)
            for (int j = c0; j < c0 + cols; j++) C[i * ldc + j] = bias ? bias[j] : 0.0f;
        for (int k0 = 0; k0 < K; k0 += kK) {
          int kc = std::min(kK, K - k0);
          pack_a(apack.data(), a, r0, rows, k0, kc);
          pack_b(bpack.data(), b, c0, cols, k0, kc);
          for (int q = 0; q * kPanel < cols; q++) {
            const float* bp = bpack.data() + size_t(q) * kc * kPanel;
            int qcols = std::min(kPanel, cols - q * kPanel);
            for (int g = 0; g * kRows < rows; g++) {
              float acc[kRows][kPanel];
              micro_kernel(apack.data() + size_t(g) * kc * kRows, bp, kc, acc);
              int grows = std::min(kRows, rows - g * kRows);
              for (int r = 0; r < grows; r++) {
                float* crow = C + (r0 + g * kRows + r) * ldc + c0 + q * kPanel;
                for (int j = 0; j < qcols; j++) crow[j] += acc[r][j];
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace cpu

void CpuOps::matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) {
  cpu::check_dims("matmul_forward", {N, IC, OC});
  float* o = cpu::f32_arg(out, size_t(N) * OC, "matmul_forward", "out");
  const float* x = cpu::f32_arg(inp, size_t(N) * IC, "matmul_forward", "inp");
  const float* wt = cpu::f32_arg(w, size_t(OC) * IC, "matmul_forward", "w");
  const float* bs = cpu::optional_f32_arg(bias, OC, "matmul_forward", "bias");
  // out = inp @ w^T: B(k, col) = w[col, k].
  cpu::gemm(o, OC, N, OC, IC, Strided{x, IC, 1}, Strided{wt, 1, IC}, bs, /*accumulate=*/false);
}

void CpuOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                             int IC, int OC) {
  cpu::check_dims("matmul_backward", {N, IC, OC});
  float* dx = cpu::optional_f32_arg(dinp, size_t(N) * IC, "matmul_backward", "dinp");
  float* dwt = cpu::optional_f32_arg(dw, size_t(OC) * IC, "matmul_backward", "dw");
  float* db = cpu::optional_f32_arg(dbias, OC, "matmul_backward", "dbias");
  const float* dy = cpu::f32_arg(dout, size_t(N) * OC, "matmul_backward", "dout");
  if (dx) {
    const float* wt = cpu::f32_arg(w, size_t(OC) * IC, "matmul_backward", "w");
    cpu::gemm(dx, IC, N, IC, OC, Strided{dy, OC, 1}, Strided{wt, IC, 1}, nullptr, /*accumulate=*/false);
  }
  if (dwt) {
    const float* x = cpu::f32_arg(inp, size_t(N) * IC, "matmul_backward", "inp");
    // dw = dout^T @ inp: A(row=o, k=n) = dout[n, o].
    cpu::gemm(dwt, IC, OC, IC, N, Strided{dy, 1, OC}, Strided{x, IC, 1}, nullptr, /*accumulate=*/true);
  }
  if (db) {
    cpu::for_each_channel_block(OC, [&](int c0, int c1) {
      float acc[cpu::kChannelBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* row = dy + size_t(n) * OC;
#pragma omp simd
        for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
      }
      for (int c = c0; c < c1; c++) db[c] += acc[c - c0];
    });
  }
}

void CpuOps::matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                 int OC) {
  matmul_forward(out_pre, inp, w, bias, N, IC, OC);
  gelu_forward(out, out_pre, size_t(N) * OC);
}

void CpuOps::matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC, int OC) {
  matmul_backward(dpre, Tensor{}, Tensor{}, dout, Tensor{}, w, N, IC, OC);
  gelu_backward(dpre, pre, dpre, size_t(N) * IC);  // in place: elementwise
}

}  // namespace pt
