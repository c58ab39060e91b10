// Tensor-parallel parameter pieces: TpSlice's local -> global mapping, the pieces
// tensor_parallel_table cuts (shapes, the q|k|v grouping of c_attn, indivisible tp), the
// initial values of the pieces (together exactly the tp=1 model), and the checkpoint spans a
// local range is stored as (core/ckpt/tp_chunks.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "core/ckpt/tp_chunks.h"
#include "core/model/param_table.h"
#include "core/model/tp_slice.h"
#include "tp_test_model.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// for_each_run's pieces, as (local, global, n) triples.
std::vector<std::array<size_t, 3>> runs_of(const TpSlice& t, size_t begin, size_t end) {
  std::vector<std::array<size_t, 3>> out;
  t.for_each_run(begin, end, [&](size_t l, size_t g, size_t n) { out.push_back({l, g, n}); });
  return out;
}

}  // namespace

TEST_CASE("TpSlice maps local elements to their global index", "[tp_slice]") {
  // A row-parallel [3, 8] matrix over 4 ranks: rank 1 holds columns 2-3 of each row.
  const TpSlice row{3, 8, 1, 4, 1};
  CHECK(row.run() == 2);
  CHECK(row.stride() == 8);
  CHECK(row.local_split() == 2);
  const std::vector<size_t> want = {2, 3, 10, 11, 18, 19};
  for (size_t i = 0; i < want.size(); i++) CHECK(row.global_index(i) == want[i]);

  // A column-parallel fused [3*4, 5] (q|k|v of 4 rows each) over 2 ranks: rank 1 holds rows
  // 2-3 of each group, runs of 2 rows = 10 elements, 20 apart.
  const TpSlice col{3, 4, 5, 2, 1};
  CHECK(col.run() == 10);
  CHECK(col.stride() == 20);
  CHECK(col.global_index(0) == 10);
  CHECK(col.global_index(9) == 19);
  CHECK(col.global_index(10) == 30);
  CHECK(col.global_index(29) == 59);

  const TpSlice whole;
  CHECK(whole.whole());
  CHECK(whole.global_index(17) == 17);
}

TEST_CASE("TpSlice::for_each_run splits a local range at run boundaries", "[tp_slice]") {
  const TpSlice row{3, 8, 1, 4, 1};  // runs of 2 at 2, 10, 18
  using R = std::vector<std::array<size_t, 3>>;
  CHECK(runs_of(row, 0, 0).empty());
  CHECK(runs_of(row, 3, 3).empty());
  CHECK(runs_of(row, 0, 6) == R{{0, 2, 2}, {2, 10, 2}, {4, 18, 2}});
  CHECK(runs_of(row, 1, 5) == R{{1, 3, 1}, {2, 10, 2}, {4, 18, 1}});
  CHECK(runs_of(row, 2, 4) == R{{2, 10, 2}});     // exactly one run
  CHECK(runs_of(row, 3, 4) == R{{3, 11, 1}});     // inside one run
  CHECK(runs_of(row, 5, 6) == R{{5, 19, 1}});     // the last element
  CHECK(runs_of(TpSlice{}, 4, 9) == R{{4, 4, 5}});  // whole: one piece

  // Every element of every range once, in order, at its global index.
  for (const TpSlice& t : {TpSlice{3, 8, 1, 4, 3}, TpSlice{3, 4, 5, 2, 0}, TpSlice{1, 16, 3, 4, 2}})
    for (size_t b = 0; b <= 12; b++)
      for (size_t e = b; e <= 12; e++) {
        size_t next = b;
        for (const auto& [l, g, n] : runs_of(t, b, e)) {
          CHECK(l == next);
          CHECK(n > 0);
          for (size_t k = 0; k < n; k++) CHECK(t.global_index(l + k) == g + k);
          next = l + n;
        }
        CHECK(next == e);
      }
}

