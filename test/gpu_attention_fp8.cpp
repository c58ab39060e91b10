// CudaOps' FP8 attention (attention_fp8_cast.cu, flash_attention_fp8.cu; core/common/fp8_attention.h)
// against CpuOps' emulation of it (core/cpu/cpu_attention_fp8.cpp), causal, forward and backward:
//  - T in {1, 65, 1024} (one row; a ragged last key tile and query tile; 16 key tiles whose running
//    max moves) x HS {64, 128} x groups 1:1 and 4:1, on bf16-representable random inputs whose
//    (sequence, head)s have very different magnitudes (each q, k and v head scaled by its own 2^u,
//    u uniform: q and k in [-3, 2], so scores run from nearly uniform to nearly one-hot, v in
//    [-6, 6]), so a scale taken from the wrong head or sequence shows;
//  - every output poisoned first (a NaN left behind fails); each call run twice, bitwise equal;
//  - that the result really is quantised: it differs from the bf16 attention_forward on the same
//    qkv by far more than either's rounding;
//  - the backward (attention_backward on the dequantised q, k, v) against CpuOps'
//    attention_fp8_backward from the same out and lse, and chained after the GPU's own forward;
//  - the refusals: an unaligned qkv and a head size without a kernel.
// Tolerances, from what may differ between the two backends (CpuOps computes what the kernel does,
// in fp32): the order of the fp32 sums (q.k and P V) and the last bits of exp2 (ex2.approx on the
// GPU), which move p by ~2^-22 relative; only where that crosses an e4m3 rounding midpoint of
// 256 p (~1e-5 of the probabilities) does P's code differ, by one step (1/16-1/8 of p), changing
// the row's out by at most p / l / 8 of that key's v. Then out is rounded to bf16 (2^-9 relative).
//  - out, per (sequence, head): max |gpu - cpu| <= 2e-2 max |cpu| (a moved code of a large p in a
//    short row stays below it; a wrong scale, key tile or V permutation is O(1)), and mean |gpu -
//    cpu| <= 3e-3 mean |cpu| (bf16's rounding is ~1e-3 of it; P left unquantised or rounded
//    differently moves the mean by ~1e-2);
//  - lse: |gpu - cpu| <= 1e-4 max(1, |cpu|) (no quantised value enters it: fp32 sums and log2's last
//    bits only, relative once the scores are large);
//  - the backward's dqkv: relative L2 error 1e-2 (bf16 outputs: gpu_test_support.h), 2e-2 chained.
// Seen on an H200 (these bounds and inputs, the kernels in a stand-alone harness, 2026-11-28): out
// max 3.1e-3 of the head's max |out|, mean 1.4e-3 of its mean (bf16's rounding), lse 2.5e-7
// relative, the FP8 and bf16 attention 2.2e-2 to 1.5e-1 apart. Ada's native e4m3 mma is reported to
// add with ~13 mantissa bits inside an instruction (Hopper runs f16 products, summed in fp32): a
// failure of the lse bound on sm_89 alone would point there.
// Cost: CpuOps' forward and backward, O(T^2 HS) per head: ~2 s in all.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible; this
// binary exits 77 too when the GPU cannot run FP8 attention (compute capability below 8.9, or a
// build without code for it), after checking that the op refuses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

struct Case {
  int B, T, NH, NKV, HS;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int T : {1, 65, 1024})
    for (int HS : {64, 128})
      for (int NKV : {4, 1}) out.push_back({T <= 65 ? 2 : 1, T, 4, NKV, HS});
  return out;
}

// Ends the process with 77 (skipped) unless the bf16 CudaOps runs FP8 attention; first checks that
// it refuses the op then (1 if it does not).
void skip_unless_fp8_attention() {
  Ops& ops = gputest::gpu(DType::bf16);
  if (ops.supports_fp8_attention(64)) return;
  bool refused = false;
  try {
    Tensors g(ops);
    Tensor qkv = g.zeros(3 * 64, DType::bf16), out = g.zeros(64, DType::bf16), lse = g.zeros(1, DType::f32);
    ops.attention_fp8_forward(out, lse, qkv, 1, 1, 64, 1, 1);
  } catch (const RuntimeError& e) {
    refused = std::string(e.what()).find("FP8 attention") != std::string::npos;
    std::printf("attention_fp8_forward refuses, as it should: %s\n", e.what());
  }
  std::printf("no FP8 attention on %s: skipping gpu_attention_fp8\n", ops.device_description().c_str());
  std::fflush(stdout);
  std::exit(refused ? 77 : 1);
}

