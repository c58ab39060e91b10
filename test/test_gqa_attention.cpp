// Grouped-query attention in CpuOps (NH query heads sharing NKV key/value heads, query head h
// reading key/value head h / (NH / NKV), as Hugging Face's Llama), for the packed op
// (attention_forward/backward) and the block op (attention_block_forward/backward):
//  - against multi-head attention on K/V with each head repeated NH/NKV times, built explicitly
//    here: out, lse and dq bitwise equal (the same float operations), dk/dv equal to the group
//    sum of the repeated heads' gradients (up to the order of that sum);
//  - the backward against central finite differences of a naive double GQA reference;
//  - dqkv overwritten (NaN start), dk/dv accumulated; the packed op is the block op's special
//    case, bitwise; determinism across thread counts; bad head counts refused.
// NH = 4 with NKV in {1, 2, 4} (NKV = NH is the multi-head case itself).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

constexpr int kNH = 4;
constexpr int kKvHeads[] = {1, 2, 4};

// [B, T, heads * HS] tensors as host vectors, with the helpers that move heads around.
struct Heads {
  int B, T, HS;
  size_t at(int b, int t, int heads, int h) const { return (size_t(b) * T + t) * heads * HS + size_t(h) * HS; }
};

// [B, T, NKV * HS] -> [B, T, NH * HS]: head h is a copy of head h / (NH / NKV).
template <class F>
std::vector<F> repeat_heads(const std::vector<F>& x, Heads s, int NH, int NKV) {
  std::vector<F> y(size_t(s.B) * s.T * NH * s.HS);
  for (int b = 0; b < s.B; b++)
    for (int t = 0; t < s.T; t++)
      for (int h = 0; h < NH; h++)
        for (int c = 0; c < s.HS; c++) y[s.at(b, t, NH, h) + c] = x[s.at(b, t, NKV, h / (NH / NKV)) + c];
  return y;
}

// [B, T, NH * HS] -> [B, T, NKV * HS]: the sum over each group's heads (in double).
std::vector<double> sum_groups(const std::vector<float>& x, Heads s, int NH, int NKV) {
  std::vector<double> y(size_t(s.B) * s.T * NKV * s.HS, 0.0);
  for (int b = 0; b < s.B; b++)
    for (int t = 0; t < s.T; t++)
      for (int h = 0; h < NH; h++)
        for (int c = 0; c < s.HS; c++) y[s.at(b, t, NKV, h / (NH / NKV)) + c] += x[s.at(b, t, NH, h) + c];
  return y;
}

// The q | k | v parts of packed [B, T, (NH + 2 NKV) HS] rows, and back.
template <class F>
struct Qkv {
  std::vector<F> q, k, v;
};
template <class F>
Qkv<F> unpack(const std::vector<F>& x, Heads s, int NH, int NKV) {
  const size_t W = size_t(NH + 2 * NKV) * s.HS, C = size_t(NH) * s.HS, CK = size_t(NKV) * s.HS;
  Qkv<F> r;
  for (size_t row = 0; row < size_t(s.B) * s.T; row++) {
    r.q.insert(r.q.end(), x.begin() + row * W, x.begin() + row * W + C);
    r.k.insert(r.k.end(), x.begin() + row * W + C, x.begin() + row * W + C + CK);
    r.v.insert(r.v.end(), x.begin() + row * W + C + CK, x.begin() + (row + 1) * W);
  }
  return r;
}
template <class F>
std::vector<F> pack(const Qkv<F>& p, Heads s, int NH, int NKV) {
  const size_t C = size_t(NH) * s.HS, CK = size_t(NKV) * s.HS;
  std::vector<F> x;
  for (size_t row = 0; row < size_t(s.B) * s.T; row++) {
    x.insert(x.end(), p.q.begin() + row * C, p.q.begin() + (row + 1) * C);
    x.insert(x.end(), p.k.begin() + row * CK, p.k.begin() + (row + 1) * CK);
    x.insert(x.end(), p.v.begin() + row * CK, p.v.begin() + (row + 1) * CK);
  }
  return x;
}

struct BlockShape {
  int B, Tq, Tk, HS, q_pos0, k_pos0;
  bool causal;
  int C() const { return kNH * HS; }
  size_t nq() const { return size_t(B) * Tq * C(); }
  size_t nk(int heads) const { return size_t(B) * Tk * heads * HS; }
  size_t nlse() const { return size_t(B) * kNH * Tq; }
};

