// CpuOps attention_block_forward/backward (queries against keys held apart, with position
// offsets) and merge_attention_partials: forward and lse against a naive double reference
// that masks a full Tq x Tk score matrix; backward against central finite differences of it;
// the packed op as the special case (bitwise); the LSE merge of key blocks against attention
// over all keys, forward and backward; rows that see no key; += semantics; determinism.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct BlockShape {
  int B, Tq, Tk, C, NH, q_pos0, k_pos0;
  bool causal;
  size_t nq() const { return size_t(B) * Tq * C; }
  size_t nk() const { return size_t(B) * Tk * C; }
  size_t nlse() const { return size_t(B) * NH * Tq; }
};

struct Ref {
  std::vector<double> out;  // [B, Tq, C]
  std::vector<double> lse;  // [B, NH, Tq]
};

// The textbook definition with the mask spelled out, nothing shared with the code under test.
Ref block_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
              const BlockShape& s) {
  const int HS = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(double(HS));
  Ref r{std::vector<double>(s.nq(), 0.0), std::vector<double>(s.nlse())};
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.NH; h++)
      for (int i = 0; i < s.Tq; i++) {
        std::vector<double> w(s.Tk, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j < s.Tk; j++) {
          if (s.causal && s.k_pos0 + j > s.q_pos0 + i) {
            w[j] = -INFINITY;
            continue;
          }
          double d = 0;
          for (int c = 0; c < HS; c++)
            d += q[(size_t(b) * s.Tq + i) * s.C + h * HS + c] * k[(size_t(b) * s.Tk + j) * s.C + h * HS + c];
          w[j] = d * scale;
          mx = std::max(mx, w[j]);
        }
        double sum = 0;
        for (int j = 0; j < s.Tk; j++) sum += w[j] == -INFINITY ? 0.0 : std::exp(w[j] - mx);
        r.lse[(size_t(b) * s.NH + h) * s.Tq + i] = sum == 0 ? -INFINITY : mx + std::log(sum);
        if (sum == 0) continue;
        for (int j = 0; j < s.Tk; j++) {
          if (w[j] == -INFINITY) continue;
          const double p = std::exp(w[j] - mx) / sum;
          for (int c = 0; c < HS; c++)
            r.out[(size_t(b) * s.Tq + i) * s.C + h * HS + c] += p * v[(size_t(b) * s.Tk + j) * s.C + h * HS + c];
        }
      }
  return r;
}

// Blocks covering what each attention op has to handle: a past block (every key visible), the
// diagonal, a future block (nothing visible), keys straddling the queries so the first rows see
// none, non-causal, decoding (Tq = 1, B = 1) against a cache, odd head sizes.
const BlockShape kShapes[] = {
    {2, 7, 9, 12, 3, 5, 0, true},     // queries at 5..11, keys at 0..8: rows 0..3 see a prefix, rest all
    {1, 9, 6, 10, 2, 0, 4, true},     // keys at 4..9: queries 0..3 see no key, later ones a prefix
    {2, 5, 5, 8, 2, 3, 3, true},      // the diagonal block at an offset
    {1, 4, 5, 6, 2, 10, 0, true},     // a past block: every key visible
    {2, 3, 4, 9, 3, 0, 7, true},      // a future block: no query sees any key
    {2, 6, 8, 12, 4, 0, 100, false},  // non-causal: positions ignored
    {1, 1, 13, 8, 2, 12, 0, true},    // decoding: one query at position 12 against a 13-token cache
    {1, 1, 13, 8, 2, 5, 0, true},     // ... a query in the middle of a longer cache (keys 6.. masked)
};

}  // namespace

