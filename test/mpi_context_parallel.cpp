// Context parallelism over real MPI (run under mpirun with 2, 3 and 4 ranks, the cp group being
// the world, see test/CMakeLists.txt; 3 makes an odd ring, where the send/recv order matters):
// ring attention on zigzag chunks and Ulysses on contiguous ones, forward (out, lse) and
// backward (dqkv, which it overwrites: the buffers start as NaN) against CpuOps attention over the unsplit
// sequence computed on every rank. A group of one (each rank alone) checks the cp = 1
// degenerate case. Grouped-query attention (NKV key/value heads < NH query heads) runs through
// both: the ring passes NKV-head K/V blocks, Ulysses splits the key/value heads over cp too (and
// refuses NKV % cp != 0). Tolerance: atol 1e-6 + rtol 1e-5 (the merge and the regrouped sums
// reassociate float additions).
#include <mpi.h>

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/process_groups.h"
#include "core/parallel/ring_attention.h"
#include "core/parallel/ulysses.h"
#include "core/parallel/zigzag.h"
#include "cpu_test_support.h"
#include "mpi_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

struct Unsplit {
  std::vector<float> qkv, dout, out, lse, dqkv;
};

// A gradient buffer's starting contents: NaN, so an element the backward leaves unwritten (or
// adds to) shows up in the comparison.
std::vector<float> nan_start(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// The packed q | k | v row width of NH query and NKV key/value heads over C = NH * HS channels.
int qkv_width(int C, int NH, int NKV) { return C + 2 * (C / NH) * NKV; }

// Attention over the whole sequence on one rank (the same on every rank: the same seeds).
Unsplit unsplit(CpuOps& ops, int B, int T, int C, int NH, int NKV, uint32_t seed) {
  Buffers bufs(ops);
  Unsplit u;
  u.qkv = random_floats(size_t(B) * T * qkv_width(C, NH, NKV), seed, -2.0f, 2.0f);
  u.dout = random_floats(size_t(B) * T * C, seed + 1);
  Tensor qkv = bufs.f32(u.qkv), out = bufs.zeros(size_t(B) * T * C), lse = bufs.zeros(size_t(B) * NH * T);
  ops.attention_forward(out, lse, qkv, B, T, C, NH, NKV);
  Tensor dqkv = bufs.f32(nan_start(u.qkv.size()));
  ops.attention_backward(dqkv, bufs.f32(u.dout), qkv, out, lse, B, T, C, NH, NKV);
  u.out = bufs.read(out);
  u.lse = bufs.read(lse);
  u.dqkv = bufs.read(dqkv);
  return u;
}

// Runs `Impl` (RingAttention or UlyssesAttention) on this rank's tokens and compares. lse is
// compared only for the ring (Ulysses keeps it head-sharded). NKV = 0: multi-head (NKV = NH).
template <class Impl>
void check_against_unsplit(Comm& cp, CpSplitKind kind, int B, int T, int C, int NH, bool compare_lse, int NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int W = qkv_width(C, NH, NKV);
  CpuOps ops;
  const Unsplit u = unsplit(ops, B, T, C, NH, NKV, 900 + T);
  const CpSplit split(kind, T, cp.size());
  const int r = cp.rank(), Tl = split.local_len();
  Buffers bufs(ops);
  Tensor qkv = bufs.f32(split.take(u.qkv, B, r, W));
  Tensor out = bufs.zeros(size_t(B) * Tl * C), lse = bufs.zeros(size_t(B) * NH * Tl);
  Impl impl(ops, cp, B, Tl, C, NH, NKV, DType::f32);
  impl.forward(out, lse, qkv);
  require_close(bufs.read(out), split.take(u.out, B, r, C), 1e-6, 1e-5, "out");
  if (compare_lse) require_close(bufs.read(lse), split.take(u.lse, B * NH, r), 1e-6, 1e-5, "lse");

  Tensor dqkv = bufs.f32(nan_start(size_t(B) * Tl * W));  // overwritten
  impl.backward(dqkv, bufs.f32(split.take(u.dout, B, r, C)), qkv, out, lse);
  require_close(bufs.read(dqkv), split.take(u.dqkv, B, r, W), 1e-6, 1e-5, "dqkv");
}

}  // namespace

