// NcclComm between 2, 3 and 4 ranks, on any machine that builds the CUDA backend (no GPU, no
// NCCL): the real cuda/nccl_comm.cpp over an in-process NCCL double (nccl_double.h, one thread
// per rank) and a fake CUDA runtime (nccl_fake_cuda.h, host memory as device memory). Every rank
// contributes its own values, so the exact results below fail for a collective that does
// nothing, reduces part of the count, uses the wrong dtype, op, root, peer or block offset, or
// runs on the wrong group; every collective NcclComm offers is checked in every dtype it takes,
// in place where it allows it, on the world and on split groups. The stream order against the
// compute stream is the one-GPU test's subject (gpu_nccl_comm.cpp), which runs the real NCCL.
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/nccl_comm.h"
#include "nccl_double.h"
#include "nccl_fake_cuda.h"

using namespace pt;
using namespace pt::test;

namespace {

// One rank's results by name, as doubles: f32 values, i32 values and bf16 bit patterns are all
// exact in a double.
using Outputs = std::map<std::string, std::vector<double>>;

constexpr size_t kBlock = 3;           // elements per rank's block: not a power of two
constexpr double kPoison = 9999;       // what an output holds before the call; never a result
const DType kAllDtypes[] = {DType::f32, DType::bf16, DType::i32};

// A distinct value for (rank, slot, element) that every dtype holds exactly (a bf16 as its bits).
double code(int rank, int slot, size_t j) { return 1000.0 * rank + 100.0 * slot + double(j) + 1; }
// The values a rank reduces: distinct per rank, so sum, max and a copy all differ; exact in f32.
double term(int rank, size_t i) { return 1 + 10.0 * rank + 0.5 * double(i); }
// The sum over ranks 0..n-1 of term(rank, i), in closed form.
double sum_of_terms(int n, size_t i) { return n + 5.0 * n * (n - 1) + 0.5 * n * double(i); }

// What a rank's body works with: its backend (CudaOps over the fake runtime), its NCCL world,
// and tensors that it reads back into its outputs.
class Rank {
 public:
  Rank(int rank, int size, Comm& host_world, Outputs& out)
      : r(rank), n(size), ops(DType::f32), world(NcclComm::make_world(host_world, ops)), out_(out) {}
  ~Rank() {
    for (Tensor& t : owned_) ops.release(t);
  }

  Tensor make(DType dtype, const std::vector<double>& values) {
    owned_.push_back(ops.alloc(values.size(), dtype));
    Tensor t = owned_.back();
    switch (dtype) {
      case DType::f32: upload<float>(t, values); break;
      case DType::bf16: upload<uint16_t>(t, values); break;
      case DType::i32: upload<int32_t>(t, values); break;
    }
    return t;
  }
  Tensor poisoned(DType dtype, size_t numel) { return make(dtype, std::vector<double>(numel, kPoison)); }
  void keep(const std::string& name, Tensor t) {
    switch (t.dtype) {
      case DType::f32: out_[name] = download<float>(t); break;
      case DType::bf16: out_[name] = download<uint16_t>(t); break;
      case DType::i32: out_[name] = download<int32_t>(t); break;
    }
  }
  void keep(const std::string& name, std::vector<double> values) { out_[name] = std::move(values); }

  const int r, n;
  CudaOps ops;
  std::unique_ptr<NcclComm> world;

