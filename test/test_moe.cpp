// Mixture of experts on the CPU backend: the routing plan, the MoE ops (router, permute, combine,
// the routing plan and balancing loss as ops, the grouped products) and the whole
// routed-experts layer (MoeLayer) against a double-precision reference written here from the
// definitions (Mixtral's routing and Switch Transformer's balancing loss), backward against
// central finite differences of that reference (L = sum(out * R) + aux_weight * aux), ties,
// the sequence-parallel split of the balancing statistics, thread-count independence, and that a
// sparse block's forward and backward make no host transfer (a counting CpuOps).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "core/metrics/flops.h"
#include "core/config/run_config.h"
#include "core/model/expert_split.h"
#include "core/model/moe_layer.h"
#include "core/model/param_table.h"
#include "core/ops/moe_routing.h"
#include "core/plan/stage_memory.h"
#include "cpu_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct Shape {
  int n, C, E, k, H;
};

struct MoeRef {
  std::vector<double> out;  // [n, C]
  double aux = 0;
};

// The routed experts of one sparse block, in double, from the definitions: softmax router,
// the k most probable experts (ties to the lower index), weights renormalised over them, each
// expert down(silu(gate x) * up x), the weighted sum; aux = E sum_i f_i P_i.
MoeRef moe_ref(const Shape& s, const std::vector<double>& x, const std::vector<double>& router,
               const std::vector<double>& up, const std::vector<double>& down) {
  const int n = s.n, C = s.C, E = s.E, k = s.k, H = s.H;
  MoeRef r{std::vector<double>(size_t(n) * C, 0.0), 0.0};
  std::vector<double> count(E, 0.0), psum(E, 0.0);
  for (int t = 0; t < n; t++) {
    std::vector<double> p(E);
    for (int e = 0; e < E; e++) {
      double z = 0;
      for (int c = 0; c < C; c++) z += x[size_t(t) * C + c] * router[size_t(e) * C + c];
      p[e] = z;
    }
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - mx));
    for (double& v : p) v /= sum;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int j = 0; j < k; j++) chosen += p[order[j]];
    for (int e = 0; e < E; e++) psum[e] += p[e];
    for (int j = 0; j < k; j++) {
      const int e = order[j];
      count[e] += 1;
      const double w = p[e] / chosen;
      std::vector<double> a(H);
      for (int h = 0; h < H; h++) {
        double g = 0, u = 0;
        for (int c = 0; c < C; c++) {
          g += up[(size_t(e) * 2 * H + h) * C + c] * x[size_t(t) * C + c];
          u += up[(size_t(e) * 2 * H + H + h) * C + c] * x[size_t(t) * C + c];
        }
        a[h] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int c = 0; c < C; c++) {
        double y = 0;
        for (int h = 0; h < H; h++) y += down[(size_t(e) * C + c) * H + h] * a[h];
        r.out[size_t(t) * C + c] += w * y;
      }
    }
  }
  for (int e = 0; e < E; e++) r.aux += E * (count[e] / n) * (psum[e] / n);
  return r;
}

}  // namespace

TEST_CASE("moe routing plan: rows grouped by expert, (token, choice) order within one", "[cpu][moe]") {
  // 3 tokens, k = 2, 4 experts: choices (2,0) (0,3) (2,1)
  const std::vector<int32_t> choice = {2, 0, 0, 3, 2, 1};
  const MoeRouting r = plan_moe_routing(choice.data(), 3, 2, 4);
  CHECK(r.counts == std::vector<int>{2, 1, 2, 1});
  CHECK(r.offsets == std::vector<int>{0, 2, 3, 5, 6});
  // expert 0: (0,1) then (1,0); expert 1: (2,1); expert 2: (0,0), (2,0); expert 3: (1,1)
  CHECK(r.slot_of == std::vector<int32_t>{3, 0, 1, 5, 4, 2});
  const std::vector<int32_t> bad = {4, 0};
  CHECK_THROWS_WITH(plan_moe_routing(bad.data(), 1, 2, 4), Catch::Contains("expert 4 of 4"));
}