TEST_CASE("attention_block: forward, lse and backward against a naive reference", "[cpu][attention]") {
  CpuOps ops;
  int seed = 100;
  for (const BlockShape& s : kShapes) {
    INFO("B " << s.B << " Tq " << s.Tq << " Tk " << s.Tk << " C " << s.C << " NH " << s.NH << " q_pos0 " << s.q_pos0
              << " k_pos0 " << s.k_pos0 << " causal " << s.causal);
    Buffers bufs(ops);
    const std::vector<float> q = random_floats(s.nq(), seed++, -1.5f, 1.5f);
    const std::vector<float> k = random_floats(s.nk(), seed++, -1.5f, 1.5f);
    const std::vector<float> v = random_floats(s.nk(), seed++, -1.5f, 1.5f);
    const std::vector<float> R = random_floats(s.nq(), seed++);
    const std::vector<double> qd = to_double(q), kd = to_double(k), vd = to_double(v);
    Tensor tq = bufs.f32(q), tk = bufs.f32(k), tv = bufs.f32(v), tR = bufs.f32(R);
    Tensor out = bufs.f32(std::vector<float>(s.nq(), 7.0f)), lse = bufs.zeros(s.nlse());  // out poisoned

    // Tolerance 1e-5 (abs and rel): float softmax over at most 13 keys of short dot products.
    ops.attention_block_forward(out, lse, tq, tk, tv, s.B, s.Tq, s.Tk, s.C, s.NH, s.NH, s.q_pos0, s.k_pos0, s.causal);
    const Ref ref = block_ref(qd, kd, vd, s);
    require_close(bufs.read(out), ref.out, 1e-5, 1e-5, "out");
    const std::vector<float> got_lse = bufs.read(lse);
    for (size_t i = 0; i < got_lse.size(); i++) {
      if (ref.lse[i] == -INFINITY) {
        CHECK(got_lse[i] == -INFINITY);
      } else {
        CHECK(std::fabs(got_lse[i] - ref.lse[i]) <= 1e-5 + 1e-5 * std::fabs(ref.lse[i]));
      }
    }

    // Tolerance atol 1e-5, rtol 1e-4: float backward against exact double derivatives.
    Tensor dq = bufs.zeros(s.nq()), dk = bufs.zeros(s.nk()), dv = bufs.zeros(s.nk());
    auto backward = [&] {
      ops.attention_block_backward(dq, dk, dv, tR, tq, tk, tv, out, lse, s.B, s.Tq, s.Tk, s.C, s.NH, s.NH, s.q_pos0,
                                   s.k_pos0, s.causal);
    };
    backward();
    auto loss_q = [&](const std::vector<double>& x) { return dot(block_ref(x, kd, vd, s).out, R); };
    auto loss_k = [&](const std::vector<double>& x) { return dot(block_ref(qd, x, vd, s).out, R); };
    auto loss_v = [&](const std::vector<double>& x) { return dot(block_ref(qd, kd, x, s).out, R); };
    require_close(bufs.read(dq), numeric_grad(loss_q, qd), 1e-5, 1e-4, "dq");
    require_close(bufs.read(dk), numeric_grad(loss_k, kd), 1e-5, 1e-4, "dk");
    require_close(bufs.read(dv), numeric_grad(loss_v, vd), 1e-5, 1e-4, "dv");
    check_accumulates(ops, bufs, {dq, dk, dv}, backward);

    // Any gradient may be left out; the others are unchanged.
    Tensor dk_only = bufs.zeros(s.nk());
    ops.attention_block_backward(Tensor{}, dk_only, Tensor{}, tR, tq, tk, tv, out, lse, s.B, s.Tq, s.Tk, s.C, s.NH,
                                 s.NH, s.q_pos0, s.k_pos0, s.causal);
    ops.zero(dk);
    ops.attention_block_backward(Tensor{}, dk, Tensor{}, tR, tq, tk, tv, out, lse, s.B, s.Tq, s.Tk, s.C, s.NH, s.NH,
                                 s.q_pos0, s.k_pos0, s.causal);
    CHECK(bitwise_equal(bufs.read(dk_only), bufs.read(dk)));
  }
}