// Past keys, keys straddling the queries (the first rows see none), the diagonal at an offset,
// non-causal, decoding against a cache.
const BlockShape kBlocks[] = {
    {2, 7, 9, 3, 5, 0, true},     // rows 0..3 see a prefix, the rest every key
    {1, 9, 6, 2, 0, 4, true},     // queries 0..3 see no key
    {2, 5, 5, 3, 3, 3, true},     // the diagonal block at an offset
    {2, 6, 8, 2, 0, 100, false},  // non-causal: positions ignored
    {1, 1, 13, 4, 5, 0, true},    // decoding: one query in the middle of a 13-token cache
};

// The textbook definition of grouped-query attention (mask spelled out, double), nothing shared
// with the code under test: q [B, Tq, NH*HS], k, v [B, Tk, NKV*HS] -> out [B, Tq, NH*HS].
std::vector<double> gqa_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            const BlockShape& s, int NKV) {
  const Heads qs{s.B, s.Tq, s.HS}, ks{s.B, s.Tk, s.HS};
  const double scale = 1.0 / std::sqrt(double(s.HS));
  std::vector<double> out(s.nq(), 0.0);
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < kNH; h++) {
      const int g = h / (kNH / NKV);
      for (int i = 0; i < s.Tq; i++) {
        std::vector<double> w(s.Tk, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < s.Tk; j++) {
          if (s.causal && s.k_pos0 + j > s.q_pos0 + i) continue;
          double d = 0;
          for (int c = 0; c < s.HS; c++) d += q[qs.at(b, i, kNH, h) + c] * k[ks.at(b, j, NKV, g) + c];
          w[j] = d * scale;
          mx = std::max(mx, w[j]);
        }
        double sum = 0;
        for (int j = 0; j < s.Tk; j++) sum += w[j] == -INFINITY ? 0.0 : std::exp(w[j] - mx);
        if (sum == 0) continue;
        for (int j = 0; j < s.Tk; j++) {
          if (w[j] == -INFINITY) continue;
          const double p = std::exp(w[j] - mx) / sum;
          for (int c = 0; c < s.HS; c++) out[qs.at(b, i, kNH, h) + c] += p * v[ks.at(b, j, NKV, g) + c];
        }
      }
    }
  return out;
}

}  // namespace

TEST_CASE("GQA attention_forward/backward equal multi-head attention on repeated K/V heads", "[cpu][attention][gqa]") {
  CpuOps ops;
  const int B = 2, T = 11, HS = 3, C = kNH * HS;
  const Heads s{B, T, HS};
  for (int NKV : kKvHeads) {
    INFO("NH " << kNH << " NKV " << NKV);
    Buffers bufs(ops);
    const size_t W = size_t(kNH + 2 * NKV) * HS;
    const std::vector<float> qkv = random_floats(size_t(B) * T * W, 500 + NKV, -1.5f, 1.5f);
    const std::vector<float> dout = random_floats(size_t(B) * T * C, 510 + NKV);
    const Qkv<float> parts = unpack(qkv, s, kNH, NKV);
    // Multi-head attention's packed input: every query head gets its own copy of its K/V head.
    const std::vector<float> mha_qkv =
        pack(Qkv<float>{parts.q, repeat_heads(parts.k, s, kNH, NKV), repeat_heads(parts.v, s, kNH, NKV)}, s, kNH, kNH);

    Tensor t_qkv = bufs.f32(qkv), t_mha = bufs.f32(mha_qkv), t_dout = bufs.f32(dout);
    Tensor out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(size_t(B) * kNH * T);
    Tensor mout = bufs.zeros(out.numel), mlse = bufs.zeros(lse.numel);
    ops.attention_forward(out, lse, t_qkv, B, T, C, kNH, NKV);
    ops.attention_forward(mout, mlse, t_mha, B, T, C, kNH, kNH);
    // Bitwise: each (b, h, t) row does the same float operations on the same values.
    CHECK(bitwise_equal(bufs.read(out), bufs.read(mout)));
    CHECK(bitwise_equal(bufs.read(lse), bufs.read(mlse)));

    Tensor dqkv = bufs.zeros(qkv.size()), mdqkv = bufs.zeros(mha_qkv.size());
    auto backward = [&] { ops.attention_backward(dqkv, t_dout, t_qkv, out, lse, B, T, C, kNH, NKV); };
    backward();
    ops.attention_backward(mdqkv, t_dout, t_mha, mout, mlse, B, T, C, kNH, kNH);
    const Qkv<float> got = unpack(bufs.read(dqkv), s, kNH, NKV), want = unpack(bufs.read(mdqkv), s, kNH, kNH);
    CHECK(bitwise_equal(got.q, want.q));  // dq: per query row, the same operations
    // dk, dv: the group's heads summed in another order than the test's double sum.
    require_close(got.k, sum_groups(want.k, s, kNH, NKV), 1e-6, 1e-5, "dk vs the group sum");
    require_close(got.v, sum_groups(want.v, s, kNH, NKV), 1e-6, 1e-5, "dv vs the group sum");

    // Overwritten: a NaN-filled dqkv comes out the same as a zeroed one, every element written.
    check_overwrites(ops, bufs, {dqkv}, backward);
  }
}

