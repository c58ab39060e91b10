// CudaOps mixture-of-experts ops (the router, permute, combine and their backwards) against
// CpuOps, in fp32 and bf16 mode, on random inputs: N = 301 tokens (a multiple of no block or warp
// size), E = 8 and E = 64 experts with k = 1 and 2 (and E = 160, k = 6: five experts per lane and
// more choices than two), row widths that take the 128-bit path (C = 768) next to the scalar path
// (C = 771), and slot_of a random permutation of the N k rows (the kernels take any permutation,
// not only the grouped-by-expert one the routing plan builds). Outputs a forward or an
// overwriting backward writes are poisoned (NaN) first, so an element a kernel forgets fails;
// moe_permute_backward runs from zero and from nonzero gradients ("+="). Top-k ties (equal
// logits within a lane, across lanes, and three-way) must go to the lower expert index.
//
// Tolerances (relative L2, gpu_test_support.h): 1e-5 in fp32. In bf16 mode: 1e-2 for the bf16
// outputs (dlogits, dx, y, dexpert_out: one rounding to bf16 is ~2^-9 relative), and 1e-4 for the
// fp32 ones (probs, topk_weight, dtopk_weight): their inputs are the same bf16-rounded values on
// both sides and the math is fp32, so only the summation order and fast-math expf differ. The
// chosen experts must match exactly, and moe_permute (a copy) bit for bit.
//
// The routing plan and the balancing loss's ops (moe_route: the same slots and offsets, exactly;
// the sums and the loss within 1e-6) on uniform and skewed ids, and the grouped products (the
// bf16 tensor-core kernels, and the per-group matmuls of fp32 and of widths that are not
// multiples of 8) against CpuOps: groups of every size from empty to most rows, widths on and off
// the kernel's tiles, rows past the last group left untouched (still poisoned), dW added to
// what was there in bf16 and f32, and the same bits each time.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

const DType kModes[] = {DType::f32, DType::bf16};
constexpr int kTokens = 301;

std::vector<int32_t> read_ints(Ops& ops, Tensor t) {
  std::vector<int32_t> host(t.numel);
  ops.download(host.data(), DType::i32, t, t.numel);
  return host;
}

// Logits on a grid of 1/256: two experts either tie exactly or differ by far more than the
// few-ulp gap between the CPU's expf and the GPU's, which could otherwise merge two nearly equal
// probabilities on one side only and change the top-k order.
std::vector<float> grid_logits(size_t n, uint32_t seed) {
  std::vector<float> v = random_normal(n, 2.0f, seed);
  for (float& x : v) x = std::round(x * 256.0f) / 256.0f;
  return v;
}

// A random permutation of [0, n): token n's j-th copy goes to row slot[n k + j].
std::vector<int32_t> random_slots(size_t n, uint32_t seed) {
  std::vector<int32_t> slot(n);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), std::mt19937(seed));
  return slot;
}

struct Routed {
  std::vector<float> probs, weight;
  std::vector<int32_t> expert;
};

// moe_router_forward on both backends from the same (mode-rounded) logits; checks the GPU
// against the CPU and returns the CPU's outputs.
Routed check_router_forward(DType mode, const std::vector<float>& logits, int N, int E, int k) {
  Ops& ops = gpu(mode);
  Tensors g(ops), c(cpu());
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  Tensor cp = c.zeros(NE, DType::f32), ce = c.zeros(NK, DType::i32), cw = c.zeros(NK, DType::f32);
  cpu().moe_router_forward(cp, ce, cw, c.make(logits, DType::f32), N, E, k);
  Tensor gp = g.zeros(NE, DType::f32), ge = g.zeros(NK, DType::i32), gw = g.zeros(NK, DType::f32);
  g.poison(gp);
  g.poison(ge);
  g.poison(gw);
  ops.moe_router_forward(gp, ge, gw, g.make(logits, mode), N, E, k);
  Routed ref{c.read(cp), c.read(cw), read_ints(cpu(), ce)};
  expect_close("probs", g.read(gp), ref.probs, tolerance(mode, DType::f32));
  CHECK(read_ints(ops, ge) == ref.expert);
  expect_close("topk_weight", g.read(gw), ref.weight, tolerance(mode, DType::f32));
  return ref;
}

}  // namespace