TEST_CASE("moe router: top-k of the softmax with ties to the lower expert, renormalised weights", "[cpu][moe]") {
  CpuOps ops;
  Buffers bufs(ops);
  // Row 0: experts 1 and 3 tie for first; row 1: all equal (the first k win).
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  Tensor probs = bufs.zeros(8), ex = bufs.zeros(4, DType::i32), w = bufs.zeros(4);
  ops.moe_router_forward(probs, ex, w, bufs.f32(logits), 2, 4, 2);
  std::vector<int32_t> got(4);
  ops.download(got.data(), DType::i32, ex, 4);
  CHECK(got == std::vector<int32_t>{1, 3, 0, 1});
  const std::vector<float> wg = bufs.read(w);
  for (float v : wg) CHECK(v == Approx(0.5f));
  const std::vector<float> pg = bufs.read(probs);
  CHECK(pg[0] + pg[1] + pg[2] + pg[3] == Approx(1.0f));
}

namespace {
// The routed experts' part of an architecture: d_model C, E experts of width H, top-k.
Architecture experts_arch(int C, int E, int k, int H) {
  Architecture a;
  a.d_model = C;
  a.n_experts = E;
  a.top_k = k;
  a.expert_hidden = H;
  return a;
}
}  // namespace

TEST_CASE("moe layer: forward and aux match the reference, backward matches finite differences", "[cpu][moe]") {
  CpuOps ops;
  Buffers bufs(ops);
  const Architecture a = experts_arch(5, 4, 2, 3);
  const Shape s{7, a.d_model, a.n_experts, a.top_k, a.expert_hidden};
  const std::vector<float> x = random_floats(size_t(s.n) * s.C, 301, -1.0f, 1.0f);
  const std::vector<float> router = random_floats(size_t(s.E) * s.C, 302, -1.5f, 1.5f);
  const std::vector<float> up = random_floats(size_t(s.E) * 2 * s.H * s.C, 303, -1.0f, 1.0f);
  const std::vector<float> down = random_floats(size_t(s.E) * s.C * s.H, 304, -1.0f, 1.0f);
  const std::vector<float> R = random_floats(size_t(s.n) * s.C, 305);
  const float aux_weight = 0.37f;

  auto alloc = [&](size_t n, DType t) { return bufs.zeros(n, t); };
  MoeLayer moe(ops, a, s.n, 1, 1, {}, nullptr, alloc);
  Tensor tx = bufs.f32(x), out = bufs.zeros(x.size());
  MoeParams p{bufs.f32(router), bufs.f32(up), bufs.f32(down)};
  MoeParams g{bufs.zeros(router.size()), bufs.zeros(up.size()), bufs.zeros(down.size())};
  moe.forward(0, 0, out, tx, s.n, p, aux_weight, true);

  const MoeRef want = moe_ref(s, to_double(x), to_double(router), to_double(up), to_double(down));
  require_close(bufs.read(out), want.out, 1e-5, 1e-4, "out");
  const MoeStats st = moe.take_stats();
  CHECK(st.layer_batches == 1);
  CHECK(st.aux_sum == Approx(want.aux).epsilon(1e-5));
  CHECK(st.max_load_sum >= 1.0);
  CHECK(moe.take_stats().aux_sum == 0);  // taken: the sums start again

  Tensor dx = bufs.zeros(x.size());
  moe.backward(0, 0, dx, bufs.f32(R), tx, s.n, p, g);
  // The objective whose gradient backward computes.
  auto objective = [&](const std::vector<double>& xv, const std::vector<double>& rv, const std::vector<double>& uv,
                       const std::vector<double>& dv) {
    const MoeRef r = moe_ref(s, xv, rv, uv, dv);
    return dot(r.out, R) + aux_weight * r.aux;
  };
  const auto X = to_double(x), RT = to_double(router), U = to_double(up), D = to_double(down);
  require_close(bufs.read(dx), numeric_grad([&](const std::vector<double>& v) { return objective(v, RT, U, D); }, X),
                1e-4, 1e-3, "dx");
  require_close(bufs.read(g.router),
                numeric_grad([&](const std::vector<double>& v) { return objective(X, v, U, D); }, RT), 1e-4, 1e-3,
                "drouter");
  require_close(bufs.read(g.up), numeric_grad([&](const std::vector<double>& v) { return objective(X, RT, v, D); }, U),
                1e-4, 1e-3, "dup");
  require_close(bufs.read(g.down),
                numeric_grad([&](const std::vector<double>& v) { return objective(X, RT, U, v); }, D), 1e-4, 1e-3,
                "ddown");

  SECTION("parameter gradients accumulate, dx accumulates") {
    const std::vector<float> g1 = bufs.read(g.up), dx1 = bufs.read(dx);
    moe.backward(0, 0, dx, bufs.f32(R), tx, s.n, p, g);
    const std::vector<float> g2 = bufs.read(g.up), dx2 = bufs.read(dx);
    for (size_t i = 0; i < g1.size(); i++) CHECK(g2[i] == Approx(2 * g1[i]).margin(1e-6));
    for (size_t i = 0; i < dx1.size(); i++) CHECK(dx2[i] == Approx(2 * dx1[i]).margin(1e-6));
  }
  SECTION("results do not depend on the thread count") {
    check_thread_count_independent([&] {
      MoeLayer m(ops, a, s.n, 1, 1, {}, nullptr, alloc);
      Tensor o = bufs.zeros(x.size()), d = bufs.zeros(x.size());
      MoeParams gg{bufs.zeros(router.size()), bufs.zeros(up.size()), bufs.zeros(down.size())};
      m.forward(0, 0, o, tx, s.n, p, aux_weight, true);
      m.backward(0, 0, d, bufs.f32(R), tx, s.n, p, gg);
      return std::vector<std::vector<float>>{bufs.read(o), bufs.read(d), bufs.read(gg.router), bufs.read(gg.up),
                                             bufs.read(gg.down)};
    });
  }
}

