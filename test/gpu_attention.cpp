// CudaOps attention (flash_attention_*.cu on tensor cores, attention_tiled.cu on CUDA cores)
// against CpuOps on random inputs, causal, forward and backward:
//  - kCases, awkward sizes for both kernel families: T not a multiple of any tile (1, 33, 40, 65,
//    67, 129, 130, 200), head sizes 64 and 128 in bf16 (the tensor-core kernels), 12, 32, 40, 80
//    and 96 in bf16 (the same kernels on heads zero-padded to 64 or 128), and 32, 5, 64, 128 in
//    fp32 plus 5, 136, 192 and 256 in bf16 (the CUDA-core kernels; on Hopper with its backward,
//    136 to 256 take the Hopper kernels at head size 256), grouped-query attention (NKV key/value
//    heads < NH query heads) through both; small, so that compute-sanitizer runs them all
//    (gpu_check.sh leaves out the [flash] test cases);
//  - flash_sweep(), the tensor-core path in bf16 as training runs it: every T in {1, 65, 129, 200,
//    257, 1024} (one row; ragged last tiles of the forward's 128-query and the backward's
//    128-key and 128-query tiles; several key blocks adding into one dQ tile) x HS {64, 128} x
//    groups 1:1, 4:1, 8:1 (NH 8 over NKV 8, 2, 1; the backward sums a group's query heads' dK and
//    dV across blocks, in head order), and T 4096 (32 key blocks adding into the last dQ tiles, in
//    turn) at B 1 with few
//    heads, since CpuOps is O(T^2) per head: HS 128 at 1:1, HS 64 at 4:1;
//  - kConcurrent: B*NH 64 (B 4, NH 16, T 1024; HS 64 at 1:1, HS 128 at 4:1), so that many blocks
//    are in flight at once: the backward's dQ is summed across key blocks through fp32 scratch in
//    an order fixed by per-tile turn counters, and a fault in that order shows only when blocks
//    race;
//  - the cases above with the sm_80 kernels forced (the forward's default, auto, takes the Hopper
//    kernel where there is one), then again with the Hopper forward
//    (flash_attention_forward_sm90.cu), the Hopper backward (flash_attention_backward_sm90.cu)
//    and both forced on, where the GPU and the build have them.
// Every output is poisoned first, dqkv too (the backward overwrites it, so an element it leaves
// unwritten or adds to fails); the backward runs from the reference's out and lse so that only the
// backward is measured. Determinism: each case runs the forward and the backward `runs` times
// (3, kConcurrent 10), each rerun bitwise equal to the first; the backward's reruns write into
// the previous result (overwrite, not add) and reuse a workspace the previous call left behind
// (its counters must be reset by the call, not assumed zero). A last check chains the GPU's own
// forward into its backward. A qkv slice that is not 16-byte aligned takes the CUDA-core kernels
// (bf16 at HS 64 too). Tolerances: gpu_test_support.h (lse is fp32: 1e-4 in bf16 mode), the same
// for GQA as for MHA and at every T.
// Cost: the CPU reference dominates, one CpuOps forward and backward per case, ~10 s in all on 2
// cores; CpuOps' backward runs one thread per (b, key/value head), so its longest case (T 4096,
// a group of 4) is ~2 s on one core whatever the machine. Expected ~10 s for the binary on a
// 16-core GPU machine.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cuda/attention.h"
#include "test/gpu_flash_paths.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

struct Case {
  DType mode;
  int B, T, NH, HS;
  int NKV = 0;   // key/value heads; 0: NH (multi-head)
  int runs = 3;  // forward and backward runs, each bitwise equal to the first
};

const Case kCases[] = {
    {DType::f32, 2, 67, 3, 32},    // CUDA-core kernels, three 32-row tiles, the last partial
    {DType::f32, 1, 40, 3, 5},     // an odd head size
    {DType::f32, 1, 129, 2, 64},   // fp32 at a tensor-core head size still takes the fp32 kernels
    {DType::bf16, 2, 129, 2, 64},  // tensor cores: two 128-query tiles, the last with one row
    {DType::bf16, 2, 129, 2, 128},
    {DType::bf16, 1, 64, 1, 64},   // half a 128-row tile
    {DType::bf16, 2, 67, 3, 32},   // bf16 at HS 32: the HS 64 kernels on zero-padded heads
    {DType::bf16, 2, 130, 2, 96},  // HS 96: the HS 128 kernels on zero-padded heads
    {DType::bf16, 1, 67, 2, 40},   // HS 40, padded to 64
    {DType::bf16, 1, 40, 2, 12},   // HS 12 (not a multiple of 16), padded to 64
    {DType::bf16, 1, 40, 3, 5},    // bf16 on the CUDA-core kernels (HS not a multiple of 8)
    {DType::bf16, 1, 33, 1, 136},  // ... and above 128 (on Hopper with its backward: padded to 256)
    {DType::bf16, 1, 130, 2, 256},  // HS 256: the CUDA-core kernels, or on Hopper its kernels at 256
    {DType::bf16, 1, 1, 2, 64},    // one row: a tile with 127 padding rows and keys
    {DType::bf16, 1, 200, 4, 64},  // several tiles: each key block walks several query tiles
    {DType::bf16, 3, 65, 1, 128},  // HS 128, B > 1 with NH = 1
    {DType::f32, 1, 33, 2, 128},   // the CUDA-core kernels at HS 128 (opt-in shared memory)
    // Grouped-query attention.
    {DType::f32, 2, 67, 4, 32, 2},    // CUDA-core kernels, groups of 2
    {DType::f32, 1, 40, 6, 5, 1},     // one key/value head for 6 query heads, odd head size
    {DType::bf16, 2, 129, 4, 64, 1},  // tensor cores: one key/value head for 4 query heads
    {DType::bf16, 1, 200, 8, 64, 2},  // groups of 4, several tiles each way
    {DType::bf16, 1, 65, 8, 128, 1},  // groups of 8
    {DType::bf16, 2, 65, 4, 128, 2},  // HS 128 with groups of 2
    {DType::bf16, 2, 67, 6, 32, 3},   // bf16 at HS 32 (padded), groups of 2
    {DType::bf16, 1, 130, 8, 80, 2},  // HS 80 (padded to 128), groups of 4
    {DType::bf16, 1, 67, 4, 192, 2},  // HS 192, groups of 2 (on Hopper with its backward: padded to 256)
};