TEST_CASE("GQA attention_block_forward/backward equal multi-head attention on repeated K/V heads",
          "[cpu][attention][gqa]") {
  CpuOps ops;
  int seed = 600;
  for (const BlockShape& s : kBlocks)
    for (int NKV : kKvHeads) {
      INFO("B " << s.B << " Tq " << s.Tq << " Tk " << s.Tk << " HS " << s.HS << " q_pos0 " << s.q_pos0 << " k_pos0 "
                << s.k_pos0 << " causal " << s.causal << " NKV " << NKV);
      Buffers bufs(ops);
      const Heads ks{s.B, s.Tk, s.HS};
      const int C = s.C();
      const std::vector<float> q = random_floats(s.nq(), seed++, -1.5f, 1.5f);
      const std::vector<float> k = random_floats(s.nk(NKV), seed++, -1.5f, 1.5f);
      const std::vector<float> v = random_floats(s.nk(NKV), seed++, -1.5f, 1.5f);
      const std::vector<float> dout = random_floats(s.nq(), seed++);
      Tensor tq = bufs.f32(q), tk = bufs.f32(k), tv = bufs.f32(v), tdout = bufs.f32(dout);
      Tensor mk = bufs.f32(repeat_heads(k, ks, kNH, NKV)), mv = bufs.f32(repeat_heads(v, ks, kNH, NKV));
      Tensor out = bufs.f32(std::vector<float>(s.nq(), 7.0f)), lse = bufs.zeros(s.nlse());  // out poisoned
      Tensor mout = bufs.zeros(s.nq()), mlse = bufs.zeros(s.nlse());
      ops.attention_block_forward(out, lse, tq, tk, tv, s.B, s.Tq, s.Tk, C, kNH, NKV, s.q_pos0, s.k_pos0, s.causal);
      ops.attention_block_forward(mout, mlse, tq, mk, mv, s.B, s.Tq, s.Tk, C, kNH, kNH, s.q_pos0, s.k_pos0, s.causal);
      CHECK(bitwise_equal(bufs.read(out), bufs.read(mout)));
      CHECK(bitwise_equal(bufs.read(lse), bufs.read(mlse)));

      Tensor dq = bufs.zeros(s.nq()), dk = bufs.zeros(s.nk(NKV)), dv = bufs.zeros(s.nk(NKV));
      Tensor mdq = bufs.zeros(s.nq()), mdk = bufs.zeros(s.nk(kNH)), mdv = bufs.zeros(s.nk(kNH));
      auto backward = [&] {
        ops.attention_block_backward(dq, dk, dv, tdout, tq, tk, tv, out, lse, s.B, s.Tq, s.Tk, C, kNH, NKV, s.q_pos0,
                                     s.k_pos0, s.causal);
      };
      backward();
      ops.attention_block_backward(mdq, mdk, mdv, tdout, tq, mk, mv, mout, mlse, s.B, s.Tq, s.Tk, C, kNH, kNH, s.q_pos0,
                                   s.k_pos0, s.causal);
      CHECK(bitwise_equal(bufs.read(dq), bufs.read(mdq)));
      require_close(bufs.read(dk), sum_groups(bufs.read(mdk), ks, kNH, NKV), 1e-6, 1e-5, "dk vs the group sum");
      require_close(bufs.read(dv), sum_groups(bufs.read(mdv), ks, kNH, NKV), 1e-6, 1e-5, "dv vs the group sum");
      check_accumulates(ops, bufs, {dq, dk, dv}, backward);
    }
}

