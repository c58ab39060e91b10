// The CudaOps ops that the parallel building blocks (core/parallel) add, against CpuOps:
// copy_2d (a strided block copy, any dtype) and the vocab-parallel cross-entropy halves
// (cross_entropy_shard.cu) over shards that straddle V or are all padding, with the finish step
// fed every shard's stats as the all-gather would. Outputs are poisoned (NaN) first, so an
// element a kernel forgets to write fails. Tolerances: gpu_test_support.h.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

TEST_CASE("copy_2d moves a strided block exactly", "[gpu][parallel]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Ops& ops = gpu(dtype);
    Tensors g(ops);
    const size_t rows = 7, cols = 5, src_ld = 12, dst_ld = 9;
    const std::vector<float> src = rounded(dtype, random_normal(rows * src_ld, 1.0f, 61));
    std::vector<float> want(rows * dst_ld, 0.0f);
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) want[r * dst_ld + c + 2] = src[r * src_ld + c + 3];
    Tensor gs = g.make(src, dtype), gd = g.zeros(rows * dst_ld, dtype);
    ops.copy_2d(gd.slice(2, gd.numel - 2), dst_ld, gs.slice(3, gs.numel - 3), src_ld, rows, cols);
    CHECK(g.read(gd) == want);
  }
}

TEST_CASE("cross_entropy_shard_stats/finish match CpuOps", "[gpu][parallel]") {
  const int N = 9, Vl = 300, shards = 3, Vp = Vl * shards;
  for (DType mode : {DType::f32, DType::bf16})
    for (int V : {Vp, Vp - 17, Vp - Vl - 5}) {  // no padding; straddling the last shard; last shard all padding
      INFO("mode " << mode_name(mode) << ", V " << V);
      Ops& ops = gpu(mode);
      const std::vector<float> logits = rounded(mode, random_normal(size_t(N) * Vp, 2.0f, 62 + V));
      const std::vector<int32_t> targets = {0, V - 1, -1, 17, Vl, Vl + 1, V / 2, V - Vl / 2, 3};
      const float dloss = 1.0f / N;
      // The shards' stats on both backends, each shard a [N, Vl] tensor.
      std::vector<std::vector<float>> shard(shards);
      for (int s = 0; s < shards; ++s) {
        shard[s].resize(size_t(N) * Vl);
        for (int n = 0; n < N; ++n)
          for (int i = 0; i < Vl; ++i) shard[s][size_t(n) * Vl + i] = logits[size_t(n) * Vp + s * Vl + i];
      }
      Tensors g(ops), c(cpu());
      std::vector<float> cstats, gstats;
      for (int s = 0; s < shards; ++s) {
        Tensor cs = c.zeros(size_t(N) * 3, DType::f32), gs = g.zeros(size_t(N) * 3, DType::f32);
        g.poison(gs);  // every stat must be written, the zeros of an out-of-shard target included
        cpu().cross_entropy_shard_stats(cs, c.make(shard[s], DType::f32), c.ints(targets), N, Vl, V, s * Vl);
        ops.cross_entropy_shard_stats(gs, g.make(shard[s], mode), g.ints(targets), N, Vl, V, s * Vl);
        const std::vector<float> a = c.read(cs), b = g.read(gs);
        // Compare the finite stats (an all-padding shard has max -inf on both).
        for (size_t i = 0; i < a.size(); ++i) {
          INFO("shard " << s << " stat " << i);
          if (std::isinf(a[i])) {
            CHECK(b[i] == a[i]);
          } else {
            CHECK(std::fabs(b[i] - a[i]) <= 1e-4 * (1.0 + std::fabs(a[i])));
          }
        }
        cstats.insert(cstats.end(), a.begin(), a.end());
        gstats.insert(gstats.end(), b.begin(), b.end());
      }
      for (int s = 0; s < shards; ++s) {
        Tensor cl = c.zeros(N, DType::f32), clog = c.make(shard[s], DType::f32);
        Tensor gl = g.zeros(N, DType::f32), glog = g.make(shard[s], mode);
        g.poison(gl);
        cpu().cross_entropy_shard_finish(cl, clog, c.ints(targets), c.make(cstats, DType::f32), shards, N, Vl, V,
                                         s * Vl, dloss);
        ops.cross_entropy_shard_finish(gl, glog, g.ints(targets), g.make(gstats, DType::f32), shards, N, Vl, V, s * Vl,
                                       dloss);
        expect_close("losses", g.read(gl), c.read(cl), tolerance(mode, DType::f32));
        expect_close("dlogits", g.read(glog), c.read(clog), tolerance(mode, mode));
      }
    }
}
