// The one-pass norm backward (cuda/norm_backward.cu) against CpuOps at the shapes that take each
// of its paths, for LayerNorm and RMSNorm: training-sized row counts (many rows per block and
// per warp, a last block that is short), rows whose 16-byte chunks leave lanes idle in the last
// round (C = 1600, GPT-2 1.5B), rows so wide that a block runs fewer than 4 warps (C = 8192),
// every subset of the outputs (dinp alone, weight gradients alone), bf16 weight gradients,
// bitwise repetition, and the refusal of a row too wide for the accumulators. gpu_ops.cpp and
// gpu_llama_ops.cpp check the small and misaligned shapes.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

// Rows with their own offset and spread, like the residual stream.
std::vector<float> residual_rows(int N, int C, uint32_t seed) {
  std::vector<float> x = random_normal(size_t(N) * C, 1.0f, seed);
  const std::vector<float> shift = random_normal(N, 2.0f, seed + 1);
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < C; ++k) x[size_t(r) * C + k] = x[size_t(r) * C + k] * (0.5f + 0.01f * (r % 50)) + shift[r];
  return x;
}

struct Which {
  bool dinp, dw, db;
};

// One backward of LayerNorm (or RMSNorm) on the GPU in `mode` with `grad` gradients, against
// CpuOps from the same rounded inputs, accumulating into nonzero starting gradients; then the
// same call again from the same start must give the same bits.
void check_norm_backward(bool layernorm, DType mode, DType grad, int N, int C, Which want, uint32_t seed) {
  INFO((layernorm ? "layernorm" : "rmsnorm") << " N " << N << " C " << C << " mode " << mode_name(mode) << " grad "
                                             << mode_name(grad) << " dinp/dw/db " << want.dinp << want.dw
                                             << want.db);
  Ops& ops = gpu(mode);
  Tensors g(ops), c(cpu());
  const size_t NC = size_t(N) * C;
  const std::vector<float> x = rounded(mode, residual_rows(N, C, seed));
  const std::vector<float> w = rounded(mode, random_normal(C, 1.0f, seed + 2));
  const std::vector<float> b = rounded(mode, random_normal(C, 0.5f, seed + 3));
  const std::vector<float> dout = rounded(mode, random_normal(NC, 1.0f, seed + 4));
  Tensor cx = c.make(x, DType::f32), cw = c.make(w, DType::f32), cdout = c.make(dout, DType::f32);
  Tensor cmean = c.zeros(N, DType::f32), crstd = c.zeros(N, DType::f32);
  if (layernorm) cpu().layernorm_forward(c.zeros(NC, DType::f32), cmean, crstd, cx, cw, c.make(b, DType::f32), N, C);
  else cpu().rmsnorm_forward(c.zeros(NC, DType::f32), crstd, cx, cw, N, C, 1e-5f);

  // Nonzero starting gradients, so "+=" is checked; the reference accumulates into the same.
  const std::vector<float> dx0 = rounded(mode, random_normal(NC, 0.5f, seed + 5));
  const std::vector<float> dw0 = rounded(grad, random_normal(C, 3.0f, seed + 6));
  const std::vector<float> db0 = rounded(grad, random_normal(C, 3.0f, seed + 7));
  Tensor cdx = want.dinp ? c.make(dx0, DType::f32) : Tensor{};
  Tensor cdw = want.dw ? c.make(dw0, DType::f32) : Tensor{};
  Tensor cdb = want.db ? c.make(db0, DType::f32) : Tensor{};
  if (layernorm) cpu().layernorm_backward(cdx, cdw, cdb, cdout, cx, cw, cmean, crstd, N, C);
  else cpu().rmsnorm_backward(cdx, cdw, cdout, cx, cw, crstd, N, C);

  Tensor gx = g.make(x, mode), gw = g.make(w, mode), gdout = g.make(dout, mode);
  Tensor gmean = g.make(c.read(cmean), DType::f32), grstd = g.make(c.read(crstd), DType::f32);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor gdx = want.dinp ? g.make(dx0, mode) : Tensor{};
    Tensor gdw = want.dw ? g.make(dw0, grad) : Tensor{};
    Tensor gdb = want.db ? g.make(db0, grad) : Tensor{};
    if (layernorm) ops.layernorm_backward(gdx, gdw, gdb, gdout, gx, gw, gmean, grstd, N, C);
    else ops.rmsnorm_backward(gdx, gdw, gdout, gx, gw, grstd, N, C);
    std::vector<std::vector<float>> got;
    if (want.dinp) got.push_back(g.read(gdx));
    if (want.dw) got.push_back(g.read(gdw));
    if (want.db) got.push_back(g.read(gdb));
    if (run == 0) {
      size_t k = 0;
      if (want.dinp) expect_close("dinp", got[k++], c.read(cdx), tolerance(mode, mode));
      if (want.dw) expect_close("dw", got[k++], c.read(cdw), tolerance(mode, grad));
      if (want.db) expect_close("db", got[k++], c.read(cdb), tolerance(mode, grad));
      first = got;
    } else {
      for (size_t k = 0; k < got.size(); ++k) CHECK(bitwise_equal(got[k], first[k]));
    }
  }
}

}  // namespace