TEST_CASE("tensor_parallel_table cuts every parameter to the rank's piece", "[tp_slice]") {
  const ModelSection m = tp_test_model();
  const ParamTable full = build_param_table(m);
  const int64_t C = m.d_model, V = m.padded_vocab;
  for (int tp : {2, 4}) {
    for (int rank = 0; rank < tp; rank++) {
      INFO("tp " << tp << " rank " << rank);
      const ParamTable t = tensor_parallel_table(full, tp, rank);
      REQUIRE(t.specs().size() == full.specs().size());
      const std::map<std::string, std::vector<int64_t>> split = {
          {"wte", {V / tp, C}},
          {"h.0.attn.c_attn.weight", {3 * C / tp, C}},
          {"h.0.attn.c_attn.bias", {3 * C / tp}},
          {"h.0.attn.c_proj.weight", {C, C / tp}},
          {"h.0.mlp.c_fc.weight", {4 * C / tp, C}},
          {"h.0.mlp.c_fc.bias", {4 * C / tp}},
          {"h.1.mlp.c_proj.weight", {C, 4 * C / tp}},
      };
      size_t offset = 0;
      for (size_t i = 0; i < t.specs().size(); i++) {
        const ParamSpec& p = t.specs()[i];
        const ParamSpec& f = full.specs()[i];
        INFO(p.name);
        CHECK(p.name == f.name);
        CHECK(p.global_shape == f.shape);
        if (const auto it = split.find(p.name); it != split.end()) CHECK(p.shape == it->second);
        if (p.split == Split::replicated) {
          CHECK(p.shape == f.shape);
          CHECK(p.tp.whole());
        } else {
          CHECK(p.tp.parts == tp);
          CHECK(p.tp.rank == rank);
          CHECK(p.numel * tp == f.numel);
        }
        CHECK(p.numel == numel_of(p.shape));
        CHECK(p.offset == offset);
        offset += p.numel;
      }
      CHECK(t.total_numel() == offset);
    }
  }
  CHECK(tensor_parallel_table(full, 1, 0).total_numel() == full.total_numel());
}

TEST_CASE("c_attn pieces hold q, then k, then v rows of the rank's heads", "[tp_slice]") {
  const ModelSection m = tp_test_model();
  const ParamTable full = build_param_table(m);
  const int64_t C = m.d_model, hd = m.d_model / m.n_heads;
  for (int tp : {2, 4}) {
    const int64_t heads = m.n_heads / tp, rows = heads * hd;  // per rank and group
    for (int rank = 0; rank < tp; rank++) {
      INFO("tp " << tp << " rank " << rank);
      const ParamTable t = tensor_parallel_table(full, tp, rank);
      const ParamSpec& w = t.get("h.1.attn.c_attn.weight");
      const ParamSpec& b = t.get("h.1.attn.c_attn.bias");
      REQUIRE(w.shape == std::vector<int64_t>{3 * rows, C});
      for (int64_t r = 0; r < 3 * rows; r++) {
        const int64_t group = r / rows;  // 0 q, 1 k, 2 v
        const int64_t want_row = group * C + rank * rows + r % rows;
        CHECK(w.tp.global_index(static_cast<size_t>(r * C)) == static_cast<size_t>(want_row * C));
        CHECK(w.tp.global_index(static_cast<size_t>(r * C + C - 1)) == static_cast<size_t>(want_row * C + C - 1));
        CHECK(b.tp.global_index(static_cast<size_t>(r)) == static_cast<size_t>(want_row));
      }
    }
  }
}

TEST_CASE("a tp that does not divide a split dimension is a ConfigError naming it", "[tp_slice]") {
  ModelSection m = tp_test_model();
  const ParamTable full = build_param_table(m);
  CHECK_THROWS_AS(tensor_parallel_table(full, 3, 0), ConfigError);
  CHECK_THROWS_WITH(tensor_parallel_table(full, 3, 1), Contains("parallel.tp=3 does not divide") && Contains("wte"));
  // The padded vocabulary splits 8 ways, but c_attn's q|k|v groups of 36 rows do not.
  m.d_model = 36;
  m.n_heads = 4;
  CHECK_THROWS_WITH(tensor_parallel_table(build_param_table(m), 8, 0),
                    Contains("parallel.tp=8 does not divide the 36 rows of parameter h.0.attn.c_attn.weight"));
}