TEST_CASE("moe_router_forward and moe_router_backward match CpuOps", "[gpu][moe][router]") {
  struct Shape {
    int E, k;
  };
  const int N = kTokens;
  for (Shape s : {Shape{8, 1}, Shape{8, 2}, Shape{64, 1}, Shape{64, 2}, Shape{160, 6}}) {
    for (DType mode : kModes) {
      INFO("E " << s.E << ", k " << s.k << ", mode " << mode_name(mode));
      const size_t NE = size_t(N) * s.E, NK = size_t(N) * s.k;
      const std::vector<float> logits = rounded(mode, grid_logits(NE, 301 + s.E + s.k));
      const Routed ref = check_router_forward(mode, logits, N, s.E, s.k);

      // Backward from the reference routing, so only the backward is measured.
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      const std::vector<float> dw = random_normal(NK, 1.0f, 311);
      const std::vector<float> dall = random_normal(s.E, 0.1f, 312);
      Tensor cdl = c.zeros(NE, DType::f32);
      cpu().moe_router_backward(cdl, c.make(ref.probs, DType::f32), c.ints(ref.expert), c.make(ref.weight, DType::f32),
                                c.make(dw, DType::f32), c.make(dall, DType::f32), N, s.E, s.k);
      Tensor gdl = g.zeros(NE, mode);
      g.poison(gdl);  // overwritten
      ops.moe_router_backward(gdl, g.make(ref.probs, DType::f32), g.ints(ref.expert), g.make(ref.weight, DType::f32),
                              g.make(dw, DType::f32), g.make(dall, DType::f32), N, s.E, s.k);
      expect_close("dlogits", g.read(gdl), c.read(cdl), tolerance(mode, mode));
    }
  }
}

TEST_CASE("moe_router_forward breaks ties toward the lower expert, as CpuOps", "[gpu][moe][router]") {
  // Each row: all logits 0 (every expert tied), or -0.01 e (distinct, the lower expert the
  // larger) with a few raised to equal values; and the first three choices expected.
  struct Row {
    std::vector<std::pair<int, float>> raised;
    std::vector<int32_t> expected;
  };
  struct Case {
    int E;
    std::vector<Row> rows;
  };
  const Case cases[] = {
      {64,
       {{{}, {0, 1, 2}},
        {{{1, 4.0f}, {33, 4.0f}}, {1, 33, 0}},                // the same lane (1 and 33)
        {{{40, 4.0f}, {8, 4.0f}}, {8, 40, 0}},                // two lanes
        {{{63, 5.0f}, {62, 4.0f}, {2, 4.0f}}, {63, 2, 62}},   // the tie after the maximum
        {{{5, 4.0f}, {37, 4.0f}, {6, 4.0f}}, {5, 6, 37}}}},   // three-way
      {8,
       {{{}, {0, 1, 2}},
        {{{7, 2.0f}, {3, 2.0f}}, {3, 7, 0}},
        {{{6, 3.0f}, {4, 2.0f}, {1, 2.0f}}, {6, 1, 4}}}},
  };
  for (const Case& cs : cases) {
    const int N = static_cast<int>(cs.rows.size()), E = cs.E;
    std::vector<float> logits(size_t(N) * E);
    for (int n = 0; n < N; ++n) {
      for (int e = 0; e < E; ++e) logits[size_t(n) * E + e] = cs.rows[n].raised.empty() ? 0.0f : -0.01f * e;
      for (auto [e, v] : cs.rows[n].raised) logits[size_t(n) * E + e] = v;
    }
    for (int k = 1; k <= 3; ++k) {
      for (DType mode : kModes) {
        INFO("E " << E << ", k " << k << ", mode " << mode_name(mode));
        const Routed ref = check_router_forward(mode, rounded(mode, logits), N, E, k);
        for (int n = 0; n < N; ++n)
          for (int j = 0; j < k; ++j) CHECK(ref.expert[size_t(n) * k + j] == cs.rows[n].expected[j]);
      }
    }
  }
}

