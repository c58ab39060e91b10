// CudaOps attention_block_forward/backward (attention_block.cu) and merge_attention_partials
// against CpuOps on random inputs: query/key counts that are not multiples of the 32-row tile,
// position offsets that leave the first queries with no key (out 0, lse -inf), a past block,
// the diagonal, non-causal, decoding (Tq = 1) against a long cache; f32 (head sizes 32, 5, 64,
// 128) and bf16 (32, 64, 128); the flash kernels on blocks (bf16 at head sizes 64 and 128: ring
// attention's blocks, offsets across their tiles, decoding; each case checks which kernels it
// runs; long KV caches, whose keys the forward splits over blocks; the blocks composed as ring
// attention composes them, against causal attention of the whole sequence); grouped-query
// attention (k, v with NKV < NH heads; dk/dv sum a group's query heads). The flash cases run on
// the sm_80 kernels, then (where the GPU has them) again on the Hopper kernels. Forward outputs
// are poisoned first; the backward runs from the reference's out and lse onto a nonzero start
// (checking "+="), per gradient, and once more for bitwise determinism. Tolerances:
// gpu_test_support.h (relative L2; lse -inf entries must match exactly).
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>
#include <cmath>
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
  int B, Tq, Tk, NH, HS, q_pos0, k_pos0;
  bool causal;
  int NKV = 0;  // key/value heads; 0: NH (multi-head)
};

const Case kCases[] = {
    {DType::f32, 2, 67, 45, 3, 32, 20, 0, true},  // rows 0..24 see a prefix, later ones all 45 keys
    {DType::f32, 1, 40, 70, 2, 5, 0, 30, true},   // queries 0..29 see no key; odd head size
    {DType::f32, 2, 33, 33, 2, 64, 7, 7, true},   // the diagonal block at an offset
    {DType::f32, 1, 1, 100, 4, 64, 99, 0, true},  // decoding: one query against a 100-token cache
    {DType::f32, 1, 1, 100, 4, 64, 40, 0, true},  // ... in the middle of a longer cache
    {DType::f32, 2, 20, 50, 2, 8, 0, 0, false},   // non-causal
    {DType::f32, 1, 9, 13, 2, 8, 0, 500, true},   // a future block: nothing visible anywhere
    {DType::bf16, 2, 67, 45, 3, 32, 20, 0, true},
    {DType::bf16, 1, 1, 129, 2, 64, 128, 0, true},
    // Grouped-query attention.
    {DType::f32, 2, 67, 45, 4, 32, 20, 0, true, 2},   // groups of 2, rows with a prefix of the keys
    {DType::f32, 1, 40, 70, 6, 5, 0, 30, true, 1},    // one key/value head; queries with no key
    {DType::f32, 2, 20, 50, 4, 8, 0, 0, false, 1},    // non-causal
    {DType::f32, 1, 1, 100, 8, 64, 40, 0, true, 2},   // decoding against a GQA cache
    {DType::bf16, 2, 67, 45, 6, 32, 20, 0, true, 3},  // bf16, groups of 2
    // Llama's head size 128, where every block kernel needs over 48 KiB of shared memory (the
    // opt-in limit, cudaFuncSetAttribute), with GQA in bf16 and at the diagonal in f32.
    {DType::bf16, 2, 67, 45, 8, 128, 20, 0, true, 2},
    {DType::f32, 1, 33, 33, 2, 128, 7, 7, true},
    // The flash kernels on blocks (bf16, head sizes 64 and 128): ring
    // attention's diagonal and past blocks at tile-ragged lengths, offsets that cross the 64- and
    // 128-row tiles, key tiles that no query reaches, non-causal, decoding, GQA up to 8:1.
    {DType::bf16, 2, 200, 200, 4, 64, 256, 256, true},      // ring: the diagonal block at an offset
    {DType::bf16, 2, 200, 200, 4, 64, 400, 0, true},        // ring: a past block (every key visible)
    {DType::bf16, 1, 150, 300, 4, 128, 100, 0, true, 2},    // query i sees keys <= i + 100
    {DType::bf16, 2, 10, 300, 2, 64, 0, 0, true},           // keys 128.. seen by no query
    {DType::bf16, 1, 70, 300, 8, 128, 0, 0, false, 2},      // non-causal, GQA 4:1
    {DType::bf16, 2, 1, 1000, 8, 128, 999, 0, true, 1},     // decoding, GQA 8:1
    {DType::bf16, 1, 3, 700, 4, 64, 697, 0, true, 4},       // three new tokens on a cache
    {DType::bf16, 1, 300, 257, 8, 64, 260, 0, true, 2},     // Tq > Tk, GQA 4:1
    {DType::bf16, 1, 40, 70, 2, 64, 0, 30, true},           // queries 0..29 see no key: flash forward only
    // Decoding on long caches, where the forward splits the keys over blocks and merges the parts
    // (flash-decoding), new tokens seeing all of the cache or (several) not its last keys.
    {DType::bf16, 1, 1, 8192, 12, 64, 8191, 0, true},
    {DType::bf16, 2, 1, 5000, 32, 128, 4999, 0, true, 8},
    {DType::bf16, 1, 4, 3000, 8, 128, 2996, 0, true, 2},
    {DType::bf16, 1, 2, 2000, 4, 64, 1500, 0, true},  // keys 1502.. seen by no query: empty parts
};