// qkv [B, T, (NH + 2 NKV) HS], bf16-representable, each (sequence, head) scaled by its own 2^u.
std::vector<float> make_qkv(const Case& k, uint32_t seed) {
  const int H = k.NH + 2 * k.NKV;
  const size_t W = size_t(H) * k.HS;
  std::vector<float> x = random_normal(size_t(k.B) * k.T * W, 1.0f, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> qk_exp(-3.0f, 2.0f), v_exp(-6.0f, 6.0f);
  for (int b = 0; b < k.B; b++)
    for (int head = 0; head < H; head++) {
      const float scale = std::exp2(head < k.NH + k.NKV ? qk_exp(rng) : v_exp(rng));
      for (int t = 0; t < k.T; t++)
        for (int c = 0; c < k.HS; c++) x[(size_t(b) * k.T + t) * W + size_t(head) * k.HS + c] *= scale;
    }
  return rounded(DType::bf16, x);
}

// out's elements of (sequence b, head h): [B, T, NH HS].
std::vector<float> head_slice(const std::vector<float>& out, const Case& k, int b, int h) {
  std::vector<float> s;
  s.reserve(size_t(k.T) * k.HS);
  const size_t C = size_t(k.NH) * k.HS;
  for (int t = 0; t < k.T; t++) {
    const auto row = out.begin() + (size_t(b) * k.T + t) * C + size_t(h) * k.HS;
    s.insert(s.end(), row, row + k.HS);
  }
  return s;
}

void expect_out_close(const std::vector<float>& got, const std::vector<float>& ref, const Case& k) {
  CHECK(count_nonfinite(got) == 0);
  for (int b = 0; b < k.B; b++)
    for (int h = 0; h < k.NH; h++) {
      const std::vector<float> g = head_slice(got, k, b, h), r = head_slice(ref, k, b, h);
      double max_err = 0, sum_err = 0, max_ref = 0, sum_ref = 0;
      for (size_t i = 0; i < r.size(); i++) {
        const double e = std::fabs(double(g[i]) - r[i]);
        max_err = std::max(max_err, e);
        sum_err += e;
        max_ref = std::max(max_ref, std::fabs(double(r[i])));
        sum_ref += std::fabs(double(r[i]));
      }
      INFO("out of sequence " << b << " head " << h << ": max |err| " << max_err << " (max |out| " << max_ref
                              << "), mean |err| " << sum_err / r.size() << " (mean |out| " << sum_ref / r.size()
                              << ")");
      CHECK(max_err <= 2e-2 * max_ref);
      CHECK(sum_err <= 3e-3 * sum_ref);
    }
}

void expect_lse_close(const std::vector<float>& got, const std::vector<float>& ref) {
  size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double bound = 1e-4 * std::max(1.0, std::fabs(double(ref[i])));
    const double err = std::fabs(double(got[i]) - ref[i]);
    if (!(err <= bound)) {  // NaN counts
      bad++;
      if (!(err / bound <= worst_excess)) worst_excess = err / bound, worst = i;
    }
  }
  INFO("lse: " << bad << " of " << ref.size() << " beyond 1e-4 max(1, |lse|); worst at " << worst << ": "
               << (bad ? got[worst] : 0.0f) << " against " << (bad ? ref[worst] : 0.0f));
  CHECK(bad == 0);
}