TEST_CASE("moe_permute, moe_combine and their backwards match CpuOps", "[gpu][moe][permute][combine]") {
  const int N = kTokens;
  for (int C : {771, 768}) {
    for (int k : {1, 2}) {
      for (DType mode : kModes) {
        INFO("C " << C << ", k " << k << ", mode " << mode_name(mode));
        Ops& ops = gpu(mode);
        Tensors g(ops), c(cpu());
        const size_t NC = size_t(N) * C, NK = size_t(N) * k;
        const std::vector<int32_t> slot = random_slots(NK, 401 + k);
        Tensor cs = c.ints(slot), gs = g.ints(slot);

        // permute: a copy, so bit for bit.
        const std::vector<float> x = rounded(mode, random_normal(NC, 1.0f, 402));
        Tensor cout = c.zeros(NK * C, DType::f32), gout = g.zeros(NK * C, mode);
        cpu().moe_permute(cout, c.make(x, DType::f32), cs, N, C, k);
        g.poison(gout);
        ops.moe_permute(gout, g.make(x, mode), gs, N, C, k);
        CHECK(bitwise_equal(g.read(gout), c.read(cout)));

        // permute backward, accumulating into dx.
        const std::vector<float> dout = rounded(mode, random_normal(NK * C, 1.0f, 403));
        Tensor cdout = c.make(dout, DType::f32), gdout = g.make(dout, mode);
        for (bool accumulate : {false, true}) {
          INFO("accumulate " << accumulate);
          const std::vector<float> dx0 =
              accumulate ? rounded(mode, random_normal(NC, 1.0f, 404)) : std::vector<float>(NC, 0.0f);
          Tensor cdx = c.make(dx0, DType::f32), gdx = g.make(dx0, mode);
          cpu().moe_permute_backward(cdx, cdout, cs, N, C, k);
          ops.moe_permute_backward(gdx, gdout, gs, N, C, k);
          expect_close("dx", g.read(gdx), c.read(cdx), tolerance(mode, mode));
        }

        // combine.
        const std::vector<float> eo = rounded(mode, random_normal(NK * C, 1.0f, 405));
        const std::vector<float> w = random_normal(NK, 0.5f, 406);
        Tensor ceo = c.make(eo, DType::f32), geo = g.make(eo, mode);
        Tensor cw = c.make(w, DType::f32), gw = g.make(w, DType::f32);
        Tensor cy = c.zeros(NC, DType::f32), gy = g.zeros(NC, mode);
        cpu().moe_combine(cy, ceo, cw, cs, N, C, k);
        g.poison(gy);
        ops.moe_combine(gy, geo, gw, gs, N, C, k);
        expect_close("y", g.read(gy), c.read(cy), tolerance(mode, mode));

        // combine backward: both outputs overwritten; then each alone (the other null) gives the
        // same bits.
        const std::vector<float> dy = rounded(mode, random_normal(NC, 1.0f, 407));
        Tensor cdy = c.make(dy, DType::f32), gdy = g.make(dy, mode);
        Tensor cde = c.zeros(NK * C, DType::f32), cdw = c.zeros(NK, DType::f32);
        cpu().moe_combine_backward(cde, cdw, cdy, ceo, cw, cs, N, C, k);
        Tensor gde = g.zeros(NK * C, mode), gdw = g.zeros(NK, DType::f32);
        g.poison(gde);
        g.poison(gdw);
        ops.moe_combine_backward(gde, gdw, gdy, geo, gw, gs, N, C, k);
        const std::vector<float> de1 = g.read(gde), dw1 = g.read(gdw);
        expect_close("dexpert_out", de1, c.read(cde), tolerance(mode, mode));
        expect_close("dtopk_weight", dw1, c.read(cdw), tolerance(mode, DType::f32));
        g.poison(gde);
        g.poison(gdw);
        ops.moe_combine_backward(gde, Tensor{}, gdy, Tensor{}, gw, gs, N, C, k);
        ops.moe_combine_backward(Tensor{}, gdw, gdy, geo, Tensor{}, gs, N, C, k);
        CHECK(bitwise_equal(g.read(gde), de1));
        CHECK(bitwise_equal(g.read(gdw), dw1));
      }
    }
  }
}

namespace {
// Expert ids for N k choices over E experts: uniform, or most of them on expert E / 2 (one large
// group next to small and empty ones).
std::vector<int32_t> routed_ids(size_t n, int E, bool skewed, uint32_t seed) {
  std::vector<int32_t> ids = random_ints(n, 0, E, seed);
  if (skewed)
    for (size_t i = 0; i < n; i++)
      if (i % 5 != 0) ids[i] = E / 2;
  return ids;
}
}  // namespace