// lse: -inf where the reference has -inf, relative L2 over the finite rest.
void expect_lse(const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  std::vector<float> g, r;
  size_t mismatched = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      mismatched += !(std::isinf(got[i]) && got[i] < 0);
    } else {
      g.push_back(got[i]);
      r.push_back(ref[i]);
    }
  }
  INFO("lse: " << mismatched << " rows that see no key without -inf");
  CHECK(mismatched == 0);
  if (!r.empty()) expect_close("lse", g, r, tol);
}

// One case: forward and backward against CpuOps, the kernels it runs named, determinism.
void check_block_case(const Case& k) {
  const DType mode = k.mode;
  const int B = k.B, Tq = k.Tq, Tk = k.Tk, NH = k.NH, NKV = k.NKV ? k.NKV : k.NH, C = NH * k.HS;
  INFO("mode " << mode_name(mode) << ", B " << B << " Tq " << Tq << " Tk " << Tk << " NH " << NH << " NKV " << NKV
               << " HS " << k.HS << " q_pos0 " << k.q_pos0 << " k_pos0 " << k.k_pos0 << " causal " << k.causal);
  Ops& ops = gputest::gpu(mode);
  Tensors g(ops), c(cpu());
  const size_t nq = size_t(B) * Tq * C, nk = size_t(B) * Tk * NKV * k.HS, nlse = size_t(B) * NH * Tq;
  const std::vector<float> q = rounded(mode, random_normal(nq, 1.0f, 81)),
                           kk = rounded(mode, random_normal(nk, 1.0f, 82)),
                           v = rounded(mode, random_normal(nk, 1.0f, 83));
  Tensor cq = c.make(q, DType::f32), ck = c.make(kk, DType::f32), cv = c.make(v, DType::f32);
  Tensor cout = c.zeros(nq, DType::f32), clse = c.zeros(nlse, DType::f32);
  cpu().attention_block_forward(cout, clse, cq, ck, cv, B, Tq, Tk, C, NH, NKV, k.q_pos0, k.k_pos0, k.causal);
  Tensor gq = g.make(q, mode), gk = g.make(kk, mode), gv = g.make(v, mode);
  Tensor gout = g.zeros(nq, mode), glse = g.zeros(nlse, DType::f32);
  g.poison(gout);
  g.poison(glse);
  ops.attention_block_forward(gout, glse, gq, gk, gv, B, Tq, Tk, C, NH, NKV, k.q_pos0, k.k_pos0, k.causal);
  // Which kernels run: the flash ones wherever they apply (bf16, head size 64 or 128; in the
  // backward every query seeing key 0), so that each case above names the paths it checks.
  const bool flash = mode == DType::bf16 && (k.HS == 64 || k.HS == 128);
  const bool flash_backward = flash && (!k.causal || k.q_pos0 >= k.k_pos0);
  CHECK(gpu::flash_attention_block_supported(mode, k.HS, Tk, k.q_pos0, k.k_pos0, k.causal, false,
                                             {gq.data, gk.data, gv.data, gout.data}) == flash);
  CHECK(gpu::flash_attention_block_supported(mode, k.HS, Tk, k.q_pos0, k.k_pos0, k.causal, true,
                                             {gq.data, gk.data, gv.data, gout.data}) == flash_backward);
  expect_close("out", g.read(gout), c.read(cout), tolerance(mode, mode));
  expect_lse(g.read(glse), c.read(clse), tolerance(mode, DType::f32));

  // Backward from the reference forward, onto nonzero gradients.
  const std::vector<float> out = rounded(mode, c.read(cout)), lse = c.read(clse);
  const std::vector<float> dout = rounded(mode, random_normal(nq, 1.0f, 84));
  const std::vector<float> dq0 = rounded(mode, random_normal(nq, 0.1f, 85)),
                           dk0 = rounded(mode, random_normal(nk, 0.1f, 86)),
                           dv0 = rounded(mode, random_normal(nk, 0.1f, 87));
  Tensor cout_r = c.make(out, DType::f32), cdout = c.make(dout, DType::f32);
  Tensor cdq = c.make(dq0, DType::f32), cdk = c.make(dk0, DType::f32), cdv = c.make(dv0, DType::f32);
  cpu().attention_block_backward(cdq, cdk, cdv, cdout, cq, ck, cv, cout_r, clse, B, Tq, Tk, C, NH, NKV, k.q_pos0,
                                 k.k_pos0, k.causal);
  Tensor gout_r = g.make(out, mode), glse_r = g.make(lse, DType::f32), gdout = g.make(dout, mode);
  Tensor gdq = g.make(dq0, mode), gdk = g.make(dk0, mode), gdv = g.make(dv0, mode);
  ops.attention_block_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout_r, glse_r, B, Tq, Tk, C, NH, NKV, k.q_pos0,
                               k.k_pos0, k.causal);
  const std::vector<float> got_dq = g.read(gdq), got_dk = g.read(gdk), got_dv = g.read(gdv);
  expect_close("dq", got_dq, c.read(cdq), tolerance(mode, mode));
  expect_close("dk", got_dk, c.read(cdk), tolerance(mode, mode));
  expect_close("dv", got_dv, c.read(cdv), tolerance(mode, mode));

  // Deterministic, and a null gradient is skipped without touching the others.
  Tensor gdq2 = g.make(dq0, mode), gdk2 = g.make(dk0, mode), gdv2 = g.make(dv0, mode);
  ops.attention_block_backward(gdq2, gdk2, gdv2, gdout, gq, gk, gv, gout_r, glse_r, B, Tq, Tk, C, NH, NKV, k.q_pos0,
                               k.k_pos0, k.causal);
  CHECK(bitwise_equal(g.read(gdq2), got_dq));
  CHECK(bitwise_equal(g.read(gdk2), got_dk));
  CHECK(bitwise_equal(g.read(gdv2), got_dv));
  Tensor gdk3 = g.make(dk0, mode);
  ops.attention_block_backward(Tensor{}, gdk3, Tensor{}, gdout, gq, gk, gv, gout_r, glse_r, B, Tq, Tk, C, NH, NKV,
                               k.q_pos0, k.k_pos0, k.causal);
  CHECK(bitwise_equal(g.read(gdk3), got_dk));
}