TEST_CASE("ring attention on zigzag chunks equals unsplit attention", "[mpi][cp]") {
  const World w = whole_world();
  CpuOps ops;
  const auto cp = make_group_comm(everyone(w.size), w, ops);
  // Tc = 3 (not a power of two), 3 heads of 4 channels; then one token per chunk; then B = 1.
  SECTION("B 2, Tc 3") {
    check_against_unsplit<RingAttention>(*cp, CpSplitKind::zigzag, 2, 2 * w.size * 3, 12, 3, true);
  }
  SECTION("B 2, Tc 1") { check_against_unsplit<RingAttention>(*cp, CpSplitKind::zigzag, 2, 2 * w.size, 8, 2, true); }
  SECTION("B 1, Tc 5") {
    check_against_unsplit<RingAttention>(*cp, CpSplitKind::zigzag, 1, 2 * w.size * 5, 6, 1, true);
  }
  // Grouped-query: 4 query heads of 3 channels on 2 key/value heads, then on 1.
  SECTION("GQA NH 4, NKV 2, Tc 3") {
    check_against_unsplit<RingAttention>(*cp, CpSplitKind::zigzag, 2, 2 * w.size * 3, 12, 4, true, 2);
  }
  SECTION("GQA NH 4, NKV 1, Tc 2") {
    check_against_unsplit<RingAttention>(*cp, CpSplitKind::zigzag, 1, 2 * w.size * 2, 12, 4, true, 1);
  }
}

TEST_CASE("ring attention in a group of one is plain attention", "[mpi][cp]") {
  const World w = whole_world();
  CpuOps ops;
  const auto alone = make_group_comm({w.rank}, w, ops);
  check_against_unsplit<RingAttention>(*alone, CpSplitKind::zigzag, 2, 10, 12, 3, true);
}

TEST_CASE("Ulysses all-to-all attention equals unsplit attention", "[mpi][cp]") {
  const World w = whole_world();
  CpuOps ops;
  const auto cp = make_group_comm(everyone(w.size), w, ops);
  // 12 heads divide over cp 2, 3 and 4; head sizes 2 and 3; T_local 5 and 3.
  SECTION("B 2, T_local 5") {
    check_against_unsplit<UlyssesAttention>(*cp, CpSplitKind::contiguous, 2, 5 * w.size, 24, 12, false);
  }
  SECTION("B 1, T_local 3") {
    check_against_unsplit<UlyssesAttention>(*cp, CpSplitKind::contiguous, 1, 3 * w.size, 36, 12, false);
  }
  // Grouped-query: 12 key/value heads (divisible by cp 2, 3 and 4) under 24 query heads of 2
  // channels, then 12 under 36 (groups of 3).
  SECTION("GQA NH 24, NKV 12, T_local 3") {
    check_against_unsplit<UlyssesAttention>(*cp, CpSplitKind::contiguous, 2, 3 * w.size, 48, 24, false, 12);
  }
  SECTION("GQA NH 36, NKV 12, T_local 2") {
    check_against_unsplit<UlyssesAttention>(*cp, CpSplitKind::contiguous, 1, 2 * w.size, 36, 36, false, 12);
  }
  SECTION("heads not divisible by cp are refused") {
    // cp + 1 heads never divide over cp > 1 ranks.
    const int NH = w.size + 1;
    CHECK_THROWS_AS(UlyssesAttention(ops, *cp, 1, 4, 2 * NH, NH, NH, DType::f32), RuntimeError);
  }
  SECTION("key/value heads not divisible by cp are refused, naming the rule") {
    // cp * (cp + 1) query heads divide over cp ranks; their cp + 1 key/value heads do not.
    const int NKV = w.size + 1, NH = w.size * NKV;
    CHECK_THROWS_AS(UlyssesAttention(ops, *cp, 1, 4, 2 * NH, NH, NKV, DType::f32), ConfigError);
    CHECK_THROWS_WITH(UlyssesAttention(ops, *cp, 1, 4, 2 * NH, NH, NKV, DType::f32),
                      Catch::Contains("n_kv_heads=" + std::to_string(NKV)) &&
                          Catch::Contains("cp=" + std::to_string(w.size)) && Catch::Contains("divisible by tp*cp"));
  }
}