void check_case(const Case& k) {
  const int B = k.B, T = k.T, NH = k.NH, NKV = k.NKV, HS = k.HS, C = NH * HS;
  INFO("B " << B << " T " << T << " NH " << NH << " NKV " << NKV << " HS " << HS);
  Ops& ops = gputest::gpu(DType::bf16);
  Tensors g(ops), c(cpu());
  const size_t W = size_t(NH + 2 * NKV) * HS, BT = size_t(B) * T;
  const size_t nqkv = BT * W, nout = BT * C, nlse = size_t(B) * NH * T;
  const std::vector<float> qkv = make_qkv(k, 300 + T + HS + NKV);

  // Forward: CpuOps' emulation, then the GPU twice.
  Tensor cqkv = c.make(qkv, DType::f32), cout = c.zeros(nout, DType::f32), clse = c.zeros(nlse, DType::f32);
  cpu().attention_fp8_forward(cout, clse, cqkv, B, T, C, NH, NKV);
  const std::vector<float> ref_out = c.read(cout), ref_lse = c.read(clse);
  Tensor gqkv = g.make(qkv, DType::bf16), gout = g.zeros(nout, DType::bf16), glse = g.zeros(nlse, DType::f32);
  std::vector<float> out, lse;
  for (int run = 0; run < 2; run++) {
    g.poison(gout);
    g.poison(glse);
    ops.attention_fp8_forward(gout, glse, gqkv, B, T, C, NH, NKV);
    if (run == 0) {
      out = g.read(gout);
      lse = g.read(glse);
      expect_out_close(out, ref_out, k);
      expect_lse_close(lse, ref_lse);
    } else {
      INFO("forward run 2");
      CHECK(bitwise_equal(g.read(gout), out));
      CHECK(bitwise_equal(g.read(glse), lse));
    }
  }

  // It quantises: the bf16 attention of the same qkv differs by the codes' rounding (3 mantissa
  // bits: a few percent), far beyond both kernels' own error (~1e-3).
  {
    Tensor bout = g.zeros(nout, DType::bf16), blse = g.zeros(nlse, DType::f32);
    ops.attention_forward(bout, blse, gqkv, B, T, C, NH, NKV);
    const double diff = relative_l2(out, g.read(bout));
    INFO("relative L2 difference between the FP8 and the bf16 attention: " << diff);
    CHECK(diff > 5e-3);
  }

  // Backward from the reference's out (rounded to bf16, as the GPU stores it) and lse.
  const std::vector<float> out_r = rounded(DType::bf16, ref_out);
  const std::vector<float> dout = rounded(DType::bf16, random_normal(nout, 1.0f, 400 + T));
  Tensor cd = c.zeros(nqkv, DType::f32);
  cpu().attention_fp8_backward(cd, c.make(dout, DType::f32), cqkv, c.make(out_r, DType::f32), clse, B, T, C, NH, NKV);
  const std::vector<float> ref_d = c.read(cd);
  Tensor gdout = g.make(dout, DType::bf16), gout_r = g.make(out_r, DType::bf16), glse_r = g.make(ref_lse, DType::f32);
  Tensor gd = g.zeros(nqkv, DType::bf16);
  g.poison(gd);
  ops.attention_fp8_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
  const std::vector<float> d = g.read(gd);
  expect_close("dqkv", d, ref_d, tolerance(DType::bf16, DType::bf16));
  // Overwrites and repeats: again into the previous result.
  ops.attention_fp8_backward(gd, gdout, gqkv, gout_r, glse_r, B, T, C, NH, NKV);
  CHECK(bitwise_equal(g.read(gd), d));
  // Chained after the GPU's own forward (its out and lse approximate the reference's).
  g.poison(gd);
  ops.attention_fp8_backward(gd, gdout, gqkv, gout, glse, B, T, C, NH, NKV);
  expect_close("dqkv after the GPU forward", g.read(gd), ref_d, 2e-2);
}

}  // namespace

TEST_CASE("FP8 attention matches CpuOps' emulation: T 1, 65, 1024, HS 64 and 128, groups 1:1 and 4:1",
          "[gpu][attention][fp8]") {
  skip_unless_fp8_attention();
  for (const Case& k : cases()) check_case(k);
}

TEST_CASE("FP8 attention refuses an unaligned qkv and a head size without a kernel", "[gpu][attention][fp8]") {
  skip_unless_fp8_attention();
  Ops& ops = gputest::gpu(DType::bf16);
  CHECK_FALSE(ops.supports_fp8_attention(32));
  CHECK_FALSE(ops.supports_fp8_attention(96));
  Tensors g(ops);
  const int T = 4, NH = 2, HS = 64, C = NH * HS;
  Tensor qkv = g.zeros(size_t(T) * 3 * C + 1, DType::bf16), out = g.zeros(size_t(T) * C, DType::bf16);
  Tensor lse = g.zeros(size_t(NH) * T, DType::f32);
  CHECK_THROWS_WITH(ops.attention_fp8_forward(out, lse, qkv.slice(1, size_t(T) * 3 * C), 1, T, C, NH, NH),
                    Catch::Contains("16-byte aligned"));
  CHECK_THROWS_WITH(ops.attention_fp8_forward(out, lse, qkv, 1, T, C, 4, 4), Catch::Contains("head size 32"));
}
