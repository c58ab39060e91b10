// MpiComm with device buffers (run under mpirun with 2 and 3 ranks, see test/CMakeLists.txt): the
// staging path of the CUDA backend, checked on the CPU with a fake device. Its "device memory" is
// host memory kept scrambled (every byte XOR 0x5a), so a tensor that MpiComm handed to MPI without
// staging would be summed or moved as garbage; the fake counts the copies each call makes, and
// host buffers (the coordination helpers') must pass through without a copy.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dist/coordination.h"
#include "core/dist/mpi_comm.h"
#include "mpi_test_support.h"

using namespace pt;
using namespace pt::test;

namespace {

class FakeDevice final : public HostStaging {
 public:
  static constexpr unsigned char kScramble = 0x5a;

  Tensor alloc(size_t n, DType dtype) {
    blocks_.emplace_back(n * dtype_size(dtype), kScramble);  // scrambled zeros
    return Tensor{blocks_.back().data(), n, dtype};
  }
  template <class T>
  void write(Tensor t, const std::vector<T>& v) {
    REQUIRE(v.size() * sizeof(T) == t.bytes());
    scramble(t.data, v.data(), t.bytes());
  }
  template <class T>
  std::vector<T> read(Tensor t) {
    std::vector<T> v(t.bytes() / sizeof(T));
    scramble(v.data(), t.data, t.bytes());
    return v;
  }

  bool on_device(const void* p) const override {
    for (const auto& b : blocks_)
      if (p >= b.data() && p < b.data() + b.size()) return true;
    return false;
  }
  void* host_buffer(size_t bytes) override {
    if (pinned_.size() < bytes) pinned_.resize(bytes);
    return pinned_.data();
  }
  void to_host(void* host_dst, const void* device_src, size_t bytes) override {
    CHECK(on_device(device_src));
    scramble(host_dst, device_src, bytes);
    downs++;
  }
  void to_device(void* device_dst, const void* host_src, size_t bytes) override {
    CHECK(on_device(device_dst));
    scramble(device_dst, host_src, bytes);
    ups++;
  }

  int downs = 0, ups = 0;  // copies device -> host and host -> device

 private:
  static void scramble(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    for (size_t i = 0; i < bytes; i++) d[i] = s[i] ^ kScramble;
  }
  std::vector<std::vector<unsigned char>> blocks_;  // moving a block keeps its data where it is
  std::vector<unsigned char> pinned_;
};

}  // namespace

TEST_CASE("MpiComm stages device tensors through host memory", "[mpi][staging]") {
  const World w = whole_world();
  auto dev = std::make_shared<FakeDevice>();
  const auto comm = MpiComm::split_world(everyone(w.size), dev);
  const int n = comm->size(), r = comm->rank();
  const float sum_ranks = float(n * (n - 1) / 2);

  SECTION("all_reduce: one copy down, one up") {
    Tensor x = dev->alloc(3, DType::f32);
    dev->write(x, std::vector<float>{float(r), 1.5f, -2.0f});
    comm->all_reduce(x);
    CHECK(dev->read<float>(x) == std::vector<float>{sum_ranks, 1.5f * n, -2.0f * n});
    CHECK((dev->downs == 1 && dev->ups == 1));
  }
  SECTION("reduce_scatter and all_gather, also with send a block of recv") {
    Tensor send = dev->alloc(2 * n, DType::f32), recv = dev->alloc(2, DType::f32);
    std::vector<float> s(2 * n);
    for (int i = 0; i < 2 * n; i++) s[i] = float(i + r);
    dev->write(send, s);
    comm->reduce_scatter(send, recv);
    CHECK(dev->read<float>(recv) == std::vector<float>{n * float(2 * r) + sum_ranks, n * float(2 * r + 1) + sum_ranks});
    CHECK((dev->downs == 1 && dev->ups == 1));

    Tensor all = dev->alloc(2 * n, DType::f32);
    std::vector<float> mine(2 * n, -1.0f);
    mine[2 * r] = float(r);
    mine[2 * r + 1] = float(10 * r);
    dev->write(all, mine);
    comm->all_gather(all.slice(2 * r, 2), all);  // in place, as ZeRO gathers
    const std::vector<float> got = dev->read<float>(all);
    for (int k = 0; k < n; k++) CHECK((got[2 * k] == float(k) && got[2 * k + 1] == float(10 * k)));
    CHECK((dev->downs == 2 && dev->ups == 2));
  }
  SECTION("bf16 and i32 move as bits: all_gather, all_to_all") {
    Tensor half = dev->alloc(1, DType::bf16), halves = dev->alloc(n, DType::bf16);
    dev->write(half, std::vector<uint16_t>{static_cast<uint16_t>(0x3f80 + r)});
    comm->all_gather(half, halves);
    const std::vector<uint16_t> h = dev->read<uint16_t>(halves);
    for (int k = 0; k < n; k++) CHECK(h[k] == 0x3f80 + k);

    Tensor send = dev->alloc(n, DType::i32), recv = dev->alloc(n, DType::i32);
    std::vector<int32_t> s(n);
    for (int k = 0; k < n; k++) s[k] = 100 * r + k;
    dev->write(send, s);
    comm->all_to_all(send, recv);
    const std::vector<int32_t> got = dev->read<int32_t>(recv);
    for (int k = 0; k < n; k++) CHECK(got[k] == 100 * k + r);
  }
  SECTION("broadcast copies down on the root only, up on the others; send/recv around a ring") {
    Tensor b = dev->alloc(2, DType::f32);
    dev->write(b, r == n - 1 ? std::vector<float>{7.0f, 8.0f} : std::vector<float>{0.0f, 0.0f});
    comm->broadcast(b, n - 1);
    CHECK(dev->read<float>(b) == std::vector<float>{7.0f, 8.0f});
    CHECK(dev->downs == (r == n - 1 ? 1 : 0));
    CHECK(dev->ups == (r == n - 1 ? 0 : 1));

    Tensor out = dev->alloc(1, DType::f32), in = dev->alloc(1, DType::f32);
    dev->write(out, std::vector<float>{float(r)});
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      comm->send(out, next);
      comm->recv(in, prev);
    } else {
      comm->recv(in, prev);
      comm->send(out, next);
    }
    CHECK(dev->read<float>(in) == std::vector<float>{float(prev)});
  }
  SECTION("host buffers on the same communicator are not staged") {
    std::vector<float> host = {float(r)};
    comm->all_reduce(Tensor{host.data(), 1, DType::f32});
    CHECK(host[0] == sum_ranks);
    const std::vector<std::string> names = all_gather_strings(*comm, "rank" + std::to_string(r));
    for (int k = 0; k < n; k++) CHECK(names[k] == "rank" + std::to_string(k));
    CHECK((dev->downs == 0 && dev->ups == 0));
  }
}