// Ring attention's arithmetic on one GPU (core/parallel/ring_attention.cpp, without the ring): a
// sequence in two chunks, chunk 1's queries against chunk 0's keys (a past block) merged with its
// own diagonal block, the backward from the merged out and lse added block by block into dq, dk
// and dv, in bf16 on the flash kernels, against CpuOps' causal attention of the whole sequence.
// ([flash]: compute-sanitizer's runs leave it out, as gpu_attention's long sweeps: its kernels are
// the cases' above.)
void check_ring_composition() {
  const DType mode = DType::bf16;
  struct Shape {
    int NH, NKV, HS, Tc;
  };
  for (const Shape sh : {Shape{4, 4, 64, 300}, Shape{8, 2, 128, 200}, Shape{4, 1, 64, 1024}}) {
    const int NH = sh.NH, NKV = sh.NKV, HS = sh.HS, Tc = sh.Tc, T = 2 * Tc, C = NH * HS, CK = NKV * HS;
    const int W = C + 2 * CK;
    INFO("NH " << NH << " NKV " << NKV << " HS " << HS << " chunks of " << Tc);
    Ops& ops = gputest::gpu(mode);
    Tensors g(ops), c(cpu());
    const std::vector<float> qkv = rounded(mode, random_normal(size_t(T) * W, 1.0f, 95));
    const std::vector<float> dout = rounded(mode, random_normal(size_t(T) * C, 1.0f, 96));
    // The reference: one causal attention over the packed sequence.
    Tensor cqkv = c.make(qkv, DType::f32), cout = c.zeros(size_t(T) * C, DType::f32);
    Tensor clse = c.zeros(size_t(NH) * T, DType::f32), cdqkv = c.zeros(size_t(T) * W, DType::f32);
    cpu().attention_forward(cout, clse, cqkv, 1, T, C, NH, NKV);
    cpu().attention_backward(cdqkv, c.make(dout, DType::f32), cqkv, cout, clse, 1, T, C, NH, NKV);
    const std::vector<float> ref_out = c.read(cout), ref_lse = c.read(clse), ref_dqkv = c.read(cdqkv);

    // The chunks' q, k, v, dout as RingAttention unpacks them: [Tc, width] each.
    const auto part = [&](const std::vector<float>& rows, int width, int col0, int n, int chunk) {
      std::vector<float> out(size_t(Tc) * n);
      for (int t = 0; t < Tc; ++t)
        for (int j = 0; j < n; ++j) out[size_t(t) * n + j] = rows[size_t(chunk * Tc + t) * width + col0 + j];
      return out;
    };
    Tensor q[2], k[2], v[2], d[2], o[2], l[2], dq[2], dk[2], dv[2];
    for (int h = 0; h < 2; ++h) {
      q[h] = g.make(part(qkv, W, 0, C, h), mode);
      k[h] = g.make(part(qkv, W, C, CK, h), mode);
      v[h] = g.make(part(qkv, W, C + CK, CK, h), mode);
      d[h] = g.make(part(dout, C, 0, C, h), mode);
      o[h] = g.zeros(size_t(Tc) * C, mode);
      l[h] = g.zeros(size_t(NH) * Tc, DType::f32);
      dq[h] = g.zeros(size_t(Tc) * C, mode);
      dk[h] = g.zeros(size_t(Tc) * CK, mode);
      dv[h] = g.zeros(size_t(Tc) * CK, mode);
    }
    REQUIRE(gpu::flash_attention_block_supported(mode, HS, Tc, Tc, 0, true, true,
                                                 {q[1].data, k[0].data, v[0].data, o[1].data}));
    Tensor po = g.zeros(size_t(Tc) * C, mode), pl = g.zeros(size_t(NH) * Tc, DType::f32);
    ops.attention_block_forward(o[0], l[0], q[0], k[0], v[0], 1, Tc, Tc, C, NH, NKV, 0, 0, true);
    ops.attention_block_forward(o[1], l[1], q[1], k[0], v[0], 1, Tc, Tc, C, NH, NKV, Tc, 0, true);
    ops.attention_block_forward(po, pl, q[1], k[1], v[1], 1, Tc, Tc, C, NH, NKV, Tc, Tc, true);
    ops.merge_attention_partials(o[1], l[1], po, pl, 1, Tc, C, NH);
    ops.attention_block_backward(dq[0], dk[0], dv[0], d[0], q[0], k[0], v[0], o[0], l[0], 1, Tc, Tc, C, NH, NKV, 0,
                                 0, true);
    ops.attention_block_backward(dq[1], dk[0], dv[0], d[1], q[1], k[0], v[0], o[1], l[1], 1, Tc, Tc, C, NH, NKV, Tc,
                                 0, true);
    ops.attention_block_backward(dq[1], dk[1], dv[1], d[1], q[1], k[1], v[1], o[1], l[1], 1, Tc, Tc, C, NH, NKV, Tc,
                                 Tc, true);

    // Reassembled as the packed sequence (lse per head: [NH, T]).
    std::vector<float> out(size_t(T) * C), lse(size_t(NH) * T), dqkv(size_t(T) * W);
    for (int h = 0; h < 2; ++h) {
      const std::vector<float> oh = g.read(o[h]), lh = g.read(l[h]), dqh = g.read(dq[h]), dkh = g.read(dk[h]),
                               dvh = g.read(dv[h]);
      for (int t = 0; t < Tc; ++t) {
        const size_t row = size_t(h) * Tc + t;
        for (int j = 0; j < C; ++j) {
          out[row * C + j] = oh[size_t(t) * C + j];
          dqkv[row * W + j] = dqh[size_t(t) * C + j];
        }
        for (int j = 0; j < CK; ++j) {
          dqkv[row * W + C + j] = dkh[size_t(t) * CK + j];
          dqkv[row * W + C + CK + j] = dvh[size_t(t) * CK + j];
        }
        for (int hd = 0; hd < NH; ++hd) lse[size_t(hd) * T + row] = lh[size_t(hd) * Tc + t];
      }
    }
    expect_close("out", out, ref_out, tolerance(mode, mode));
    expect_close("lse", lse, ref_lse, tolerance(mode, DType::f32));
    expect_close("dqkv", dqkv, ref_dqkv, tolerance(mode, mode));
  }
}

}  // namespace

