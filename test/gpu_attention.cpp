// CudaOps attention (flash_attention_*.cu on tensor cores, attention_tiled.cu on CUDA cores)
// against CpuOps on random inputs of awkward sizes: T not a multiple of any tile (1, 33, 40, 65,
// 67, 129, 200), head sizes 64 and 128 in bf16 (the tensor-core kernels), and 32, 5, 64, 128 in
// fp32 plus 32 in bf16 (the CUDA-core kernels), and a qkv slice that is not 16-byte aligned (bf16
// at HS 64 then falls back to the CUDA-core kernels). Every output is poisoned first, dqkv too
// (the backward overwrites it, so an element it leaves unwritten or adds to fails); the backward
// runs from the reference's out and lse so that only the backward is measured, and once more
// to check it is bitwise deterministic. A last case chains the GPU's
// own forward into its backward. Grouped-query cases (NKV key/value heads < NH query heads; the
// dkdv kernels then loop over a group's query heads) run through both kernel families.
// Tolerances: gpu_test_support.h (lse is fp32: 1e-4 in bf16 mode), the same for GQA as for MHA.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

struct Case {
  DType mode;
  int B, T, NH, HS;
  int NKV = 0;  // key/value heads; 0: NH (multi-head)
};

const Case kCases[] = {
    {DType::f32, 2, 67, 3, 32},    // CUDA-core kernels, three 32-row tiles, the last partial
    {DType::f32, 1, 40, 3, 5},     // an odd head size
    {DType::f32, 1, 129, 2, 64},   // fp32 at a tensor-core head size still takes the fp32 kernels
    {DType::bf16, 2, 129, 2, 64},  // tensor cores: three 64-row tiles, the last with one row
    {DType::bf16, 2, 129, 2, 128},
    {DType::bf16, 1, 64, 1, 64},   // exactly one tile
    {DType::bf16, 2, 67, 3, 32},   // bf16 on the CUDA-core kernels
    {DType::bf16, 1, 1, 2, 64},    // one row: a tile with 63 padding rows and keys
    {DType::bf16, 1, 200, 4, 64},  // four tiles: dkdv walks several query tiles, dq several key tiles
    {DType::bf16, 3, 65, 1, 128},  // HS 128, a second tile holding one row, B > 1 with NH = 1
    {DType::f32, 1, 33, 2, 128},   // the CUDA-core kernels at HS 128 (opt-in shared memory)
    // Grouped-query attention.
    {DType::f32, 2, 67, 4, 32, 2},    // CUDA-core kernels, groups of 2
    {DType::f32, 1, 40, 6, 5, 1},     // one key/value head for 6 query heads, odd head size
    {DType::bf16, 2, 129, 4, 64, 1},  // tensor cores: one key/value head, dkdv loops over 4 query heads
    {DType::bf16, 1, 200, 8, 64, 2},  // groups of 4, several tiles each way
    {DType::bf16, 2, 65, 4, 128, 2},  // HS 128 with groups of 2
    {DType::bf16, 2, 67, 6, 32, 3},   // bf16 on the CUDA-core kernels, groups of 2
};

}  // namespace