TEST_CASE("moe_route and the balancing loss's ops match CpuOps", "[gpu][moe][route]") {
  Ops& ops = gpu(DType::bf16);  // these ops' tensors are i32 and f32 in every mode
  for (int E : {8, 64, 160}) {
    for (int k : {1, 2, 6}) {
      for (int N : {kTokens, 4099}) {
        for (bool skewed : {false, true}) {
          if (k > E) continue;
          INFO("E " << E << ", k " << k << ", N " << N << (skewed ? ", skewed" : ""));
          Tensors g(ops), c(cpu());
          const size_t NK = size_t(N) * k;
          const std::vector<int32_t> ids = routed_ids(NK, E, skewed, 501 + E + k);
          Tensor cslot = c.zeros(NK, DType::i32), coff = c.zeros(size_t(E) + 1, DType::i32);
          cpu().moe_route(cslot, coff, c.ints(ids), N, k, E);
          Tensor gslot = g.zeros(NK, DType::i32), goff = g.zeros(size_t(E) + 1, DType::i32);
          g.poison(gslot);
          g.poison(goff);
          ops.moe_route(gslot, goff, g.ints(ids), N, k, E);
          CHECK(read_ints(ops, gslot) == read_ints(cpu(), cslot));
          CHECK(read_ints(ops, goff) == read_ints(cpu(), coff));

          const std::vector<float> probs = random_normal(size_t(N) * E, 0.3f, 502);
          Tensor csum = c.zeros(2 * size_t(E) + 1, DType::f32), gsum = g.zeros(2 * size_t(E) + 1, DType::f32);
          cpu().moe_balance_sums(csum, c.make(probs, DType::f32), coff, N, E);
          g.poison(gsum);
          ops.moe_balance_sums(gsum, g.make(probs, DType::f32), goff, N, E);
          const std::vector<float> sums = c.read(csum);
          expect_close("sums", g.read(gsum), sums, 1e-6);
          // The loss from the same sums on both sides.
          const std::vector<float> stats0 = {0.5f, 1.5f};
          Tensor cd = c.zeros(size_t(E), DType::f32), cs = c.make(stats0, DType::f32);
          Tensor gd = g.zeros(size_t(E), DType::f32), gs = g.make(stats0, DType::f32);
          g.poison(gd);
          cpu().moe_balance_loss(cd, cs, csum, E, k, 0.01f);
          ops.moe_balance_loss(gd, gs, g.make(sums, DType::f32), E, k, 0.01f);
          expect_close("dprobs_all", g.read(gd), c.read(cd), 1e-6);
          expect_close("stats", g.read(gs), c.read(cs), 1e-6);
        }
      }
    }
  }
  SECTION("an id outside [0, E) gets slot -1 and no row") {
    Tensors g(ops);
    std::vector<int32_t> ids = routed_ids(40, 4, false, 503);
    ids[7] = 4;
    ids[21] = -3;
    Tensor slot = g.zeros(40, DType::i32), off = g.zeros(5, DType::i32);
    ops.moe_route(slot, off, g.ints(ids), 20, 2, 4);
    const std::vector<int32_t> s = read_ints(ops, slot), o = read_ints(ops, off);
    CHECK(s[7] == -1);
    CHECK(s[21] == -1);
    CHECK(o[4] == 38);
    std::vector<int32_t> valid;
    for (int32_t v : s)
      if (v >= 0) valid.push_back(v);
    std::sort(valid.begin(), valid.end());
    std::vector<int32_t> all(38);
    std::iota(all.begin(), all.end(), 0);
    CHECK(valid == all);  // the valid choices still fill rows 0..37 once each
  }
}