TEST_CASE("moe ops: permute, combine and their backward are each other's transposes", "[cpu][moe]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int N = 3, C = 4, k = 2;
  const std::vector<int32_t> choice = {2, 0, 0, 3, 2, 1};
  const MoeRouting r = plan_moe_routing(choice.data(), N, k, 4);
  Tensor slot = bufs.i32(r.slot_of);
  const std::vector<float> x = random_floats(size_t(N) * C, 311);
  Tensor perm = bufs.zeros(size_t(N) * k * C);
  ops.moe_permute(perm, bufs.f32(x), slot, N, C, k);
  const std::vector<float> pg = bufs.read(perm);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++)
      for (int c = 0; c < C; c++) CHECK(pg[size_t(r.slot_of[size_t(n) * k + j]) * C + c] == x[size_t(n) * C + c]);

  // <permute(x), Y> = <x, permute_backward(Y)>; combine likewise with weights.
  const std::vector<float> Y = random_floats(size_t(N) * k * C, 312);
  Tensor dx = bufs.zeros(x.size());
  ops.moe_permute_backward(dx, bufs.f32(Y), slot, N, C, k);
  CHECK(dot(to_double(pg), Y) == Approx(dot(to_double(bufs.read(dx)), x)).epsilon(1e-5));

  const std::vector<float> w = random_floats(size_t(N) * k, 313, 0.1f, 1.0f);
  Tensor y = bufs.f32(random_floats(x.size(), 314));  // overwritten
  ops.moe_combine(y, bufs.f32(Y), bufs.f32(w), slot, N, C, k);
  const std::vector<float> dy = random_floats(x.size(), 315);
  Tensor dY = bufs.f32(random_floats(Y.size(), 316)), dw = bufs.f32(random_floats(w.size(), 317));  // overwritten
  ops.moe_combine_backward(dY, dw, bufs.f32(dy), bufs.f32(Y), bufs.f32(w), slot, N, C, k);
  CHECK(dot(to_double(bufs.read(y)), dy) == Approx(dot(to_double(bufs.read(dY)), Y)).epsilon(1e-5));
  // d/dw_j of <combine, dy> is <dy_n, Y_slot>, which is what dw holds.
  const std::vector<float> dwg = bufs.read(dw);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      double want = 0;
      for (int c = 0; c < C; c++) want += double(dy[size_t(n) * C + c]) * Y[size_t(r.slot_of[size_t(n) * k + j]) * C + c];
      CHECK(dwg[size_t(n) * k + j] == Approx(want).epsilon(1e-5));
    }
  // Either output alone (the other null, and what only it reads): the same bits.
  Tensor dY1 = bufs.zeros(Y.size()), dw1 = bufs.zeros(w.size());
  ops.moe_combine_backward(dY1, Tensor{}, bufs.f32(dy), Tensor{}, bufs.f32(w), slot, N, C, k);
  ops.moe_combine_backward(Tensor{}, dw1, bufs.f32(dy), bufs.f32(Y), Tensor{}, slot, N, C, k);
  CHECK(bufs.read(dY1) == bufs.read(dY));
  CHECK(bufs.read(dw1) == dwg);
}

