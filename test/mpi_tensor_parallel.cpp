// Tensor parallelism over real MPI (run under mpirun with 2 and 4 ranks, the tp group being the
// world, see test/CMakeLists.txt):
//  - a 2-layer MLP split column-parallel -> GELU -> row-parallel equals the unsplit MLP, forward
//    and every gradient (input gradient accumulated onto a nonzero start), with and without
//    sequence parallelism, in fp32 and with both products in FP8 (each rank's FP8 scales are
//    the whole tensor's, gathered over tp, so the codes are one rank's and only the sums'
//    order differs);
//  - vocab-parallel cross-entropy equals softmax_cross_entropy over the full logits (losses,
//    dlogits, eval mode), for a vocabulary with no padding, one whose padding straddles the last
//    shard, and one whose last shard is all padding;
//  - the LM head run in chunks of rows (TensorParallel::column_chunked with the vocab-parallel
//    cross-entropy in each chunk) equals the unsplit head, with and without sequence parallelism;
//    in FP8 it equals the same chunks on one rank.
// Tolerance: atol 1e-6 + rtol 1e-5 (sums over ranks reassociate float additions).
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "core/dist/local_comm.h"
#include "core/dist/process_groups.h"
#include "core/parallel/tensor_parallel.h"
#include "core/parallel/vocab_parallel_ce.h"
#include "cpu_test_support.h"
#include "mpi_test_support.h"
#include "relative_error.h"

using namespace pt;
using namespace pt::test;

