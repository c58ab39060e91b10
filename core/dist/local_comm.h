// LocalComm: a group of one rank. Every collective is the identity (a copy when input and
// output are different buffers); point-to-point has no peer and is an error. It lets a single
// rank, and the -DPICOTRAIN_MPI=OFF build, run exactly the code path of a multi-rank layout.
#pragma once
#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class LocalComm final : public Comm {
 public:
  // world_rank: this process's rank in the world (for members()); ops: copies between buffers
  // on the backend's device.
  LocalComm(int world_rank, Ops& ops) : members_{world_rank}, ops_(ops) {}

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
  void copy_block(Tensor dst, Tensor src, const char* what);
  std::vector<int> members_;
  Ops& ops_;
};

}  // namespace pt