TEST_CASE("GQA backward against finite differences of a naive reference", "[cpu][attention][gqa]") {
  // Tolerance atol 1e-5, rtol 1e-4: float backward against exact double derivatives.
  CpuOps ops;
  int seed = 700;
  SECTION("packed qkv") {
    const int B = 2, T = 7, HS = 3, C = kNH * HS;
    const BlockShape s{B, T, T, HS, 0, 0, true};
    const Heads h{B, T, HS};
    for (int NKV : {1, 2}) {
      INFO("NKV " << NKV);
      Buffers bufs(ops);
      const std::vector<float> qkv = random_floats(size_t(B) * T * (kNH + 2 * NKV) * HS, seed++, -1.5f, 1.5f);
      const std::vector<float> R = random_floats(size_t(B) * T * C, seed++);
      Tensor t_qkv = bufs.f32(qkv), out = bufs.zeros(R.size()), lse = bufs.zeros(size_t(B) * kNH * T);
      ops.attention_forward(out, lse, t_qkv, B, T, C, kNH, NKV);
      auto ref = [&](const std::vector<double>& x) {
        const Qkv<double> p = unpack(x, h, kNH, NKV);
        return gqa_ref(p.q, p.k, p.v, s, NKV);
      };
      require_close(bufs.read(out), ref(to_double(qkv)), 1e-5, 1e-5, "out");
      Tensor dqkv = bufs.f32(std::vector<float>(qkv.size(), NAN));  // overwritten
      ops.attention_backward(dqkv, bufs.f32(R), t_qkv, out, lse, B, T, C, kNH, NKV);
      auto loss = [&](const std::vector<double>& x) { return dot(ref(x), R); };
      require_close(bufs.read(dqkv), numeric_grad(loss, to_double(qkv)), 1e-5, 1e-4, "dqkv");
    }
  }
  SECTION("block with offsets") {
    for (const BlockShape& s : {BlockShape{2, 6, 8, 3, 4, 0, true}, BlockShape{1, 5, 7, 2, 0, 3, false}}) {
      const int NKV = 2, C = s.C();
      INFO("Tq " << s.Tq << " Tk " << s.Tk << " causal " << s.causal);
      Buffers bufs(ops);
      const std::vector<float> q = random_floats(s.nq(), seed++, -1.5f, 1.5f);
      const std::vector<float> k = random_floats(s.nk(NKV), seed++, -1.5f, 1.5f);
      const std::vector<float> v = random_floats(s.nk(NKV), seed++, -1.5f, 1.5f);
      const std::vector<float> R = random_floats(s.nq(), seed++);
      const std::vector<double> qd = to_double(q), kd = to_double(k), vd = to_double(v);
      Tensor tq = bufs.f32(q), tk = bufs.f32(k), tv = bufs.f32(v);
      Tensor out = bufs.zeros(s.nq()), lse = bufs.zeros(s.nlse());
      ops.attention_block_forward(out, lse, tq, tk, tv, s.B, s.Tq, s.Tk, C, kNH, NKV, s.q_pos0, s.k_pos0, s.causal);
      require_close(bufs.read(out), gqa_ref(qd, kd, vd, s, NKV), 1e-5, 1e-5, "out");
      Tensor dq = bufs.zeros(s.nq()), dk = bufs.zeros(s.nk(NKV)), dv = bufs.zeros(s.nk(NKV));
      ops.attention_block_backward(dq, dk, dv, bufs.f32(R), tq, tk, tv, out, lse, s.B, s.Tq, s.Tk, C, kNH, NKV,
                                   s.q_pos0, s.k_pos0, s.causal);
      auto loss_q = [&](const std::vector<double>& x) { return dot(gqa_ref(x, kd, vd, s, NKV), R); };
      auto loss_k = [&](const std::vector<double>& x) { return dot(gqa_ref(qd, x, vd, s, NKV), R); };
      auto loss_v = [&](const std::vector<double>& x) { return dot(gqa_ref(qd, kd, x, s, NKV), R); };
      require_close(bufs.read(dq), numeric_grad(loss_q, qd), 1e-5, 1e-4, "dq");
      require_close(bufs.read(dk), numeric_grad(loss_k, kd), 1e-5, 1e-4, "dk");
      require_close(bufs.read(dv), numeric_grad(loss_v, vd), 1e-5, 1e-4, "dv");
    }
  }
}

