// MpiComm: a Comm over an MPI communicator made with MPI_Comm_split from the world. It works on
// host memory (the CPU backend's tensors, the coordination helpers' vectors); given a
// HostStaging, it also takes device tensors, staged through pinned host memory (host_staging.h),
// which also lets several ranks share one GPU in tests. Built only with PICOTRAIN_MPI=ON;
// process_groups.h picks LocalComm for a world of one, so callers never name MPI.
#pragma once
#include <memory>
#include <vector>

#include "core/dist/comm.h"
#include "core/dist/host_staging.h"

namespace pt {

class MpiComm final : public Comm {
 public:
  // Collective over EVERY world rank (MPI_Comm_split): each rank passes the members of its own
  // group (world ranks, in group order; this rank among them). Groups must partition the world,
  // as the Grid's groups along one axis do: the smallest member names a group. `staging`: how
  // device tensors are moved (nullptr: every tensor is in host memory).
  static std::unique_ptr<MpiComm> split_world(const std::vector<int>& members,
                                              std::shared_ptr<HostStaging> staging = nullptr);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  void all_reduce(Tensor x) override;
  void all_reduce(double* host, size_t n) override;
  void reduce_scatter(Tensor send, Tensor recv) override;
  void all_gather(Tensor send, Tensor recv) override;
  void all_to_all(Tensor send, Tensor recv) override;
  void broadcast(Tensor x, int root) override;
  void send(Tensor x, int peer) override;
  void recv(Tensor x, int peer) override;
  void barrier() override;

 private:
  struct Handle;  // the MPI_Comm (kept out of this header: only mpi_comm.cpp includes mpi.h)
  MpiComm(std::unique_ptr<Handle> handle, std::vector<int> members, int rank, std::shared_ptr<HostStaging> staging);
  std::unique_ptr<Handle> handle_;
  std::shared_ptr<HostStaging> staging_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace pt