TEST_CASE("attention_forward and attention_backward match CpuOps", "[gpu][attention]") {
  for (const Case& k : kCases) {
    const DType mode = k.mode;
    const int B = k.B, T = k.T, NH = k.NH, NKV = k.NKV ? k.NKV : k.NH, C = NH * k.HS;
    INFO("mode " << mode_name(mode) << ", B " << B << " T " << T << " NH " << NH << " NKV " << NKV << " HS " << k.HS);
    Ops& ops = gpu(mode);
    Tensors g(ops), c(cpu());
    const size_t W = size_t(NH + 2 * NKV) * k.HS;  // the packed q | k | v row
    const size_t BT = size_t(B) * T, nqkv = BT * W, nout = BT * C, nlse = size_t(B) * NH * T;

    const std::vector<float> qkv = rounded(mode, random_normal(nqkv, 1.0f, 71));
    Tensor cqkv = c.make(qkv, DType::f32), cout = c.zeros(nout, DType::f32), clse = c.zeros(nlse, DType::f32);
    cpu().attention_forward(cout, clse, cqkv, B, T, C, NH, NKV);
    Tensor gqkv = g.make(qkv, mode), gout = g.zeros(nout, mode), glse = g.zeros(nlse, DType::f32);
    g.poison(gout);
    g.poison(glse);
    ops.attention_forward(gout, glse, gqkv, B, T, C, NH, NKV);
    expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));
    expect_close("lse", g.read(glse), c.read(clse), tolerance(mode, DType::f32));

    // Backward from the reference forward: out rounded to the mode (what the GPU would have
    // stored) on both sides, lse as computed in fp32.
    const std::vector<float> out = rounded(mode, c.read(cout)), lse = c.read(clse);
    const std::vector<float> dout = rounded(mode, random_normal(nout, 1.0f, 72));
    Tensor cout_r = c.make(out, DType::f32), cdout = c.make(dout, DType::f32);
    Tensor gout_r = g.make(out, mode), glse_r = g.make(lse, DType::f32), gdout = g.make(dout, mode);
    {
      Tensor cd = c.zeros(nqkv, DType::f32), gd = g.zeros(nqkv, mode);
      g.poison(gd);
      cpu().attention_backward(cd, cdout, cqkv, cout_r, clse, B, T, C, NH, NKV);
      ops.attention_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
      const std::vector<float> ref = c.read(cd), got = g.read(gd);
      expect_close("dqkv", got, ref, tolerance(mode, mode));
      // The q, k and v parts separately (a bug in one part could hide in the total).
      std::vector<float> part_got[3], part_ref[3];
      const size_t begin[4] = {0, size_t(C), size_t(C) + size_t(NKV) * k.HS, W};
      for (size_t r = 0; r < BT; ++r)
        for (int p = 0; p < 3; ++p)
          for (size_t i = begin[p]; i < begin[p + 1]; ++i) {
            part_got[p].push_back(got[r * W + i]);
            part_ref[p].push_back(ref[r * W + i]);
          }
      expect_close("dq", part_got[0], part_ref[0], tolerance(mode, mode));
      expect_close("dk", part_got[1], part_ref[1], tolerance(mode, mode));
      expect_close("dv", part_got[2], part_ref[2], tolerance(mode, mode));
      // Deterministic and overwriting: the same backward again, into the previous result, gives
      // the same bits.
      ops.attention_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
      CHECK(bitwise_equal(g.read(gd), got));
    }

    // The GPU's own forward feeding its backward, against the CPU doing the same.
    Tensor cd = c.zeros(nqkv, DType::f32), gd = g.zeros(nqkv, mode);
    g.poison(gd);
    cpu().attention_backward(cd, cdout, cqkv, cout, clse, B, T, C, NH, NKV);
    ops.attention_backward(gd, gdout, gqkv, gout, glse, B, T, C, NH, NKV);
    expect_close("dqkv after the GPU forward", g.read(gd), c.read(cd), mode == DType::f32 ? 1e-5 : 2e-2);
  }
}

TEST_CASE("attention rejects a head count that does not divide C", "[gpu][attention]") {
  Ops& ops = gpu(DType::bf16);
  Tensors g(ops);
  Tensor qkv = g.zeros(3 * 10, DType::bf16), out = g.zeros(10, DType::bf16), lse = g.zeros(3, DType::f32);
  CHECK_THROWS_AS(ops.attention_forward(out, lse, qkv, 1, 1, 10, 3, 3), RuntimeError);
}

TEST_CASE("attention on a misaligned qkv slice falls back to the CUDA-core kernels", "[gpu][attention]") {
  // A qkv slice one element into its buffer is not 16-byte aligned: the tensor-core kernels'
  // 128-bit tile loads cannot run, and flash_attention_supported must send the call to the
  // CUDA-core kernels, which must give the same results.
  const DType mode = DType::bf16;
  const int B = 2, T = 70, NH = 2, HS = 64, C = NH * HS;
  Ops& ops = gpu(mode);
  Tensors g(ops), c(cpu());
  const size_t BT = size_t(B) * T, nqkv = BT * 3 * C, nout = BT * C, nlse = size_t(B) * NH * T;
  const std::vector<float> qkv = rounded(mode, random_normal(nqkv, 1.0f, 74));
  std::vector<float> shifted(1, 0.0f);
  shifted.insert(shifted.end(), qkv.begin(), qkv.end());
  Tensor cqkv = c.make(qkv, DType::f32), cout = c.zeros(nout, DType::f32), clse = c.zeros(nlse, DType::f32);
  cpu().attention_forward(cout, clse, cqkv, B, T, C, NH, NH);
  Tensor gqkv = g.make(shifted, mode).slice(1, nqkv);
  Tensor gout = g.zeros(nout, mode), glse = g.zeros(nlse, DType::f32);
  g.poison(gout);
  g.poison(glse);
  ops.attention_forward(gout, glse, gqkv, B, T, C, NH, NH);
  expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));
  expect_close("lse", g.read(glse), c.read(clse), tolerance(mode, DType::f32));

  const std::vector<float> out = rounded(mode, c.read(cout)), dout = rounded(mode, random_normal(nout, 1.0f, 75));
  Tensor cd = c.zeros(nqkv, DType::f32);
  cpu().attention_backward(cd, c.make(dout, DType::f32), cqkv, c.make(out, DType::f32), clse, B, T, C, NH, NH);
  Tensor gd = g.zeros(nqkv + 1, mode).slice(1, nqkv);  // misaligned gradient too
  g.poison(gd);
  ops.attention_backward(gd, g.make(dout, mode), gqkv, g.make(out, mode), g.make(c.read(clse), DType::f32), B, T, C, NH,
                         NH);
  expect_close("dqkv", g.read(gd), c.read(cd), tolerance(mode, mode));
}