namespace {

// A 2-layer MLP split over the world as tp, in fp32 or with both products in FP8
// (core/parallel/fp8_linear.h; tensorwise or rowwise scales). The reference is the same
// TensorParallel over a group of one.
void check_split_mlp(bool fp8, bool rowwise = false) {
  const World w = whole_world();
  CpuOps ops;
  const auto tp = make_group_comm(everyone(w.size), w, ops);
  LocalComm one(w.rank, ops);
  const int P = tp->size(), r = tp->rank();
  const int N = 4 * P, C = 6, H = 4 * C * P / 2, Hl = H / P;  // hidden divisible by tp

  std::vector<float> x = random_floats(size_t(N) * C, 11), W1 = random_floats(size_t(H) * C, 12),
                     b1 = random_floats(H, 13), W2 = random_floats(size_t(C) * H, 14), b2 = random_floats(C, 15),
                     dy = random_floats(size_t(N) * C, 16), dx0 = random_floats(size_t(N) * C, 17);
  // FP8: with power-of-two scales a part quantised with its own scale instead of the whole's
  // rounds exactly the same wherever both leave it in the format's normal range; only at the
  // range's edges does the scale's group matter. So the first rank's share of the hidden
  // features is 2^-16 of the rest (its rows of W1 and b1) and its columns of W2 2^16 times the
  // rest (the outputs still feel both): every tensor split over tp then has a part that the
  // whole's scale puts among e4m3's subnormals and its own scale would not, and a scale gathered
  // over the wrong group shows in the outputs. Gradients in e4m3 here: e5m2's range is too wide
  // for 2^16 to reach its subnormals.
  if (fp8) {
    constexpr float kTiny = 1.0f / 65536;
    for (size_t i = 0; i < size_t(Hl) * C; i++) W1[i] *= kTiny;
    for (int h = 0; h < Hl; h++) b1[h] *= kTiny;
    for (int c = 0; c < C; c++)
      for (int h = 0; h < Hl; h++) W2[size_t(c) * H + h] /= kTiny;
  }
  const Fp8Format grads = Fp8Format::e4m3;
  // The two layers' FP8 sites (dynamic scaling reads none; off without FP8).
  const Fp8Site up = fp8 ? Fp8Site{0} : Fp8Site{}, down = fp8 ? Fp8Site{1} : Fp8Site{};
  // FP8's tiny part is compared relatively (its values are far below the fp32 case's atol).
  const double atol = fp8 ? 0.0 : 1e-6;

  // The unsplit MLP, on every rank.
  Buffers ref(ops);
  TensorParallel whole(ops, one, false);
  if (fp8) whole.enable_fp8(nullptr, grads, rowwise);
  Tensor rx = ref.f32(x), rW1 = ref.f32(W1), rb1 = ref.f32(b1), rW2 = ref.f32(W2), rb2 = ref.f32(b2);
  Tensor rh = ref.zeros(size_t(N) * H), ra = ref.zeros(size_t(N) * H), ry = ref.zeros(size_t(N) * C);
  whole.column_forward(rh, rx, rW1, rb1, N, C, H, up);
  ops.gelu_forward(ra, rh, size_t(N) * H);
  whole.row_forward(ry, ra, rW2, rb2, N, H, C, down);
  Tensor rdy = ref.f32(dy), rda = ref.zeros(size_t(N) * H), rdh = ref.zeros(size_t(N) * H), rdx = ref.f32(dx0);
  Tensor rdW1 = ref.zeros(W1.size()), rdb1 = ref.zeros(H), rdW2 = ref.zeros(W2.size()), rdb2 = ref.zeros(C);
  whole.row_backward(rda, rdW2, rdb2, rdy, ra, rW2, N, H, C, down);
  ops.gelu_backward(rdh, rh, rda, size_t(N) * H);
  whole.column_backward(rdx, rdW1, rdb1, rdh, rx, rW1, N, C, H, up);
  const std::vector<float> y_ref = ref.read(ry), dx_ref = ref.read(rdx), dW1_ref = ref.read(rdW1),
                           db1_ref = ref.read(rdb1), dW2_ref = ref.read(rdW2), db2_ref = ref.read(rdb2);
  if (fp8) {  // FP8 really ran: the fp32 MLP's output is elsewhere
    Tensor h = ref.zeros(size_t(N) * H), a = ref.zeros(size_t(N) * H), y = ref.zeros(size_t(N) * C);
    ops.matmul_forward(h, rx, rW1, rb1, N, C, H);
    ops.gelu_forward(a, h, size_t(N) * H);
    ops.matmul_forward(y, a, rW2, rb2, N, H, C);
    CHECK(relative_l2(ref.read(y), y_ref) > 1e-3);
  }

  for (bool sp : {false, true}) {
    INFO("sequence parallel " << sp);
    TensorParallel tpl(ops, *tp, sp);
    if (fp8) tpl.enable_fp8(nullptr, grads, rowwise);
    const int No = tpl.outer_rows(N), row0 = sp ? r * No : 0;
    Buffers bufs(ops);
    Tensor tx = bufs.f32(rows_of(x, C, row0, No));
    Tensor tW1 = bufs.f32(rows_of(W1, C, r * Hl, Hl)), tb1 = bufs.f32(rows_of(b1, 1, r * Hl, Hl));
    Tensor tW2 = bufs.f32(cols_of(W2, C, H, r * Hl, Hl)), tb2 = bufs.f32(b2);
    Tensor h = bufs.zeros(size_t(N) * Hl), a = bufs.zeros(size_t(N) * Hl), y = bufs.zeros(size_t(No) * C);
    tpl.column_forward(h, tx, tW1, tb1, N, C, Hl, up);
    ops.gelu_forward(a, h, size_t(N) * Hl);
    tpl.row_forward(y, a, tW2, tb2, N, Hl, C, down);
    require_close(bufs.read(y), rows_of(y_ref, C, row0, No), atol, 1e-5, "y");

    Tensor tdy = bufs.f32(rows_of(dy, C, row0, No)), da = bufs.zeros(size_t(N) * Hl), dh = bufs.zeros(size_t(N) * Hl);
    Tensor dx = bufs.f32(rows_of(dx0, C, row0, No));
    Tensor dW1 = bufs.zeros(size_t(Hl) * C), db1 = bufs.zeros(Hl), dW2 = bufs.zeros(size_t(C) * Hl),
           db2 = bufs.zeros(C);
    tpl.row_backward(da, dW2, db2, tdy, a, tW2, N, Hl, C, down);
    ops.gelu_backward(dh, h, da, size_t(N) * Hl);
    tpl.column_backward(dx, dW1, db1, dh, tx, tW1, N, C, Hl, up);
    require_close(bufs.read(dx), rows_of(dx_ref, C, row0, No), atol, 1e-5, "dx");
    require_close(bufs.read(dW1), rows_of(dW1_ref, C, r * Hl, Hl), atol, 1e-5, "dW1");
    require_close(bufs.read(db1), rows_of(db1_ref, 1, r * Hl, Hl), atol, 1e-5, "db1");
    require_close(bufs.read(dW2), cols_of(dW2_ref, C, H, r * Hl, Hl), atol, 1e-5, "dW2");
    require_close(bufs.read(db2), db2_ref, atol, 1e-5, "db2");
  }
}

}  // namespace