 private:
  template <class T>
  void upload(Tensor t, const std::vector<double>& values) {
    std::vector<T> host(values.begin(), values.end());
    ops.upload(t, host.data(), t.dtype, host.size());
  }
  template <class T>
  std::vector<double> download(Tensor t) {
    std::vector<T> host(t.numel);
    ops.download(host.data(), t.dtype, t, t.numel);
    return std::vector<double>(host.begin(), host.end());
  }
  Outputs& out_;
  std::vector<Tensor> owned_;
};

// Runs body on n ranks over a fresh NCCL double; each rank's outputs. Afterwards no
// communicator and no device memory may be left behind (NcclComm destroys what it makes).
// Catch2's assertions are for the main thread only: bodies record, expect() checks.
std::vector<Outputs> on_ranks(int n, const std::function<void(Rank&)>& body, NcclDouble* given = nullptr) {
  std::unique_ptr<NcclDouble> own;
  if (!given) own = std::make_unique<NcclDouble>();
  NcclDouble& nccl = given ? *given : *own;
  std::vector<Outputs> out(n);
  nccl.run(n, [&](int r, Comm& host_world) {
    Rank rank(r, n, host_world, out[r]);
    body(rank);
  });
  CHECK(nccl.live_comms() == 0);
  CHECK(fake_cuda::live_allocations() == 0);
  return out;
}

// Checks every rank's outputs against want(rank): by name, element for element.
void expect(const std::vector<Outputs>& got, const std::function<Outputs(int rank)>& want) {
  const int n = int(got.size());
  for (int r = 0; r < n; r++)
    for (const auto& [name, values] : want(r)) {
      INFO("rank " << r << " of " << n << ": " << name);
      const auto it = got[r].find(name);
      REQUIRE(it != got[r].end());
      CHECK(it->second == values);
    }
}

std::string dtype_key(const char* what, DType dtype) { return std::string(what) + " " + dtype_name(dtype); }

std::vector<double> codes(int rank, int slot, size_t numel) {
  std::vector<double> v(numel);
  for (size_t j = 0; j < numel; j++) v[j] = code(rank, slot, j);
  return v;
}

}  // namespace