TEST_CASE("norm backward at training row counts matches CpuOps and repeats bitwise", "[gpu][norm]") {
  // 8203 rows: 8 rows a block (NormSplit), 1026 blocks, the last one 3 rows.
  for (bool layernorm : {true, false}) {
    for (DType mode : {DType::f32, DType::bf16}) {
      check_norm_backward(layernorm, mode, DType::f32, 8203, 768, {true, true, layernorm}, 31);
      check_norm_backward(layernorm, mode, DType::f32, 8203, 1600, {true, true, layernorm}, 32);
    }
    check_norm_backward(layernorm, DType::bf16, DType::bf16, 8203, 768, {true, true, layernorm}, 34);
  }
}

// Tagged [large]: the sanitizer step of scripts/gpu_check.sh leaves it out (SANITIZE_ARGS).
TEST_CASE("norm backward at GPT-2 124M's B 64 x T 1024 rows matches CpuOps", "[gpu][norm][large]") {
  // 65536 rows: 32 a block, every warp 8 rows; 2048 partials per channel to finalize.
  for (bool layernorm : {true, false})
    check_norm_backward(layernorm, DType::bf16, DType::f32, 65536, 768, {true, true, layernorm}, 33);
}

TEST_CASE("norm backward computes any subset of its outputs", "[gpu][norm]") {
  for (DType mode : {DType::f32, DType::bf16}) {
    check_norm_backward(true, mode, DType::f32, 300, 768, {true, false, false}, 41);
    check_norm_backward(true, mode, DType::f32, 300, 768, {false, true, false}, 42);
    check_norm_backward(true, mode, DType::f32, 300, 768, {false, false, true}, 43);
    check_norm_backward(true, mode, DType::f32, 300, 771, {false, true, true}, 44);  // the scalar path
    check_norm_backward(false, mode, DType::f32, 300, 768, {true, false, false}, 45);
    check_norm_backward(false, mode, DType::f32, 300, 771, {false, true, false}, 46);
  }
}

TEST_CASE("norm backward on wide rows runs fewer warps a block, and refuses rows too wide", "[gpu][norm]") {
  // C = 8192 bf16: RMSNorm's one accumulator is 32 KB a warp (3 warps in 96 KB), LayerNorm's two
  // are 64 KB (1 warp); C = 12288 is LayerNorm's widest (GPT-3's), one warp.
  for (DType mode : {DType::f32, DType::bf16}) {
    check_norm_backward(false, mode, DType::f32, 333, 8192, {true, true, false}, 51);
    check_norm_backward(true, mode, DType::f32, 333, 8192, {true, true, true}, 52);
  }
  check_norm_backward(true, DType::bf16, DType::f32, 70, 12288, {true, true, true}, 53);
  // Wider than one warp's accumulators fit: refused with a message, before anything is launched.
  Ops& ops = gpu(DType::bf16);
  Tensors g(ops);
  const int N = 4, C = 12544;
  const size_t NC = size_t(N) * C;
  Tensor x = g.zeros(NC, DType::bf16), dy = g.zeros(NC, DType::bf16), w = g.zeros(C, DType::bf16);
  Tensor stats = g.zeros(N, DType::f32), dw = g.zeros(C, DType::f32), db = g.zeros(C, DType::f32);
  CHECK_THROWS_WITH(ops.layernorm_backward(Tensor{}, dw, db, dy, x, w, stats, stats, N, C),
                    Catch::Contains("too many"));
  // Without weight gradients there are no accumulators: any width runs.
  Tensor dx = g.zeros(NC, DType::bf16);
  CHECK_NOTHROW(ops.layernorm_backward(dx, Tensor{}, Tensor{}, dy, x, w, stats, stats, N, C));
}