TEST_CASE("moe_route, moe_balance_sums and moe_balance_loss: the plan and the loss's terms", "[cpu][moe]") {
  CpuOps ops;
  Buffers bufs(ops);
  const std::vector<int32_t> choice = {2, 0, 0, 3, 2, 1};  // 3 tokens, k = 2, 4 experts
  Tensor slot = bufs.zeros(6, DType::i32), offsets = bufs.zeros(5, DType::i32);
  ops.moe_route(slot, offsets, bufs.i32(choice), 3, 2, 4);
  std::vector<int32_t> got(6), off(5);
  ops.download(got.data(), DType::i32, slot, 6);
  ops.download(off.data(), DType::i32, offsets, 5);
  const MoeRouting want = plan_moe_routing(choice.data(), 3, 2, 4);
  CHECK(got == want.slot_of);
  CHECK(std::vector<int>(off.begin(), off.end()) == want.offsets);

  // probs of 3 tokens over 4 experts: the sums are the counts, the columns' sums and the tokens.
  const std::vector<float> probs = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.1f, 0.1f, 0.3f, 0.25f, 0.25f, 0.25f, 0.25f};
  Tensor sums = bufs.zeros(9);
  ops.moe_balance_sums(sums, bufs.f32(probs), offsets, 3, 4);
  const std::vector<float> sg = bufs.read(sums);
  const std::vector<float> col = {0.85f, 0.55f, 0.65f, 0.95f};
  for (int e = 0; e < 4; e++) {
    CHECK(sg[size_t(e)] == float(want.counts[size_t(e)]));
    CHECK(sg[size_t(4 + e)] == Approx(col[size_t(e)]).epsilon(1e-6));
  }
  CHECK(sg[8] == 3.0f);

  // aux = E sum f P with f = counts / 3, P = col / 3; dprobs = w E f / 3; load = max f E / k.
  Tensor dprobs = bufs.f32({9, 9, 9, 9}), stats = bufs.f32({1.0f, 2.0f});
  ops.moe_balance_loss(dprobs, stats, sums, 4, 2, 0.5f);
  double aux = 0;
  for (int e = 0; e < 4; e++) aux += 4 * (want.counts[size_t(e)] / 3.0) * (col[size_t(e)] / 3.0);
  const std::vector<float> st = bufs.read(stats), dp = bufs.read(dprobs);
  CHECK(st[0] == Approx(1.0 + aux).epsilon(1e-6));
  CHECK(st[1] == Approx(2.0 + (2 / 3.0) * 4 / 2).epsilon(1e-6));
  for (int e = 0; e < 4; e++) CHECK(dp[size_t(e)] == Approx(0.5 * 4 * (want.counts[size_t(e)] / 3.0) / 3.0));
  ops.moe_balance_loss(dprobs, Tensor{}, sums, 4, 2, 0.5f);  // no stats: only the gradient
  CHECK(bufs.read(stats) == st);
}

