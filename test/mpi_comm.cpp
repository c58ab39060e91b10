// MpiComm over real MPI (run under mpirun with 3 and 4 ranks, see test/CMakeLists.txt): every
// collective and point-to-point call on known values, in place and not, and the groups
// make_process_groups cuts from a Grid, HSDP included, and the control-plane helpers (failure
// agreement, string exchange) built on them.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <numeric>

#include "core/common/error.h"
#include "core/cpu/cpu_ops.h"
#include "core/dist/coordination.h"
#include "core/dist/grid.h"
#include "core/dist/process_groups.h"
#include "mpi_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

// A host f32 tensor that frees itself.
struct Buf {
  CpuOps& ops;
  Tensor t;
  Buf(CpuOps& o, size_t n, DType d = DType::f32) : ops(o), t(o.alloc(n, d)) {}
  ~Buf() { ops.release(t); }
  float& operator[](size_t i) { return t.f32()[i]; }
};

}  // namespace

TEST_CASE("MpiComm collectives and point-to-point over the world", "[mpi]") {
  const World w = whole_world();
  CpuOps ops;
  const auto comm = make_group_comm(everyone(w.size), w, ops);
  const int n = comm->size(), r = comm->rank();
  REQUIRE(n == w.size);
  REQUIRE(r == w.rank);
  const float sum_ranks = float(n * (n - 1) / 2);

  SECTION("all_reduce, f32 and f64") {
    Buf x(ops, 5);
    for (int i = 0; i < 5; i++) x[i] = float(r + i);
    comm->all_reduce(x.t);
    for (int i = 0; i < 5; i++) CHECK(x[i] == sum_ranks + n * i);
    double d[2] = {0.5 * r, 1.0};
    comm->all_reduce(d, 2);
    CHECK(d[0] == 0.5 * sum_ranks);
    CHECK(d[1] == n);
  }
  SECTION("reduce_scatter: block k of the sum lands on rank k") {
    const size_t block = 3;
    Buf send(ops, block * n), recv(ops, block);
    for (size_t i = 0; i < block * n; i++) send[i] = float(i) + r;
    comm->reduce_scatter(send.t, recv.t);
    for (size_t j = 0; j < block; j++) CHECK(recv[j] == n * float(r * block + j) + sum_ranks);
  }
  SECTION("all_gather, separate buffers and in place") {
    const size_t block = 2;
    Buf mine(ops, block), all(ops, block * n);
    mine[0] = float(r);
    mine[1] = float(10 * r);
    comm->all_gather(mine.t, all.t);
    for (int k = 0; k < n; k++) CHECK((all[2 * k] == float(k) && all[2 * k + 1] == float(10 * k)));
    Buf in_place(ops, block * n);
    in_place[2 * r] = float(r + 1);
    in_place[2 * r + 1] = -1.0f;
    comm->all_gather(in_place.t.slice(block * r, block), in_place.t);
    for (int k = 0; k < n; k++) CHECK((in_place[2 * k] == float(k + 1) && in_place[2 * k + 1] == -1.0f));
  }
  SECTION("all_to_all, broadcast, send/recv around a ring, barrier") {
    Buf send(ops, n, DType::i32), recv(ops, n, DType::i32);
    for (int k = 0; k < n; k++) send.t.i32()[k] = 100 * r + k;
    comm->all_to_all(send.t, recv.t);
    for (int k = 0; k < n; k++) CHECK(recv.t.i32()[k] == 100 * k + r);

    Buf b(ops, 3);
    for (int i = 0; i < 3; i++) b[i] = r == n - 1 ? float(7 + i) : 0.0f;
    comm->broadcast(b.t, n - 1);
    CHECK((b[0] == 7.0f && b[2] == 9.0f));

    // Even ranks send first, odd ranks receive first: no deadlock with blocking calls.
    Buf out(ops, 1), in(ops, 1);
    out[0] = float(r);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      comm->send(out.t, next);
      comm->recv(in.t, prev);
    } else {
      comm->recv(in.t, prev);
      comm->send(out.t, next);
    }
    CHECK(in[0] == float(prev));
    comm->barrier();
  }
}

TEST_CASE("process groups follow the grid, HSDP included", "[mpi]") {
  const World w = whole_world();
  if (w.size != 4) return;  // the 2 x 2 layout needs 4 ranks
  CpuOps ops;
  ParallelSection p;
  p.dp = 4;
  p.dp_replicate = 2;
  const Grid grid(p);
  const ProcessGroups g = make_process_groups(grid, w, ops);
  CHECK(g.world->size() == 4);
  CHECK(g.dp_cp->members() == std::vector<int>{0, 1, 2, 3});
  CHECK(g.shard->members() == (w.rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
  CHECK(g.replicate->members() == (w.rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
  CHECK(g.shard->rank() == w.rank % 2);
  CHECK(g.replicate->rank() == w.rank / 2);
  // Reductions stay inside their group.
  double x = w.rank;
  g.shard->all_reduce(&x, 1);
  CHECK(x == (w.rank < 2 ? 1.0 : 5.0));
  double y = w.rank;
  g.replicate->all_reduce(&y, 1);
  CHECK(y == (w.rank % 2 == 0 ? 2.0 : 4.0));
}

TEST_CASE("ranks agree on failures and exchange strings", "[mpi]") {
  const World w = whole_world();
  CpuOps ops;
  const auto comm = make_group_comm(everyone(w.size), w, ops);
  const int r = comm->rank();

  CHECK(first_rank_with(*comm, r >= 1) == 1);
  CHECK(first_rank_with(*comm, false) == -1);
  CHECK_NOTHROW(agree(*comm, nullptr, "nothing"));

  // Rank 1 fails with a config error: it throws its own, every other rank one naming rank 1.
  std::exception_ptr mine;
  if (r == 1) mine = std::make_exception_ptr(ConfigError("bad key on rank 1"));
  try {
    agree(*comm, mine, "loading");
    FAIL("agree did not throw");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains(r == 1 ? "bad key on rank 1" : "loading failed on rank 1"));
  }

  const std::vector<std::string> all = all_gather_strings(*comm, std::string(r, 'x') + std::to_string(r));
  REQUIRE(all.size() == static_cast<size_t>(w.size));
  for (int k = 0; k < w.size; k++) CHECK(all[k] == std::string(k, 'x') + std::to_string(k));
  CHECK(broadcast_string(*comm, r == w.size - 1 ? "from the last rank" : "", w.size - 1) == "from the last rank");
}