TEST_CASE("NcclComm of n ranks: exact results of every collective", "[nccl]") {
  const int n = GENERATE(2, 3, 4);
  INFO(n << " ranks");

  SECTION("the ranks run on the fake CUDA runtime, not a GPU") {
    std::vector<Outputs> got = on_ranks(n, [](Rank& k) {
      k.keep("size, rank", {double(k.world->size()), double(k.world->rank())});
      k.keep("members", std::vector<double>(k.world->members().begin(), k.world->members().end()));
      k.keep("fake device", {double(k.ops.device_description().find(fake_cuda::kDeviceName) != std::string::npos)});
    });
    expect(got, [&](int r) {
      std::vector<double> all;
      for (int k = 0; k < n; k++) all.push_back(k);
      return Outputs{{"size, rank", {double(n), double(r)}}, {"members", all}, {"fake device", {1}}};
    });
  }

  // Sums: f32 tensors (also started), host doubles in f64.
  SECTION("all_reduce, reduce_scatter, host f64, barrier") {
    const size_t len = 7;
    std::vector<Outputs> got = on_ranks(n, [&](Rank& k) {
      std::vector<double> mine(len), blocks(kBlock * n);
      for (size_t i = 0; i < len; i++) mine[i] = term(k.r, i);
      for (size_t i = 0; i < blocks.size(); i++) blocks[i] = term(k.r, i);

      Tensor x = k.make(DType::f32, mine);
      k.world->all_reduce(x);
      k.keep("all_reduce", x);
      Tensor y = k.make(DType::f32, mine);
      k.world->start_all_reduce(y);
      k.world->wait_started();
      k.keep("start_all_reduce", y);

      Tensor send = k.make(DType::f32, blocks), recv = k.poisoned(DType::f32, kBlock);
      k.world->reduce_scatter(send, recv);
      k.keep("reduce_scatter", recv);
      Tensor recv2 = k.poisoned(DType::f32, kBlock);
      k.world->start_reduce_scatter(send, recv2);
      k.world->wait_started();
      k.keep("start_reduce_scatter", recv2);

      // 2^996 needs f64; -2r and r + 0.25 are exact sums in any order.
      std::vector<double> host = {k.r + 0.25, -2.0 * k.r, std::ldexp(1.0, 996)};
      k.world->all_reduce(host.data(), host.size());
      k.keep("all_reduce f64", host);
      k.world->barrier();
    });
    expect(got, [&](int r) {
      std::vector<double> sums(len), block(kBlock);
      for (size_t i = 0; i < len; i++) sums[i] = sum_of_terms(n, i);
      for (size_t j = 0; j < kBlock; j++) block[j] = sum_of_terms(n, r * kBlock + j);
      const double ranks = n * (n - 1) / 2.0;
      return Outputs{{"all_reduce", sums},
                     {"start_all_reduce", sums},
                     {"reduce_scatter", block},
                     {"start_reduce_scatter", block},
                     {"all_reduce f64", {0.25 * n + ranks, -2.0 * ranks, n * std::ldexp(1.0, 996)}}};
    });
  }

  // Moves, in f32, bf16 and i32: all_gather also in place, broadcast from every root.
  SECTION("all_gather, all_to_all, broadcast, send/recv") {
    std::vector<Outputs> got = on_ranks(n, [&](Rank& k) {
      for (DType dtype : kAllDtypes) {
        Tensor mine = k.make(dtype, codes(k.r, 0, kBlock)), all = k.poisoned(dtype, kBlock * n);
        k.world->all_gather(mine, all);
        k.keep(dtype_key("all_gather", dtype), all);

        // In place, as ZeRO gathers: this rank's block of recv is the send.
        std::vector<double> blocks(kBlock * n, kPoison);
        for (size_t j = 0; j < kBlock; j++) blocks[k.r * kBlock + j] = code(k.r, 1, j);
        Tensor in_place = k.make(dtype, blocks);
        k.world->all_gather(in_place.slice(k.r * kBlock, kBlock), in_place);
        k.keep(dtype_key("all_gather in place", dtype), in_place);

        // Block p of send goes to rank p: slot p of code(r, p, j).
        std::vector<double> outgoing;
        for (int p = 0; p < n; p++)
          for (size_t j = 0; j < kBlock; j++) outgoing.push_back(code(k.r, 10 + p, j));
        Tensor send = k.make(dtype, outgoing), recv = k.poisoned(dtype, kBlock * n);
        k.world->all_to_all(send, recv);
        k.keep(dtype_key("all_to_all", dtype), recv);

        for (int root = 0; root < n; root++) {
          Tensor x = k.r == root ? k.make(dtype, codes(k.r, 2, kBlock)) : k.poisoned(dtype, kBlock);
          k.world->broadcast(x, root);
          k.keep(dtype_key("broadcast from", dtype) + " " + std::to_string(root), x);
        }

        // Around the ring; even ranks send first, odd ones receive first, so no cycle of sends.
        const int next = (k.r + 1) % n, prev = (k.r + n - 1) % n;
        Tensor out = k.make(dtype, codes(k.r, 3, kBlock)), in = k.poisoned(dtype, kBlock);
        if (k.r % 2 == 0) {
          k.world->send(out, next);
          k.world->recv(in, prev);
        } else {
          k.world->recv(in, prev);
          k.world->send(out, next);
        }
        k.keep(dtype_key("recv from the previous rank", dtype), in);
      }
    });
    expect(got, [&](int r) {
      Outputs want;
      for (DType dtype : kAllDtypes) {
        std::vector<double> gathered, gathered_in_place, exchanged;
        for (int p = 0; p < n; p++)
          for (size_t j = 0; j < kBlock; j++) {
            gathered.push_back(code(p, 0, j));
            gathered_in_place.push_back(code(p, 1, j));
            exchanged.push_back(code(p, 10 + r, j));  // rank p's block for this rank
          }
        want[dtype_key("all_gather", dtype)] = gathered;
        want[dtype_key("all_gather in place", dtype)] = gathered_in_place;
        want[dtype_key("all_to_all", dtype)] = exchanged;
        for (int root = 0; root < n; root++)
          want[dtype_key("broadcast from", dtype) + " " + std::to_string(root)] = codes(root, 2, kBlock);
        want[dtype_key("recv from the previous rank", dtype)] = codes((r + n - 1) % n, 3, kBlock);
      }
      return want;
    });
  }

  // Ranks in the order given, collectives within the group only.
  SECTION("split groups") {
    // members_of(r): the group this world rank joins. The world reversed, then the ranks of the
    // same parity, reversed (a rank alone in its group takes no communicator: split_out).
    auto reversed_world = [&] {
      std::vector<int> m;
      for (int k = n - 1; k >= 0; k--) m.push_back(k);
      return m;
    };
    auto same_parity = [&](int r) {
      std::vector<int> m;
      for (int k = n - 1; k >= 0; k--)
        if (k % 2 == r % 2) m.push_back(k);
      return m;
    };
    // The results of one group: its shape, a sum, a gather in group order, a broadcast from
    // group rank 0 (the first member), an all_to_all.
    auto exercise = [&](Rank& k, NcclComm& g, const std::string& name) {
      k.keep(name + " size, rank", {double(g.size()), double(g.rank())});
      k.keep(name + " members", std::vector<double>(g.members().begin(), g.members().end()));
      Tensor x = k.make(DType::f32, {term(k.r, 0), term(k.r, 1)});
      g.all_reduce(x);
      k.keep(name + " all_reduce", x);
      Tensor all = k.poisoned(DType::i32, kBlock * g.size());
      g.all_gather(k.make(DType::i32, codes(k.r, 0, kBlock)), all);
      k.keep(name + " all_gather", all);
      Tensor b = g.rank() == 0 ? k.make(DType::bf16, codes(k.r, 2, kBlock)) : k.poisoned(DType::bf16, kBlock);
      g.broadcast(b, 0);
      k.keep(name + " broadcast", b);
    };
    std::vector<Outputs> got = on_ranks(n, [&](Rank& k) {
      const std::unique_ptr<NcclComm> whole = k.world->split(reversed_world());
      exercise(k, *whole, "reversed");
      std::unique_ptr<NcclComm> parity;
      if (same_parity(k.r).size() > 1) {
        parity = k.world->split(same_parity(k.r));
        exercise(k, *parity, "parity");
      } else {
        k.world->split_out();
      }
      // The world is still the world.
      Tensor x = k.make(DType::f32, {term(k.r, 0)});
      k.world->all_reduce(x);
      k.keep("world all_reduce after the splits", x);
    });
    expect(got, [&](int r) {
      Outputs want;
      auto expect_group = [&](const std::vector<int>& members, const std::string& name) {
        const int at = int(std::find(members.begin(), members.end(), r) - members.begin());
        want[name + " size, rank"] = {double(members.size()), double(at)};
        want[name + " members"] = std::vector<double>(members.begin(), members.end());
        double s0 = 0, s1 = 0;
        std::vector<double> gathered;
        for (int m : members) {
          s0 += term(m, 0);
          s1 += term(m, 1);
          for (double c : codes(m, 0, kBlock)) gathered.push_back(c);
        }
        want[name + " all_reduce"] = {s0, s1};
        want[name + " all_gather"] = gathered;
        want[name + " broadcast"] = codes(members[0], 2, kBlock);
      };
      expect_group(reversed_world(), "reversed");
      if (same_parity(r).size() > 1) expect_group(same_parity(r), "parity");
      want["world all_reduce after the splits"] = {sum_of_terms(n, 0)};
      return want;
    });
  }

  // What the progress watchdog polls.
  SECTION("asynchronous errors reach NcclComm::async_error") {
    NcclDouble nccl;
    std::vector<Outputs> got = on_ranks(
        n,
        [&](Rank& k) {
          k.keep("healthy", {double(NcclComm::async_error().empty())});
          k.world->barrier();  // every rank has asked before rank 0 breaks it
          if (k.r == 0) nccl.set_async_error(nccl::ncclRemoteError);
          k.world->barrier();  // every rank asks after the failure
          const std::string e = NcclComm::async_error();
          k.keep("reported", {double(e.find("asynchronous error") != std::string::npos &&
                                     e.find("remote process exited") != std::string::npos)});
          k.world->barrier();  // every rank has asked before rank 0 heals it
          if (k.r == 0) nccl.set_async_error(nccl::ncclSuccess);
        },
        &nccl);
    expect(got, [](int) { return Outputs{{"healthy", {1}}, {"reported", {1}}}; });
  }
}