namespace {
// CpuOps that counts the host transfers: a GPU backend would wait for the device at each download.
class CountingOps : public CpuOps {
 public:
  void upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) override {
    uploads++;
    CpuOps::upload(dst, host_src, host_dtype, n);
  }
  void download(void* host_dst, DType host_dtype, Tensor src, size_t n) override {
    downloads++;
    CpuOps::download(host_dst, host_dtype, src, n);
  }
  int uploads = 0, downloads = 0;
};
}  // namespace

TEST_CASE("moe layer: a sparse block's forward and backward never copy to or from the host", "[cpu][moe]") {
  CountingOps ops;
  Buffers bufs(ops);
  const Architecture a = experts_arch(8, 4, 2, 8);
  const int n = 6;
  auto alloc = [&](size_t count, DType t) { return bufs.zeros(count, t); };
  MoeLayer moe(ops, a, n, 1, 1, {}, nullptr, alloc);
  const size_t C = size_t(a.d_model), E = size_t(a.n_experts), H = size_t(a.expert_hidden);
  MoeParams p{bufs.f32(random_floats(E * C, 331)), bufs.f32(random_floats(E * 2 * H * C, 332)),
              bufs.f32(random_floats(E * C * H, 333))};
  MoeParams g{bufs.zeros(E * C), bufs.zeros(E * 2 * H * C), bufs.zeros(E * C * H)};
  Tensor x = bufs.f32(random_floats(n * C, 334)), out = bufs.zeros(n * C), dx = bufs.zeros(n * C);
  Tensor dout = bufs.f32(random_floats(n * C, 335));
  ops.uploads = ops.downloads = 0;
  moe.forward(0, 0, out, x, n, p, 0.01f, true);
  moe.backward(0, 0, dx, dout, x, n, p, g);
  CHECK(ops.uploads == 0);
  CHECK(ops.downloads == 0);
  // The statistics come back when taken: one download for the step.
  const MoeStats st = moe.take_stats();
  CHECK(ops.downloads == 1);
  CHECK(st.layer_batches == 1);
  CHECK(st.aux_sum > 0);
}

TEST_CASE("grouped matmuls: each group is the matmul of its rows, rows past the groups untouched", "[cpu][moe]") {
  CpuOps ops;
  Buffers bufs(ops);
  const int G = 4, rows = 11, IC = 5, OC = 3;
  const std::vector<int32_t> off = {0, 3, 3, 7, 9};  // group 1 empty, rows 9 and 10 in no group
  const std::vector<float> x = random_floats(size_t(rows) * IC, 321), w = random_floats(size_t(G) * OC * IC, 322);
  const std::vector<float> dy = random_floats(size_t(rows) * OC, 323);
  Tensor offsets = bufs.i32(off);
  const std::vector<float> untouched(size_t(rows) * OC, 7.0f);
  Tensor out = bufs.f32(untouched), dx = bufs.f32(std::vector<float>(size_t(rows) * IC, 7.0f));
  const std::vector<float> dw0 = random_floats(w.size(), 324);
  Tensor dw = bufs.f32(dw0);
  ops.grouped_matmul_forward(out, bufs.f32(x), bufs.f32(w), offsets, G, rows, IC, OC);
  ops.grouped_matmul_backward(dx, dw, bufs.f32(dy), bufs.f32(x), bufs.f32(w), offsets, G, rows, IC, OC);
  const std::vector<float> o = bufs.read(out), dxg = bufs.read(dx), dwg = bufs.read(dw);
  for (int g = 0; g < G; g++) {
    for (int r = off[size_t(g)]; r < off[size_t(g) + 1]; r++) {
      for (int j = 0; j < OC; j++) {
        double want = 0;
        for (int i = 0; i < IC; i++) want += double(x[size_t(r) * IC + i]) * w[(size_t(g) * OC + j) * IC + i];
        CHECK(o[size_t(r) * OC + j] == Approx(want).epsilon(1e-5));
      }
      for (int i = 0; i < IC; i++) {
        double want = 0;
        for (int j = 0; j < OC; j++) want += double(dy[size_t(r) * OC + j]) * w[(size_t(g) * OC + j) * IC + i];
        CHECK(dxg[size_t(r) * IC + i] == Approx(want).epsilon(1e-5));
      }
    }
    for (int j = 0; j < OC; j++)
      for (int i = 0; i < IC; i++) {
        double want = dw0[(size_t(g) * OC + j) * IC + i];  // += : what was there, plus the group's rows
        for (int r = off[size_t(g)]; r < off[size_t(g) + 1]; r++)
          want += double(dy[size_t(r) * OC + j]) * x[size_t(r) * IC + i];
        CHECK(dwg[(size_t(g) * OC + j) * IC + i] == Approx(want).epsilon(1e-5));
      }
  }
  for (size_t i = size_t(9) * OC; i < o.size(); i++) CHECK(o[i] == 7.0f);
  for (size_t i = size_t(9) * IC; i < dxg.size(); i++) CHECK(dxg[i] == 7.0f);
  // Offsets that break the contract are refused.
  Tensor tx = bufs.f32(x), tw = bufs.f32(w);
  CHECK_THROWS_WITH(ops.grouped_matmul_forward(out, tx, tw, bufs.i32({0, 3, 2, 7, 9}), G, rows, IC, OC),
                    Catch::Contains("must not decrease"));
  CHECK_THROWS_WITH(ops.grouped_matmul_forward(out, tx, tw, bufs.i32({0, 3, 3, 7, 12}), G, rows, IC, OC),
                    Catch::Contains("at most 11 rows"));
}