// The tensor-core sweep (see the header). B 2 up to T 257 (a second sequence's offsets), B 1 above.
std::vector<Case> flash_sweep() {
  std::vector<Case> cases;
  for (int T : {1, 65, 129, 200, 257, 1024})
    for (int HS : {64, 128})
      for (int NKV : {8, 2, 1}) cases.push_back({DType::bf16, T <= 257 ? 2 : 1, T, 8, HS, NKV});
  // T 4096 at B 1: CpuOps' backward runs one thread per (b, key/value head), each doing its
  // group's G query heads, 4 G T^2 HS FLOPs at ~9 GFLOP/s (8:1 at HS 64 would be 34 GFLOP on one
  // core), so HS 128 at 1:1 and a group of 4 at HS 64 (17 GFLOP, ~2 s); 8:1 is covered up to
  // T 1024.
  cases.push_back({DType::bf16, 1, 4096, 2, 128, 2});
  cases.push_back({DType::bf16, 1, 4096, 4, 64, 1});
  return cases;
}

// Many blocks at once (B*NH 64: 512 blocks of 128 keys in the backward, the dK/dV order across
// the query heads of groups of 4 at HS 128; the forward 512 of 128 queries), each run 10 times:
// a race in a cross-block order would change some bits of some run.
const Case kConcurrent[] = {
    {DType::bf16, 4, 1024, 16, 64, 0, 10},
    {DType::bf16, 4, 1024, 16, 128, 4, 10},
};

// Column `part` (0 q, 1 k, 2 v) of a packed [BT, W] dqkv, whose parts begin at `begin`.
std::vector<float> packed_part(const std::vector<float>& x, size_t BT, size_t W, const size_t (&begin)[4], int part) {
  std::vector<float> out;
  out.reserve(BT * (begin[part + 1] - begin[part]));
  for (size_t r = 0; r < BT; ++r)
    out.insert(out.end(), x.begin() + r * W + begin[part], x.begin() + r * W + begin[part + 1]);
  return out;
}