TEST_CASE("column -> row parallel MLP equals the unsplit MLP", "[mpi][tp]") { check_split_mlp(false); }

TEST_CASE("in FP8, column -> row parallel MLP equals the unsplit FP8 MLP", "[mpi][tp][fp8]") {
  SECTION("tensorwise") { check_split_mlp(true); }
  SECTION("rowwise") { check_split_mlp(true, true); }
}

TEST_CASE("vocab-parallel cross-entropy equals the full one", "[mpi][tp]") {
  const World w = whole_world();
  CpuOps ops;
  const auto tp = make_group_comm(everyone(w.size), w, ops);
  const int P = tp->size(), r = tp->rank();
  const int Vl = 8, Vp = Vl * P, N = 6;
  struct Case {
    const char* name;
    int V;
  };
  const Case cases[] = {
      {"no padding", Vp},
      {"padding straddles the last shard", Vp - 3},
      {"the last shard is all padding", Vp - Vl - 2},  // and the one before it straddles V
  };
  for (const Case& cs : cases) {
    INFO(cs.name << ", V " << cs.V << " of " << Vp);
    const int V = cs.V;
    const std::vector<float> logits = random_floats(size_t(N) * Vp, 21 + V, -4.0f, 4.0f);
    // Targets at both ends of the vocabulary, in different shards, and one row without a target.
    const std::vector<int32_t> targets = {0, V - 1, -1, V / 2, std::min(Vl, V - 1), V - 2};
    const float dloss = 1.0f / N;
    for (float scale : {dloss, 0.0f}) {
      INFO("dloss " << scale);
      Buffers full(ops);
      Tensor flog = full.f32(logits), fl = full.zeros(N), ftg = full.i32(targets);
      ops.softmax_cross_entropy(fl, flog, ftg, N, V, Vp, scale);
      const std::vector<float> want_loss = full.read(fl), want_dlogits = full.read(flog);

      Buffers bufs(ops);
      VocabParallelCrossEntropy ce(ops, *tp);
      Tensor shard = bufs.f32(cols_of(logits, N, Vp, r * Vl, Vl)), losses = bufs.zeros(N), tg = bufs.i32(targets);
      ce.forward_backward(losses, shard, tg, N, V, Vl, scale);
      require_close(bufs.read(losses), want_loss, 1e-6, 1e-5, "losses");
      require_close(bufs.read(shard), cols_of(want_dlogits, N, Vp, r * Vl, Vl), 1e-6, 1e-5,
                    scale != 0 ? "dlogits" : "logits left untouched in eval");
    }
  }
}

namespace {

// The LM head in row chunks over the world as tp (vocabulary rows split), the vocab-parallel
// cross-entropy in each chunk. fp32: against the unsplit, unchunked head. FP8: against the same
// chunks on a group of one (each chunk's scales cover the chunk's rows of the whole tensors,
// gathered over tp), with the first rank's vocabulary rows 2^-16 of the rest, as in
// check_split_mlp, so that a scale not gathered over tp shows.
void check_chunked_head(bool fp8, bool rowwise = false) {
  const World w = whole_world();
  CpuOps ops;
  const auto tp = make_group_comm(everyone(w.size), w, ops);
  LocalComm one(w.rank, ops);
  const int P = tp->size(), r = tp->rank();
  const int N = 4 * P, C = 6, Vl = 5, Vp = Vl * P, V = Vp - 2, chunk = 3;  // chunks of 3, 3, ..., a short last one
  const std::vector<float> x = random_floats(size_t(N) * C, 31), dx0 = random_floats(size_t(N) * C, 33);
  std::vector<float> W = random_floats(size_t(Vp) * C, 32);
  if (fp8)
    for (size_t i = 0; i < size_t(Vl) * C; i++) W[i] /= 65536;
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; n++) targets[n] = n == 2 ? -1 : (7 * n) % V;
  const float dloss = 1.0f / N;
  const Fp8Format grads = Fp8Format::e4m3;
  const Fp8Site site = fp8 ? Fp8Site{0} : Fp8Site{};
  const double atol = fp8 ? 0.0 : 1e-6;

