// LocalComm: a group of one rank. Every collective is the identity (a copy when input and
// output are different buffers); point-to-point has no peer and is an error. It lets a single
// rank, and the -DPICOTRAIN_MPI=OFF build, run exactly the code path of a multi-rank layout.
// Its buffers live in one place: the backend's device (the groups that carry tensors), or host
// memory (LocalComm::host: the world communicator, which carries coordination's host vectors;
// a device copy of those fails on a GPU, as the first GPU run found).
#pragma once
#include <memory>

#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class LocalComm final : public Comm {
 public:
  // world_rank: this process's rank in the world (for members()); ops: copies between buffers
  // on the backend's device.
  LocalComm(int world_rank, Ops& ops) : members_{world_rank}, ops_(&ops) {}
  // A group of one whose buffers are host memory, whatever the backend.
  static std::unique_ptr<LocalComm> host(int world_rank) {
    return std::unique_ptr<LocalComm>(new LocalComm(world_rank));
  }

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& members() const override { return members_; }
  void all_reduce(Tensor) override {}
  void all_reduce(double*, size_t) override {}
  void reduce_scatter(Tensor send, Tensor recv) override;
  void all_gather(Tensor send, Tensor recv) override;
  void all_to_all(Tensor send, Tensor recv) override;
  void broadcast(Tensor, int root) override;
  void send(Tensor, int peer) override;
  void recv(Tensor, int peer) override;
  void barrier() override {}

 private:
  explicit LocalComm(int world_rank) : members_{world_rank}, ops_(nullptr) {}
  void copy_block(Tensor dst, Tensor src, const char* what);
  std::vector<int> members_;
  Ops* ops_;  // nullptr: host memory
};

}  // namespace pt