void check_case(const Case& k) {
  const DType mode = k.mode;
  const int B = k.B, T = k.T, NH = k.NH, NKV = k.NKV ? k.NKV : k.NH, C = NH * k.HS;
  INFO("mode " << mode_name(mode) << ", B " << B << " T " << T << " NH " << NH << " NKV " << NKV << " HS " << k.HS);
  Ops& ops = gputest::gpu(mode);
  Tensors g(ops), c(cpu());
  const size_t W = size_t(NH + 2 * NKV) * k.HS;  // the packed q | k | v row
  const size_t BT = size_t(B) * T, nqkv = BT * W, nout = BT * C, nlse = size_t(B) * NH * T;

  const std::vector<float> qkv = rounded(mode, random_normal(nqkv, 1.0f, 71));
  Tensor cqkv = c.make(qkv, DType::f32), cout = c.zeros(nout, DType::f32), clse = c.zeros(nlse, DType::f32);
  cpu().attention_forward(cout, clse, cqkv, B, T, C, NH, NKV);
  Tensor gqkv = g.make(qkv, mode), gout = g.zeros(nout, mode), glse = g.zeros(nlse, DType::f32);
  std::vector<float> first_out, first_lse;
  for (int run = 0; run < k.runs; ++run) {
    g.poison(gout);
    g.poison(glse);
    ops.attention_forward(gout, glse, gqkv, B, T, C, NH, NKV);
    if (run == 0) {
      first_out = g.read(gout);
      first_lse = g.read(glse);
      expect_close("out", first_out, c.read(cout), tolerance(mode, mode));
      expect_close("lse", first_lse, c.read(clse), tolerance(mode, DType::f32));
    } else {
      INFO("forward run " << run);
      CHECK(bitwise_equal(g.read(gout), first_out));
      CHECK(bitwise_equal(g.read(glse), first_lse));
    }
  }

  // Backward from the reference forward: out rounded to the mode (what the GPU would have
  // stored) on both sides, lse as computed in fp32.
  const std::vector<float> out = rounded(mode, c.read(cout)), lse = c.read(clse);
  const std::vector<float> dout = rounded(mode, random_normal(nout, 1.0f, 72));
  Tensor cd = c.zeros(nqkv, DType::f32);
  cpu().attention_backward(cd, c.make(dout, DType::f32), cqkv, c.make(out, DType::f32), clse, B, T, C, NH, NKV);
  const std::vector<float> ref = c.read(cd);
  Tensor gdout = g.make(dout, mode), gout_r = g.make(out, mode), glse_r = g.make(lse, DType::f32);
  Tensor gd = g.zeros(nqkv, mode);
  g.poison(gd);
  ops.attention_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
  const std::vector<float> got = g.read(gd);
  expect_close("dqkv", got, ref, tolerance(mode, mode));
  // The q, k and v parts separately (a bug in one part could hide in the total).
  const size_t begin[4] = {0, size_t(C), size_t(C) + size_t(NKV) * k.HS, W};
  const char* part_name[3] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p)
    expect_close(part_name[p], packed_part(got, BT, W, begin, p), packed_part(ref, BT, W, begin, p),
                 tolerance(mode, mode));
  // Deterministic and overwriting: the same backward again, into the previous result, gives the
  // same bits.
  for (int run = 1; run < k.runs; ++run) {
    INFO("backward run " << run);
    ops.attention_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
    CHECK(bitwise_equal(g.read(gd), got));
  }

  // The GPU's own forward feeding its backward. Its reference is the backward above: in fp32
  // rounded() is the identity, so that is exactly CpuOps' chained backward; in bf16 it is the CPU
  // backward from the CPU out rounded as the GPU stores it, which the GPU's chain approximates
  // (hence the wider bound). One CPU backward per case instead of two.
  g.poison(gd);
  ops.attention_backward(gd, gdout, gqkv, gout, glse, B, T, C, NH, NKV);
  expect_close("dqkv after the GPU forward", g.read(gd), ref, mode == DType::f32 ? 1e-5 : 2e-2);
}

}  // namespace

// The kernels a case runs (test/gpu_flash_paths.h; unset, the forward is auto, the Hopper kernel
// where there is one, and the backward the sm_80 kernel): these cases force the sm_80 kernels, the
// Hopper cases below the Hopper kernels, so that both are checked on a Hopper GPU.

TEST_CASE("attention_forward and attention_backward match CpuOps", "[gpu][attention]") {
  const KernelPaths sm80(kMma, kMma);
  for (const Case& k : kCases) check_case(k);
}

TEST_CASE("flash attention matches CpuOps: T up to 4096, HS 64 and 128, groups 1:1, 4:1, 8:1",
          "[gpu][attention][flash]") {
  const KernelPaths sm80(kMma, kMma);
  for (const Case& k : flash_sweep()) check_case(k);
}

TEST_CASE("flash attention is bitwise deterministic with many blocks in flight", "[gpu][attention][flash]") {
  const KernelPaths sm80(kMma, kMma);
  for (const Case& k : kConcurrent) check_case(k);
}

TEST_CASE("attention rejects a head count that does not divide C", "[gpu][attention]") {
  Ops& ops = gputest::gpu(DType::bf16);
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
  Ops& ops = gputest::gpu(mode);
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

// The Hopper kernels (wgmma, TMA, warp-specialised) forced on: the same cases, against CpuOps and
// bitwise repeatable; first the forward alone (feeding the sm_80 backward), then the backward
// alone (from the sm_80 forward's out and lse in the chained check), then both. The small cases
// apart from the sweeps, so that compute-sanitizer (gpu_check.sh's default filter ~[flash]) runs
// them; hopper_kernels_here() says what happens where the kernels are not. Last in the file: a
// kernel that faults leaves the CUDA context unusable for whatever runs after it in this process.
namespace {

void check_small_flash_cases() {
  for (const Case& k : kCases)
    if (k.mode == DType::bf16 && gpu::flash_padded_head_size(k.HS, true) != 0) check_case(k);  // (64 and 128 too)
}

void check_flash_sweeps() {
  for (const Case& k : flash_sweep()) check_case(k);
  for (const Case& k : kConcurrent) check_case(k);
}

}  // namespace

TEST_CASE("the Hopper flash forward matches CpuOps on awkward sizes", "[gpu][attention][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kWgmma, kMma);
  check_small_flash_cases();
}

TEST_CASE("the Hopper flash backward matches CpuOps on awkward sizes", "[gpu][attention][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kMma, kWgmma);
  check_small_flash_cases();
}

TEST_CASE("the Hopper flash forward matches CpuOps up to T 4096 and is bitwise deterministic",
          "[gpu][attention][flash][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kWgmma, kMma);
  check_flash_sweeps();
}

TEST_CASE("the Hopper flash backward matches CpuOps up to T 4096 and is bitwise deterministic",
          "[gpu][attention][flash][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kWgmma, kWgmma);
  check_flash_sweeps();
}