namespace {
// A 4-block Llama (4 heads, 2 key/value heads) of the given widths, dense until a test adds experts.
ModelSection small_llama(int d_model, int vocab, int seq_len, int ffn_hidden) {
  ModelSection m;
  m.arch = "llama";
  m.n_layers = 4;
  m.d_model = d_model;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.vocab_size = vocab;
  m.padded_vocab = vocab;
  m.max_seq_len = seq_len;
  m.ffn_hidden = ffn_hidden;
  return m;
}
}  // namespace

TEST_CASE("moe FLOPs count the active experts: top_k of n_experts, the router in full", "[cpu][moe]") {
  // configs/tiny-moe.json against tiny-llama.json: 8 experts of width 192, top-2, have the
  // active MLP of one dense SwiGLU of width 384; the router adds 8 x d_model per block.
  const ModelSection dense = small_llama(128, 512, 64, 384);
  ModelSection sparse = dense;
  sparse.moe.n_experts = 8;
  sparse.moe.top_k = 2;
  sparse.moe.expert_hidden = 192;
  const ParamTable td = build_param_table(dense), ts = build_param_table(sparse);
  CHECK(ts.total_numel() - td.total_numel() == size_t(4) * (8 * 128 + (8 - 2) * 3 * 128 * 192));
  for (const char* formula : {"palm", "llmc"}) {
    INFO(formula);
    CHECK(flops_per_token(ts, sparse, 64, formula) - flops_per_token(td, dense, 64, formula) ==
          Approx(6.0 * 4 * 8 * 128));
  }
}