TEST_CASE("the tp pieces' initial values are exactly the tp=1 model's", "[tp_slice]") {
  const ParamTable full = build_param_table(tp_test_model());
  std::vector<float> want(full.total_numel());
  init_params(full, 1234, want.data());
  for (int tp : {2, 4}) {
    INFO("tp " << tp);
    std::vector<float> got(full.total_numel(), std::nanf(""));
    std::vector<int> writes(full.total_numel(), 0);
    for (int rank = 0; rank < tp; rank++) {
      const ParamTable t = tensor_parallel_table(full, tp, rank);
      std::vector<float> piece(t.total_numel());
      init_params(t, 1234, piece.data());
      for (size_t i = 0; i < t.specs().size(); i++) {
        const ParamSpec& p = t.specs()[i];
        const size_t at = full.specs()[i].offset;
        if (p.tp.whole()) {  // replicated: every rank's copy is the whole parameter
          CHECK(std::memcmp(piece.data() + p.offset, want.data() + at, p.numel * sizeof(float)) == 0);
          if (rank > 0) continue;
        }
        p.tp.for_each_run(0, p.numel, [&](size_t l, size_t g, size_t n) {
          std::copy_n(piece.data() + p.offset + l, n, got.data() + at + g);
          for (size_t k = 0; k < n; k++) writes[at + g + k]++;
        });
      }
    }
    CHECK(std::count(writes.begin(), writes.end(), 1) == static_cast<long>(writes.size()));
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("a local range is stored as at most three global spans", "[tp_slice][ckpt]") {
  using ckpt::GlobalSpan;
  // Runs of 4, 16 apart (a row-parallel [5, 16] matrix, rank 2 of 4).
  const TpSlice t{5, 16, 1, 4, 2};
  for (size_t b = 0; b <= 20; b++)
    for (size_t e = b; e <= 20; e++) {
      INFO("local [" << b << ", " << e << ")");
      const std::vector<GlobalSpan> spans = ckpt::global_spans(t, b, e);
      CHECK(spans.size() <= 3);
      size_t next = b;
      for (const GlobalSpan& s : spans) {
        CHECK(s.local_begin == next);
        REQUIRE(s.numel > 0);
        if (s.run != 0) {  // strided: whole runs only, at least two
          CHECK(s.stride == t.stride());
          CHECK(s.run == t.run());
          CHECK(s.numel % s.run == 0);
          CHECK(s.numel / s.run >= 2);
        }
        for (size_t k = 0; k < s.numel; k++) {
          const size_t g = s.run == 0 ? s.global_begin + k : s.global_begin + k / s.run * s.stride + k % s.run;
          CHECK(g == t.global_index(s.local_begin + k));
        }
        next += s.numel;
      }
      CHECK(next == e);
    }
  // The cases by name: a partial first run, whole runs, a partial last run.
  const std::vector<GlobalSpan> s = ckpt::global_spans(t, 2, 19);
  REQUIRE(s.size() == 3);
  CHECK((s[0].local_begin == 2 && s[0].numel == 2 && s[0].run == 0 && s[0].global_begin == 10));
  CHECK((s[1].local_begin == 4 && s[1].numel == 12 && s[1].run == 4 && s[1].global_begin == 24));
  CHECK((s[2].local_begin == 16 && s[2].numel == 3 && s[2].run == 0 && s[2].global_begin == 72));
  // Replicated: one contiguous span.
  const std::vector<GlobalSpan> whole = ckpt::global_spans(TpSlice{}, 3, 40);
  REQUIRE(whole.size() == 1);
  CHECK((whole[0].global_begin == 3 && whole[0].numel == 37 && whole[0].run == 0));
}