  // The reference head on every rank: logits, cross-entropy (dlogits in place), backward.
  Buffers ref(ops);
  Tensor rx = ref.f32(x), rW = ref.f32(W), rlog = ref.zeros(size_t(N) * Vp), rl = ref.zeros(N), rtg = ref.i32(targets);
  Tensor rdx = ref.zeros(size_t(N) * C), rdW = ref.zeros(W.size());
  ops.matmul_forward(rlog, rx, rW, Tensor{}, N, C, Vp);
  ops.softmax_cross_entropy(rl, rlog, rtg, N, V, Vp, dloss);
  const std::vector<float> loss_fp32 = ref.read(rl);
  if (fp8) {
    TensorParallel whole(ops, one, false);
    whole.enable_fp8(nullptr, grads, rowwise);
    whole.column_chunked(rlog, rdx, rdW, rx, rW, N, C, Vp, chunk, site, [&](int r0, int n, Tensor logits) {
      ops.softmax_cross_entropy(rl.slice(size_t(r0), size_t(n)), logits, rtg.slice(size_t(r0), size_t(n)), n, V, Vp,
                                dloss);
    });
    CHECK(relative_l2(ref.read(rl), loss_fp32) > 1e-4);  // FP8 really ran
  } else {
    ops.matmul_backward(rdx, rdW, Tensor{}, rlog, rx, rW, N, C, Vp);
  }
  const std::vector<float> loss_ref = ref.read(rl), dx_ref = ref.read(rdx), dW_ref = ref.read(rdW);

  for (bool sp : {false, true}) {
    INFO("sequence parallel " << sp);
    TensorParallel tpl(ops, *tp, sp);
    if (fp8) tpl.enable_fp8(nullptr, grads, rowwise);
    VocabParallelCrossEntropy ce(ops, *tp);
    const int No = tpl.outer_rows(N), row0 = sp ? r * No : 0;
    Buffers bufs(ops);
    Tensor tx = bufs.f32(rows_of(x, C, row0, No)), tW = bufs.f32(rows_of(W, C, r * Vl, Vl));
    Tensor out = bufs.zeros(size_t(chunk) * Vl), losses = bufs.zeros(N), tg = bufs.i32(targets);
    Tensor dx = bufs.f32(rows_of(dx0, C, row0, No)), dW = bufs.zeros(size_t(Vl) * C);
    int visits = 0;
    tpl.column_chunked(out, dx, dW, tx, tW, N, C, Vl, chunk, site, [&](int r0, int n, Tensor logits) {
      CHECK(r0 == visits * chunk);
      CHECK(n == std::min(chunk, N - r0));
      ce.forward_backward(losses.slice(size_t(r0), size_t(n)), logits, tg.slice(size_t(r0), size_t(n)), n, V, Vl,
                          dloss);
      visits++;
    });
    CHECK(visits == (N + chunk - 1) / chunk);
    require_close(bufs.read(losses), loss_ref, 1e-6, 1e-5, "losses");
    // The input gradient is overwritten (dx0 is gone), summed over the group.
    require_close(bufs.read(dx), rows_of(dx_ref, C, row0, No), atol, 1e-5, "dx");
    require_close(bufs.read(dW), rows_of(dW_ref, C, r * Vl, Vl), atol, 1e-5, "dW");
  }
}

}  // namespace

TEST_CASE("the LM head in row chunks (column_chunked + vocab-parallel CE) equals the unsplit head", "[mpi][tp]") {
  check_chunked_head(false);
}

TEST_CASE("in FP8, the chunked LM head over tp equals the same chunks on one rank", "[mpi][tp][fp8]") {
  SECTION("tensorwise") { check_chunked_head(true); }
  SECTION("rowwise") { check_chunked_head(true, true); }
}