TEST_CASE("attention_block with the packed op's arguments is the packed op, bitwise", "[cpu][attention]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 2, T = 13, C = 12, NH = 3;
  const std::vector<float> qkv = random_floats(size_t(B) * T * 3 * C, 200, -2.0f, 2.0f);
  const std::vector<float> dout = random_floats(size_t(B) * T * C, 201);
  std::vector<float> q(size_t(B) * T * C), k(q.size()), v(q.size());
  for (size_t r = 0; r < size_t(B) * T; r++)
    for (int c = 0; c < C; c++) {
      q[r * C + c] = qkv[r * 3 * C + c];
      k[r * C + c] = qkv[r * 3 * C + C + c];
      v[r * C + c] = qkv[r * 3 * C + 2 * C + c];
    }
  Tensor tqkv = bufs.f32(qkv), tq = bufs.f32(q), tk = bufs.f32(k), tv = bufs.f32(v), tdout = bufs.f32(dout);
  Tensor out1 = bufs.zeros(q.size()), lse1 = bufs.zeros(size_t(B) * NH * T);
  Tensor out2 = bufs.zeros(q.size()), lse2 = bufs.zeros(size_t(B) * NH * T);
  ops.attention_forward(out1, lse1, tqkv, B, T, C, NH, NH);
  ops.attention_block_forward(out2, lse2, tq, tk, tv, B, T, T, C, NH, NH, 0, 0, true);
  CHECK(bitwise_equal(bufs.read(out1), bufs.read(out2)));
  CHECK(bitwise_equal(bufs.read(lse1), bufs.read(lse2)));

  Tensor dqkv = bufs.zeros(qkv.size()), dq = bufs.zeros(q.size()), dk = bufs.zeros(q.size()), dv = bufs.zeros(q.size());
  ops.attention_backward(dqkv, tdout, tqkv, out1, lse1, B, T, C, NH, NH);
  ops.attention_block_backward(dq, dk, dv, tdout, tq, tk, tv, out2, lse2, B, T, T, C, NH, NH, 0, 0, true);
  const std::vector<float> packed = bufs.read(dqkv), gq = bufs.read(dq), gk = bufs.read(dk), gv = bufs.read(dv);
  std::vector<float> unpacked(packed.size());
  for (size_t r = 0; r < size_t(B) * T; r++)
    for (int c = 0; c < C; c++) {
      unpacked[r * 3 * C + c] = gq[r * C + c];
      unpacked[r * 3 * C + C + c] = gk[r * C + c];
      unpacked[r * 3 * C + 2 * C + c] = gv[r * C + c];
    }
  CHECK(bitwise_equal(packed, unpacked));
}