TEST_CASE("attention_block_forward and attention_block_backward match CpuOps", "[gpu][attention]") {
  const KernelPaths sm80(kMma, kMma);
  for (const Case& k : kCases) check_block_case(k);
}

TEST_CASE("the flash kernels composed as ring attention equal causal attention", "[gpu][attention][flash]") {
  const KernelPaths sm80(kMma, kMma);
  check_ring_composition();
}

TEST_CASE("merge_attention_partials matches CpuOps, empty rows included", "[gpu][attention]") {
  for (DType mode : {DType::f32, DType::bf16}) {
    INFO("mode " << mode_name(mode));
    Ops& ops = gputest::gpu(mode);
    Tensors g(ops), c(cpu());
    const int B = 2, T = 37, NH = 3, HS = 40, C = NH * HS;
    const size_t n = size_t(B) * T * C, nl = size_t(B) * NH * T;
    const std::vector<float> oa = rounded(mode, random_normal(n, 1.0f, 91)),
                             op = rounded(mode, random_normal(n, 1.0f, 92));
    std::vector<float> la = random_normal(nl, 2.0f, 93), lp = random_normal(nl, 2.0f, 94);
    for (size_t i = 0; i < nl; i += 5) la[i] = -INFINITY;   // only the part saw keys
    for (size_t i = 1; i < nl; i += 7) lp[i] = -INFINITY;   // only the accumulator did
    for (size_t i = 0; i < nl; i += 35) lp[i] = -INFINITY;  // neither
    Tensor coa = c.make(oa, DType::f32), cla = c.make(la, DType::f32);
    cpu().merge_attention_partials(coa, cla, c.make(op, DType::f32), c.make(lp, DType::f32), B, T, C, NH);
    Tensor goa = g.make(oa, mode), gla = g.make(la, DType::f32);
    ops.merge_attention_partials(goa, gla, g.make(op, mode), g.make(lp, DType::f32), B, T, C, NH);
    expect_close("out", g.read(goa), c.read(coa), tolerance(mode, mode));
    expect_lse(g.read(gla), c.read(cla), tolerance(mode, DType::f32));
  }
}

// The Hopper kernels (flash_attention_*_sm90.cu) forced on for the flash cases (the forward takes
// the blocks whose keys it does not split; decoding's splits stay on the sm_80 kernel), and
// composed as ring attention. Last in the file: a kernel that faults leaves the CUDA context
// unusable for whatever runs after it in this process.
TEST_CASE("the Hopper flash kernels on blocks match CpuOps", "[gpu][attention][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kWgmma, kWgmma);
  for (const Case& k : kCases)
    if (k.mode == DType::bf16 && (k.HS == 64 || k.HS == 128)) check_block_case(k);
}

TEST_CASE("the Hopper flash kernels composed as ring attention equal causal attention",
          "[gpu][attention][flash][sm90]") {
  if (!hopper_kernels_here()) return;
  const KernelPaths paths(kWgmma, kWgmma);
  check_ring_composition();
}