TEST_CASE("GQA: the packed op is the block op on its parts, bitwise", "[cpu][attention][gqa]") {
  CpuOps ops;
  const int B = 2, T = 13, HS = 3, C = kNH * HS, NKV = 2;
  const Heads s{B, T, HS};
  Buffers bufs(ops);
  const std::vector<float> qkv = random_floats(size_t(B) * T * (kNH + 2 * NKV) * HS, 800, -2.0f, 2.0f);
  const std::vector<float> dout = random_floats(size_t(B) * T * C, 801);
  const Qkv<float> p = unpack(qkv, s, kNH, NKV);
  Tensor tqkv = bufs.f32(qkv), tq = bufs.f32(p.q), tk = bufs.f32(p.k), tv = bufs.f32(p.v), tdout = bufs.f32(dout);
  Tensor out1 = bufs.zeros(p.q.size()), lse1 = bufs.zeros(size_t(B) * kNH * T);
  Tensor out2 = bufs.zeros(p.q.size()), lse2 = bufs.zeros(size_t(B) * kNH * T);
  ops.attention_forward(out1, lse1, tqkv, B, T, C, kNH, NKV);
  ops.attention_block_forward(out2, lse2, tq, tk, tv, B, T, T, C, kNH, NKV, 0, 0, true);
  CHECK(bitwise_equal(bufs.read(out1), bufs.read(out2)));
  CHECK(bitwise_equal(bufs.read(lse1), bufs.read(lse2)));
  Tensor dqkv = bufs.zeros(qkv.size()), dq = bufs.zeros(p.q.size()), dk = bufs.zeros(p.k.size()),
         dv = bufs.zeros(p.v.size());
  ops.attention_backward(dqkv, tdout, tqkv, out1, lse1, B, T, C, kNH, NKV);
  ops.attention_block_backward(dq, dk, dv, tdout, tq, tk, tv, out2, lse2, B, T, T, C, kNH, NKV, 0, 0, true);
  CHECK(bitwise_equal(bufs.read(dqkv), pack(Qkv<float>{bufs.read(dq), bufs.read(dk), bufs.read(dv)}, s, kNH, NKV)));
}

TEST_CASE("GQA attention results do not depend on the thread count", "[cpu][determinism][gqa]") {
  // Bitwise: a (b, key/value head) pair owns its dk, dv and its group's dq.
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 3, T = 37, HS = 8, C = kNH * HS, NKV = 2;
  Tensor qkv = bufs.f32(random_floats(size_t(B) * T * (kNH + 2 * NKV) * HS, 900, -2.0f, 2.0f));
  Tensor dout = bufs.f32(random_floats(size_t(B) * T * C, 901));
  auto run = [&] {
    Tensor out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(size_t(B) * kNH * T), dqkv = bufs.zeros(qkv.numel);
    ops.attention_forward(out, lse, qkv, B, T, C, kNH, NKV);
    ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, kNH, NKV);
    return std::vector<std::vector<float>>{bufs.read(out), bufs.read(lse), bufs.read(dqkv)};
  };
  check_thread_count_independent(run);
}

TEST_CASE("GQA attention rejects key/value head counts that do not divide the query heads", "[cpu][attention][gqa]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 1, T = 2, C = 12;  // NH 4, HS 3
  Tensor qkv = bufs.zeros(size_t(B) * T * 3 * C), out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(4 * T);
  CHECK_THROWS_WITH(ops.attention_forward(out, lse, qkv, B, T, C, 4, 3),
                    Catch::Contains("n_kv_heads=3") && Catch::Contains("divide n_heads=4"));
  CHECK_THROWS_AS(ops.attention_forward(out, lse, qkv, B, T, C, 4, 0), RuntimeError);
  CHECK_THROWS_AS(ops.attention_backward(qkv, out, qkv, out, lse, B, T, C, 4, 8), RuntimeError);
  CHECK_THROWS_AS(ops.attention_block_forward(out, lse, out, qkv, qkv, B, T, T, C, 4, 3, 0, 0, true), RuntimeError);
  CHECK_THROWS_AS(
      ops.attention_block_backward(out, qkv, qkv, out, out, qkv, qkv, out, lse, B, T, T, C, 4, 3, 0, 0, true),
      RuntimeError);
  // k and v sized for NKV heads: one row short is refused.
  Tensor kv_short = bufs.zeros(size_t(B) * T * 2 * 3 - 1);
  CHECK_THROWS_AS(ops.attention_block_forward(out, lse, out, kv_short, kv_short, B, T, T, C, 4, 2, 0, 0, true),
                  RuntimeError);
}