TEST_CASE("merge_attention_partials: blocks of keys merged equal attention over all keys", "[cpu][attention]") {
  // Queries at q_pos0.. against keys [0, Tk) at k_pos0.., split at every a in [0, Tk]: the merge
  // of the two halves' (out, lse) equals the whole, and the backward of each half from the
  // MERGED out and lse, summed, equals the whole's backward (dk, dv land in each half's rows).
  // Tolerance 1e-6 abs + 1e-5 rel: two float exps and a log per row.
  CpuOps ops;
  struct Case {
    int q_pos0;
    bool causal;
  };
  const int B = 2, Tq = 6, Tk = 10, C = 8, NH = 2;
  for (const Case cs : {Case{4, true}, Case{0, true}, Case{9, true}, Case{0, false}}) {
    Buffers bufs(ops);
    const std::vector<float> q = random_floats(size_t(B) * Tq * C, 300, -2.0f, 2.0f);
    const std::vector<float> k = random_floats(size_t(B) * Tk * C, 301, -2.0f, 2.0f);
    const std::vector<float> v = random_floats(size_t(B) * Tk * C, 302, -2.0f, 2.0f);
    const std::vector<float> dout = random_floats(size_t(B) * Tq * C, 303);
    Tensor tq = bufs.f32(q), tdout = bufs.f32(dout);
    const size_t nq = q.size(), nlse = size_t(B) * NH * Tq;
    Tensor out_all = bufs.zeros(nq), lse_all = bufs.zeros(nlse);
    Tensor tk = bufs.f32(k), tv = bufs.f32(v);
    ops.attention_block_forward(out_all, lse_all, tq, tk, tv, B, Tq, Tk, C, NH, NH, cs.q_pos0, 0, cs.causal);
    Tensor dq_all = bufs.zeros(nq), dk_all = bufs.zeros(k.size()), dv_all = bufs.zeros(k.size());
    ops.attention_block_backward(dq_all, dk_all, dv_all, tdout, tq, tk, tv, out_all, lse_all, B, Tq, Tk, C, NH, NH,
                                 cs.q_pos0, 0, cs.causal);
    for (int a = 0; a <= Tk; a++) {
      INFO("q_pos0 " << cs.q_pos0 << " causal " << cs.causal << " split at " << a);
      // The key halves as their own [B, Tk_x, C] tensors.
      auto part = [&](const std::vector<float>& x, int j0, int n) {
        std::vector<float> p(size_t(B) * n * C);
        for (int b = 0; b < B; b++)
          for (int j = 0; j < n; j++)
            for (int c = 0; c < C; c++) p[(size_t(b) * n + j) * C + c] = x[(size_t(b) * Tk + j0 + j) * C + c];
        return p;
      };
      const int n1 = a, n2 = Tk - a;
      Tensor k1 = bufs.f32(part(k, 0, n1)), v1 = bufs.f32(part(v, 0, n1));
      Tensor k2 = bufs.f32(part(k, a, n2)), v2 = bufs.f32(part(v, a, n2));
      Tensor out = bufs.zeros(nq), lse = bufs.zeros(nlse), out2 = bufs.zeros(nq), lse2 = bufs.zeros(nlse);
      // Second half first: the merge must not care which block came first.
      ops.attention_block_forward(out, lse, tq, k2, v2, B, Tq, n2, C, NH, NH, cs.q_pos0, a, cs.causal);
      ops.attention_block_forward(out2, lse2, tq, k1, v1, B, Tq, n1, C, NH, NH, cs.q_pos0, 0, cs.causal);
      ops.merge_attention_partials(out, lse, out2, lse2, B, Tq, C, NH);
      require_close(bufs.read(out), bufs.read(out_all), 1e-6, 1e-5, "merged out");
      const std::vector<float> got_lse = bufs.read(lse), want_lse = bufs.read(lse_all);
      for (size_t i = 0; i < nlse; i++) {
        if (want_lse[i] == -INFINITY)
          CHECK(got_lse[i] == -INFINITY);
        else
          CHECK(std::fabs(got_lse[i] - want_lse[i]) <= 1e-6 + 1e-5 * std::fabs(want_lse[i]));
      }

      Tensor dq = bufs.zeros(nq), dk1 = bufs.zeros(k1.numel), dv1 = bufs.zeros(k1.numel);
      Tensor dk2 = bufs.zeros(k2.numel), dv2 = bufs.zeros(k2.numel);
      ops.attention_block_backward(dq, dk1, dv1, tdout, tq, k1, v1, out, lse, B, Tq, n1, C, NH, NH, cs.q_pos0, 0,
                                   cs.causal);
      ops.attention_block_backward(dq, dk2, dv2, tdout, tq, k2, v2, out, lse, B, Tq, n2, C, NH, NH, cs.q_pos0, a,
                                   cs.causal);
      require_close(bufs.read(dq), bufs.read(dq_all), 1e-5, 1e-4, "dq summed over blocks");
      const std::vector<float> dka = bufs.read(dk_all), dva = bufs.read(dv_all);
      require_close(bufs.read(dk1), part(dka, 0, n1), 1e-5, 1e-4, "dk of the first block");
      require_close(bufs.read(dk2), part(dka, a, n2), 1e-5, 1e-4, "dk of the second block");
      require_close(bufs.read(dv1), part(dva, 0, n1), 1e-5, 1e-4, "dv of the first block");
      require_close(bufs.read(dv2), part(dva, a, n2), 1e-5, 1e-4, "dv of the second block");
    }
  }
}

