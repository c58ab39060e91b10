// NcclComm on one GPU: a communicator of one rank (one GPU cannot host two NCCL ranks), through
// every collective, in f32, bf16 and i32, and a group split from it. With one rank each result
// is known exactly (the identity, a copy, a block move), which checks the wiring: the dtypes and
// counts handed to NCCL, the in-place cases, and the ordering against the compute stream (each
// result is read by a download queued right after the call, with no explicit synchronisation),
// and that live communicators report no asynchronous error. One rank cannot tell a sum from a
// copy: the results between ranks are nccl_comm_ranks.cpp's subject (an NCCL double, no GPU).
//
// NCCL is loaded at run time. Where it is expected (PICOTRAIN_NCCL_LIB names it, or
// PICOTRAIN_REQUIRE_NCCL=1: scripts/gpu_check.sh sets both) a library that does not load fails
// the test; elsewhere (a GPU machine without NCCL) the test says so and checks nothing.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dist/local_comm.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_comm.h"
#include "gpu_test_support.h"

using namespace pt;

namespace {

bool nccl_ready() {
  if (nccl::try_load()) return true;
  const char* lib = std::getenv(nccl::kLibraryEnv);
  const char* required = std::getenv("PICOTRAIN_REQUIRE_NCCL");
  if ((lib && *lib) || (required && std::string(required) == "1"))
    FAIL("NCCL is required here (PICOTRAIN_NCCL_LIB or PICOTRAIN_REQUIRE_NCCL=1) but " << nccl::load_error());
  WARN("NCCL not loaded, nothing checked: " << nccl::load_error());
  return false;
}

template <class T>
std::vector<T> read(Ops& ops, Tensor t) {
  std::vector<T> v(t.numel);
  ops.download(v.data(), t.dtype, t, t.numel);
  return v;
}

}  // namespace

TEST_CASE("NcclComm of one rank: every collective", "[gpu][nccl]") {
  if (!nccl_ready()) return;
  const auto ops = make_cuda_ops(DType::f32);
  LocalComm host_world(0, *ops);
  const std::unique_ptr<NcclComm> world = NcclComm::make_world(host_world, *ops);
  REQUIRE(world->size() == 1);
  REQUIRE(world->rank() == 0);
  CHECK(world->members() == std::vector<int>{0});

  auto upload = [&](const std::vector<float>& v) {
    Tensor t = ops->alloc(v.size(), DType::f32);
    ops->upload(t, v.data(), DType::f32, v.size());
    return t;
  };
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};

  SECTION("all_reduce f32 and host f64, barrier") {
    Tensor x = upload(values);
    world->all_reduce(x);
    CHECK(read<float>(*ops, x) == values);
    ops->release(x);
    double d[3] = {0.5, -1.0, 1e300};
    world->all_reduce(d, 3);
    CHECK((d[0] == 0.5 && d[1] == -1.0 && d[2] == 1e300));
    world->barrier();
  }
  SECTION("reduce_scatter and all_gather (separate and in place)") {
    Tensor send = upload(values), recv = ops->alloc(values.size(), DType::f32);
    world->reduce_scatter(send, recv);
    CHECK(read<float>(*ops, recv) == values);
    Tensor gathered = ops->alloc(values.size(), DType::f32);
    world->all_gather(send, gathered);
    CHECK(read<float>(*ops, gathered) == values);
    world->all_gather(gathered.slice(0, values.size()), gathered);  // in place
    CHECK(read<float>(*ops, gathered) == values);
    for (Tensor* t : {&send, &recv, &gathered}) ops->release(*t);
  }
  SECTION("bf16 and i32 move as they are: all_gather, all_to_all, broadcast") {
    const std::vector<uint16_t> bits = {0x3f80, 0xc000, 0x7fc0, 0x0001};  // 1, -2, NaN, a denormal
    Tensor b = ops->alloc(bits.size(), DType::bf16), b2 = ops->alloc(bits.size(), DType::bf16);
    ops->upload(b, bits.data(), DType::bf16, bits.size());
    world->all_gather(b, b2);
    CHECK(read<uint16_t>(*ops, b2) == bits);
    const std::vector<int32_t> ints = {7, -1, 1 << 30, 0};
    Tensor i = ops->alloc(ints.size(), DType::i32), i2 = ops->alloc(ints.size(), DType::i32);
    ops->upload(i, ints.data(), DType::i32, ints.size());
    world->all_to_all(i, i2);
    CHECK(read<int32_t>(*ops, i2) == ints);
    world->broadcast(i2, 0);
    CHECK(read<int32_t>(*ops, i2) == ints);
    for (Tensor* t : {&b, &b2, &i, &i2}) ops->release(*t);
  }
  SECTION("a group split from the world, and wrong arguments") {
    const std::unique_ptr<NcclComm> group = world->split({0});
    CHECK(group->size() == 1);
    Tensor x = upload(values);
    group->all_reduce(x);
    group->broadcast(x, 0);
    CHECK(read<float>(*ops, x) == values);
    CHECK_THROWS_AS(world->split({1}), RuntimeError);  // this rank is not in its group
    Tensor wrong = ops->alloc(3, DType::f32);
    CHECK_THROWS_AS(world->reduce_scatter(x, wrong), RuntimeError);  // 4 is not 1 block of 3
    Tensor ints = ops->alloc(4, DType::i32);
    CHECK_THROWS_AS(world->all_reduce(ints), RuntimeError);  // reductions are f32 only
    for (Tensor* t : {&x, &wrong, &ints}) ops->release(*t);
  }
  SECTION("healthy communicators report no asynchronous error (the watchdog's probe)") {
    const std::unique_ptr<NcclComm> group = world->split({0});
    Tensor x = upload(values);
    group->all_reduce(x);
    ops->synchronize();
    CHECK(NcclComm::async_error().empty());
    ops->release(x);
  }
}