TEST_CASE("grouped matmuls match CpuOps: the tensor-core kernels (bf16) and the per-group path",
          "[gpu][moe][grouped]") {
  struct Case {
    int G, rows, IC, OC;
    bool skewed;
  };
  // Widths off the 128 x 128 x 32 tiles and on them; many groups; one large group among empty
  // ones; IC 36 / OC 20 not multiples of 8 (the per-group path in bf16 too); rows past the groups.
  const Case cases[] = {{8, 1000, 256, 384, false}, {3, 300, 72, 40, false}, {64, 4096, 128, 256, true},
                        {5, 257, 36, 20, false},    {16, 2048, 512, 128, true}};
  for (const Case& cs : cases) {
    for (DType mode : kModes) {
      INFO("G " << cs.G << ", rows " << cs.rows << ", IC " << cs.IC << ", OC " << cs.OC << ", mode "
                << mode_name(mode));
      Ops& ops = gpu(mode);
      Tensors g(ops), c(cpu());
      // The groups: sorted ids -> offsets; the last 7 rows in no group.
      const int used = cs.rows - 7;
      std::vector<int32_t> ids = routed_ids(size_t(used), cs.G, cs.skewed, 511 + cs.G);
      std::vector<int32_t> off(size_t(cs.G) + 1, 0);
      for (int32_t e : ids) off[size_t(e) + 1]++;
      for (int e = 0; e < cs.G; e++) off[size_t(e) + 1] += off[size_t(e)];
      const size_t R = size_t(cs.rows), I = size_t(cs.IC), O = size_t(cs.OC), W = size_t(cs.G) * O * I;
      const std::vector<float> x = rounded(mode, random_normal(R * I, 1.0f, 512));
      const std::vector<float> w = rounded(mode, random_normal(W, 0.05f, 513));
      const std::vector<float> dy = rounded(mode, random_normal(R * O, 1.0f, 514));
      Tensor coff = c.ints(off), goff = g.ints(off);

      Tensor cy = c.zeros(R * O, DType::f32), gy = g.zeros(R * O, mode);
      cpu().grouped_matmul_forward(cy, c.make(x, DType::f32), c.make(w, DType::f32), coff, cs.G, cs.rows, cs.IC,
                                   cs.OC);
      g.poison(gy);
      ops.grouped_matmul_forward(gy, g.make(x, mode), g.make(w, mode), goff, cs.G, cs.rows, cs.IC, cs.OC);
      const size_t used_o = size_t(used) * O, used_i = size_t(used) * I;
      const std::vector<float> y1 = g.read(gy);
      expect_close("out", g.read(gy.slice(0, used_o)), c.read(cy.slice(0, used_o)), tolerance(mode, mode));
      CHECK(count_nonfinite(y1) == R * O - used_o);  // rows past the groups: untouched (still poisoned)

      for (DType dw_type : {mode, DType::f32}) {
        INFO("dweight " << dtype_name(dw_type));
        const std::vector<float> dw0 = rounded(dw_type, random_normal(W, 0.1f, 515));
        Tensor cdx = c.zeros(R * I, DType::f32), cdw = c.make(dw0, DType::f32);
        cpu().grouped_matmul_backward(cdx, cdw, c.make(dy, DType::f32), c.make(x, DType::f32),
                                      c.make(w, DType::f32), coff, cs.G, cs.rows, cs.IC, cs.OC);
        Tensor gdx = g.zeros(R * I, mode), gdw = g.make(dw0, dw_type);
        g.poison(gdx);
        ops.grouped_matmul_backward(gdx, gdw, g.make(dy, mode), g.make(x, mode), g.make(w, mode), goff, cs.G,
                                    cs.rows, cs.IC, cs.OC);
        expect_close("dinp", g.read(gdx.slice(0, used_i)), c.read(cdx.slice(0, used_i)), tolerance(mode, mode));
        CHECK(count_nonfinite(g.read(gdx)) == R * I - used_i);
        expect_close("dweight", g.read(gdw), c.read(cdw), tolerance(mode, dw_type));
        // The same inputs give the same bits (no atomics), each output alone too.
        Tensor gdx2 = g.zeros(R * I, mode), gdw2 = g.make(dw0, dw_type);
        ops.grouped_matmul_backward(gdx2, Tensor{}, g.make(dy, mode), Tensor{}, g.make(w, mode), goff, cs.G,
                                    cs.rows, cs.IC, cs.OC);
        ops.grouped_matmul_backward(Tensor{}, gdw2, g.make(dy, mode), g.make(x, mode), Tensor{}, goff, cs.G,
                                    cs.rows, cs.IC, cs.OC);
        CHECK(bitwise_equal(g.read(gdx2.slice(0, used_i)), g.read(gdx.slice(0, used_i))));
        CHECK(bitwise_equal(g.read(gdw2), g.read(gdw)));
      }
    }
  }
}
