// NcclComm: a Comm over NCCL on device memory, one per process group, each rank on its own GPU
// (NCCL refuses two ranks on one GPU; core/dist/comm_backend.h falls back to the staged MpiComm
// then). NCCL is loaded at run time (nccl_api.h).
//
// Set-up: the world communicator is bootstrapped by broadcasting NCCL's unique id from rank 0
// over the host-memory world Comm (MPI); every group is cut from it with ncclCommSplit (color:
// the group's smallest world rank, key: the position in the group), the same partition rule as
// MpiComm::split_world. A rank alone in its group takes part with no color (split_out) and uses
// a LocalComm instead (core/dist/gpu_comm.cpp).
//
// Ordering: collectives run on the communicator's own stream. Before each one that stream waits
// for an event recorded on the CudaOps compute stream (the inputs are written), and after it the
// compute stream waits for an event on the communication stream (the outputs are ready), so the
// Comm contract holds in stream order (comm.h: a result is complete for every op queued after the
// call) while the host never waits on ordinary collectives. Only all_reduce of host doubles and
// barrier wait for the GPU: their results are on the host. Because every call also waits for the
// compute stream, all NCCL calls of a rank run in its program order, whichever communicator they
// use, so ranks cannot deadlock on two communicators launched in different orders.
//
// The one exception is the started reductions (start_all_reduce, start_reduce_scatter: GradSync's
// gradient buckets under ZeRO 0-1): the compute stream does not wait for them until
// wait_started(), so backward runs on while they reduce. A later collective on another
// communicator (tp, pp) must still not run beside a bucket's: before NCCL 2.26 two communicators'
// kernels on one GPU deadlock unless every rank runs them in one consistent order (NCCL's
// "Using multiple NCCL communicators concurrently"; 2.26's NCCL_LAUNCH_ORDER_IMPLICIT does what
// follows). So each operation's stream also waits for the operation this process queued before
// it, on any communicator: a rank's NCCL kernels run one at a time in its program order, which
// is the same on every rank of a group, while compute overlaps them.
//
// Dtypes: reductions in f32 (and f64 for host doubles); all_gather, all_to_all, broadcast and
// send/recv move f32, bf16 and i32 as those NCCL types.
//
// No CUDA or NCCL headers here: core (g++) includes it to build the process groups.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/dist/comm.h"
#include "core/ops/ops.h"

namespace pt {

class NcclComm final : public Comm {
 public:
  // The communicator of every world rank. Collective over `host_world`, a Comm that takes host
  // buffers (the MPI world), whose group rank is the world rank. `ops` must be the CudaOps the
  // tensors belong to; the current CUDA device must be this rank's GPU.
  static std::unique_ptr<NcclComm> make_world(Comm& host_world, Ops& ops);
  // A communicator over `members` (world ranks, in group order; this rank among them), split from
  // this one. Collective over every rank of this communicator; the groups must partition it.
  std::unique_ptr<NcclComm> split(const std::vector<int>& members);
  // This rank's part in a split that gives it no communicator (it is alone in its group and
  // needs none: LocalComm serves it); the other ranks call split() at the same time.
  void split_out();
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

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
  // Gradient buckets: queued on this communicator's stream like the others, but the compute
  // stream waits for them only at wait_started(), so backward overlaps them.
  void start_all_reduce(Tensor x) override;
  void start_reduce_scatter(Tensor send, Tensor recv) override;
  void wait_started() override;

  // The first asynchronous error a live communicator of this process reports, "" when none:
  // NCCL's network and peer failures, which otherwise show only as a collective that never
  // ends. Thread-safe: the progress watchdog (core/train/progress_watchdog.h) polls it.
  static std::string async_error();

 private:
  struct State;  // the ncclComm_t, streams, events (kept out of this header: no CUDA types)
  NcclComm(std::unique_ptr<State> state, std::vector<int> members, int rank);
  // Runs `launch(comm stream)` ordered after the compute stream's queued work and, when
  // compute_waits, before the compute stream's next op (see the header comment). `what` names
  // the call in errors.
  template <class F>
  void ordered(const char* what, F&& launch, bool compute_waits = true);
  void all_reduce_f32(Tensor x, bool compute_waits);
  void reduce_scatter_f32(Tensor send, Tensor recv, bool compute_waits);
  std::unique_ptr<State> state_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace pt