// The double must refuse what a real NCCL would not do, or NcclComm's mistakes would pass here.
TEST_CASE("the NCCL double refuses calls a real NCCL would not complete", "[nccl]") {
  NcclDouble nccl(std::chrono::milliseconds(300));
  const nccl::Api& api = nccl.api();
  // Runs body(rank, comm, ops) on two ranks of a raw NCCL communicator; each rank's result codes.
  auto two_ranks = [&](const std::function<std::vector<int>(int, nccl::ncclComm_t, CudaOps&)>& body) {
    std::vector<std::vector<int>> results(2);
    nccl.run(2, [&](int r, Comm& host_world) {
      CudaOps ops(DType::f32);
      std::vector<int32_t> id(nccl::kUniqueIdBytes / 4);
      nccl::ncclUniqueId uid{};
      if (r == 0 && api.GetUniqueId(&uid) != nccl::ncclSuccess) throw RuntimeError("ncclGetUniqueId failed");
      std::memcpy(id.data(), uid.internal, nccl::kUniqueIdBytes);
      host_world.broadcast(Tensor{id.data(), id.size(), DType::i32}, 0);
      std::memcpy(uid.internal, id.data(), nccl::kUniqueIdBytes);
      nccl::ncclComm_t comm = nullptr;
      if (api.CommInitRank(&comm, 2, uid, r) != nccl::ncclSuccess) throw RuntimeError("ncclCommInitRank failed");
      results[r] = body(r, comm, ops);
      api.CommDestroy(comm);
    });
    return results;
  };
  auto stream = [](CudaOps& ops) { return static_cast<nccl::cudaStream_t>(ops.stream()); };

  SECTION("ranks that disagree on the count") {
    const auto rc = two_ranks([&](int r, nccl::ncclComm_t comm, CudaOps& ops) {
      Tensor x = ops.alloc(4, DType::f32);
      const int rc = api.AllReduce(x.data, x.data, r == 0 ? 4 : 2, nccl::ncclFloat32, nccl::ncclSum, comm, stream(ops));
      ops.release(x);
      return std::vector<int>{rc};
    });
    CHECK(rc == std::vector<std::vector<int>>{{nccl::ncclInvalidUsage}, {nccl::ncclInvalidUsage}});
  }
  SECTION("host memory, a count past the buffer, a peer out of range") {
    const auto rc = two_ranks([&](int, nccl::ncclComm_t comm, CudaOps& ops) {
      std::vector<float> host(4);
      Tensor x = ops.alloc(4, DType::f32);
      std::vector<int> results = {
          api.AllReduce(host.data(), host.data(), 4, nccl::ncclFloat32, nccl::ncclSum, comm, stream(ops)),
          api.AllGather(x.data, x.data, 4, nccl::ncclFloat32, comm, stream(ops)),  // recv holds 1 block of 2
          api.Send(x.data, 4, nccl::ncclFloat32, 2, comm, stream(ops)),
          api.AllReduce(x.data, x.data, 4, nccl::ncclFloat32, nccl::ncclSum, comm, nullptr)};
      ops.release(x);
      return results;
    });
    for (const auto& r : rc) CHECK(r == std::vector<int>(4, nccl::ncclInvalidArgument));
  }
  SECTION("a send to itself outside a group never completes; inside one it does") {
    const auto rc = two_ranks([&](int r, nccl::ncclComm_t comm, CudaOps& ops) {
      Tensor x = ops.alloc(2, DType::f32);
      std::vector<int> results;
      api.GroupStart();
      api.Send(x.data, 2, nccl::ncclFloat32, r, comm, stream(ops));
      api.Recv(x.data, 2, nccl::ncclFloat32, r, comm, stream(ops));
      results.push_back(api.GroupEnd());
      if (r == 0) results.push_back(api.Send(x.data, 2, nccl::ncclFloat32, 0, comm, stream(ops)));
      ops.release(x);
      return results;
    });
    CHECK(rc[0] == std::vector<int>{nccl::ncclSuccess, nccl::ncclInternalError});
    CHECK(rc[1] == std::vector<int>{nccl::ncclSuccess});
  }
}