TEST_CASE("expert parallel storage: each ep rank holds its own experts, the split joins back", "[cpu][moe][ep]") {
  // Sparse every other block (1, 3) with a shared expert: 8 experts over ep 4, two per rank.
  ModelSection m = small_llama(32, 64, 16, 48);
  m.moe.n_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_hidden = 24;
  m.moe.every = 2;
  m.moe.n_shared_experts = 1;
  const ParamTable whole = build_param_table(m);
  size_t expert_numel = 0;
  for (const ParamSpec& p : whole.specs()) expert_numel += is_routed_expert(p) ? p.numel : 0;
  REQUIRE(expert_numel == size_t(2) * 8 * 3 * 24 * 32);  // 2 sparse blocks x 8 experts x (w1, w3, w2)

  std::vector<float> values(whole.total_numel());
  std::iota(values.begin(), values.end(), 0.0f);
  std::vector<std::vector<float>> experts;
  std::vector<float> dense;
  for (int r = 0; r < 4; r++) {
    const ExpertSplit s = split_expert_parallel(whole, 8, 4, r);
    INFO("ep rank " << r);
    CHECK(s.dense.total_numel() == whole.total_numel() - expert_numel);
    CHECK(s.experts.total_numel() == expert_numel / 4);
    for (const ParamSpec& p : s.dense.specs()) CHECK(!is_routed_expert(p));
    // Rank r holds experts 2r and 2r + 1 of blocks 1 and 3: w1, w3 of each, then w2 of each.
    std::vector<std::string> want;
    for (int layer : {1, 3}) {
      const std::string moe = "model.layers." + std::to_string(layer) + ".block_sparse_moe.experts.";
      for (int e = 2 * r; e < 2 * r + 2; e++) {
        want.push_back(moe + std::to_string(e) + ".w1.weight");
        want.push_back(moe + std::to_string(e) + ".w3.weight");
      }
      for (int e = 2 * r; e < 2 * r + 2; e++) want.push_back(moe + std::to_string(e) + ".w2.weight");
    }
    std::vector<std::string> got;
    for (const ParamSpec& p : s.experts.specs()) got.push_back(p.name);
    CHECK(got == want);
    // Each part's values, taken from the whole model by name.
    auto take = [&](const ParamTable& t) {
      std::vector<float> v;
      for (const ParamSpec& p : t.specs()) {
        const ParamSpec& w = whole.get(p.name);
        v.insert(v.end(), values.begin() + w.offset, values.begin() + w.offset + w.numel);
      }
      return v;
    };
    experts.push_back(take(s.experts));
    if (r == 0) dense = take(s.dense);
  }
  CHECK(join_expert_parallel(whole, 8, dense, experts) == values);
  // The one-rank split holds every expert; an uneven split is refused.
  CHECK(split_expert_parallel(whole, 8, 1, 0).experts.total_numel() == expert_numel);
  CHECK_THROWS(split_expert_parallel(whole, 8, 3, 0));
}

TEST_CASE("expert parallel memory: a rank's plan holds 1/ep of the experts' parameters and state", "[cpu][moe][ep]") {
  // configs/tiny-moe.json's model on dp 4: ep 1, 2 and 4 under ZeRO-0 and ZeRO-1.
  RunConfig cfg = load_config(std::string(PICOTRAIN_SOURCE_DIR) + "/configs/tiny-moe.json", {"parallel.dp=4", "batch.global_batch_tokens=2048"}, 4);
  const ParamTable whole = build_param_table(cfg.model);
  size_t expert_numel = 0;
  for (const ParamSpec& p : whole.specs()) expert_numel += is_routed_expert(p) ? p.numel : 0;
  for (int zero : {0, 1}) {
    std::vector<size_t> state;  // everything but activations, by ep
    for (int ep : {1, 2, 4}) {
      RunConfig c = cfg;
      c.parallel.dp = 4;
      c.parallel.ep = ep;
      c.parallel.zero_stage = zero;
      const MemoryPlan p = plan_stage_memory(c, whole, DType::f32).at(0).plan;
      state.push_back(p.total() - p.activations);
      INFO("ZeRO-" << zero << ", ep " << ep);
      // fp32, per element: ZeRO-0 params (the master) 4, grads 4, Adam 8. ZeRO-1 over the S = 4 / ep
      // ranks holding the same experts: params 4, grads 4 + 4/S, master 4/S, Adam 8/S: 16 again
      // with S = 2 (plus the shards' padding), ZeRO-0's line with S = 1.
      if (ep == 1) CHECK(p.experts == 0);
      if (ep > 1 && zero == 0) CHECK(p.experts == size_t(16) * expert_numel / ep);
      if (ep > 1 && zero == 1) CHECK(double(p.experts) == Approx(16.0 * expert_numel / ep).epsilon(1e-3));
    }
    INFO("ZeRO-" << zero);
    // ZeRO-0 (fp32): params (the master), grads and Adam's two moments, 16 bytes per element,
    // for the experts a rank no longer holds.
    if (zero == 0) {
      CHECK(state[0] - state[1] == size_t(16) * (expert_numel - expert_numel / 2));
      CHECK(state[0] - state[2] == size_t(16) * (expert_numel - expert_numel / 4));
    }
    CHECK(state[2] < state[1]);
    CHECK(state[1] < state[0]);
  }
}