TEST_CASE("merge_attention_partials: empty sides", "[cpu][attention]") {
  // A side with lse = -inf has weight 0 (the other side is copied exactly); two empty sides stay
  // out 0, lse -inf, with no NaN.
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 1, T = 3, C = 4, NH = 2;
  const float ninf = -INFINITY;
  Tensor out_acc = bufs.f32({0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0});
  Tensor lse_acc = bufs.f32({ninf, 0.5f, ninf, ninf, -1.0f, ninf});  // [NH, T]: h0 rows t0..2, h1 rows t0..2
  Tensor out_part = bufs.f32({5, 6, 7, 8, 9, 9, 9, 9, 0, 0, 0, 0});
  Tensor lse_part = bufs.f32({0.25f, ninf, ninf, 1.0f, ninf, ninf});
  ops.merge_attention_partials(out_acc, lse_acc, out_part, lse_part, B, T, C, NH);
  const std::vector<float> o = bufs.read(out_acc), l = bufs.read(lse_acc);
  CHECK(o == std::vector<float>{5, 6, 7, 8, 1, 2, 3, 4, 0, 0, 0, 0});
  CHECK(l[0] == 0.25f);  // h0 t0: only the part
  CHECK(l[1] == 0.5f);   // h0 t1: only the accumulator
  CHECK(l[2] == ninf);   // h0 t2: neither
  CHECK(l[3] == 1.0f);
  CHECK(l[4] == -1.0f);
  CHECK(l[5] == ninf);
}

TEST_CASE("attention_block results do not depend on the thread count", "[cpu][determinism]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int B = 2, Tq = 19, Tk = 23, C = 24, NH = 3;
  Tensor q = bufs.f32(random_floats(size_t(B) * Tq * C, 400, -2.0f, 2.0f));
  Tensor k = bufs.f32(random_floats(size_t(B) * Tk * C, 401, -2.0f, 2.0f));
  Tensor v = bufs.f32(random_floats(size_t(B) * Tk * C, 402, -2.0f, 2.0f));
  Tensor dout = bufs.f32(random_floats(size_t(B) * Tq * C, 403));
  auto run = [&] {
    Tensor out = bufs.zeros(q.numel), lse = bufs.zeros(size_t(B) * NH * Tq), out2 = bufs.zeros(q.numel),
           lse2 = bufs.zeros(size_t(B) * NH * Tq);
    Tensor dq = bufs.zeros(q.numel), dk = bufs.zeros(k.numel), dv = bufs.zeros(v.numel);
    ops.attention_block_forward(out, lse, q, k, v, B, Tq, Tk, C, NH, NH, 10, 3, true);
    ops.attention_block_forward(out2, lse2, q, k, v, B, Tq, Tk, C, NH, NH, 10, 30, true);
    ops.merge_attention_partials(out, lse, out2, lse2, B, Tq, C, NH);
    ops.attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, B, Tq, Tk, C, NH, NH, 10, 3, true);
    return std::vector<std::vector<float>>{bufs.read(out), bufs.read(lse), bufs.read(dq), bufs.read(dk), bufs.read(dv)};
  };
  check_thread_count_independent(run);
}

TEST_CASE("attention_block rejects bad arguments", "[cpu][attention]") {
  CpuOps ops;
  Buffers bufs(ops);
  Tensor q = bufs.zeros(2 * 8), kv = bufs.zeros(3 * 8), out = bufs.zeros(2 * 8), lse = bufs.zeros(2 * 2);
  CHECK_THROWS_AS(ops.attention_block_forward(out, lse, q, kv, kv, 1, 2, 3, 8, 3, 3, 0, 0, true),
                  RuntimeError);  // 3 ∤ 8
  CHECK_THROWS_AS(ops.attention_block_forward(out, lse, q, kv, kv, 1, 2, 4, 8, 2, 2, 0, 0, true),
                  RuntimeError);  // k short
  CHECK_THROWS_AS(ops.attention_block_forward(out, lse, q, kv, kv, 1, -1, 3, 8, 2, 2, 0, 0, true), RuntimeError);
}
