// NcclDouble: an in-process NCCL of several ranks, so that the real NcclComm (cuda/nccl_comm.cpp)
// runs collectives between 2, 3 or 4 ranks in a test, without NCCL or a GPU
// (test/nccl_comm_ranks.cpp). A one-rank communicator cannot tell a sum from a copy, nor half
// the count from all of it; here every rank contributes its own values and gets back what NCCL
// would have computed, so a wrong count, dtype, reduction op, root, peer, offset or group fails.
//
// How: NCCL is reached only through the table of nccl_api.h; the double installs its own table
// (nccl::install_for_testing) and run() starts one thread per rank. The threads meet in the
// double's functions: a collective waits until every rank of its communicator has called it,
// checks that they agree (kind, count, dtype, op, root), and computes each rank's result from
// copies of every rank's input (so in-place calls are exact). ncclCommSplit partitions a
// communicator by color, ordered by key, as NCCL does; ncclSend waits until its receive takes
// it unless it is inside ncclGroupStart/End (NCCL's rule: a rank sending to itself, or ranks
// sending to each other first, need a group). Buffers must be device memory of the fake CUDA
// runtime (nccl_fake_cuda.h) holding count x dtype bytes, and streams its streams. Whatever the
// double refuses returns an NCCL error, which NcclComm turns into an exception; errors() says why.
// Waits give up after `patience` (calls that do not match hang on a real NCCL; here they fail).
//
// The ranks take turns: a rank thread runs only while the others wait in a collective (one lock,
// released only inside a wait). So each rank is the one thread of its own "process", which
// NcclComm assumes (it keeps process-wide state: the last queued event, the live communicators).
//
// Modelled: ncclGetUniqueId, CommInitRank, CommSplit (config nullptr), CommDestroy/Abort,
// CommGetAsyncError, AllReduce (sum, prod, max, min, avg; every integer and float type but f16),
// ReduceScatter, AllGather, Broadcast, Send/Recv in and out of groups. Not modelled: collectives
// inside a group, streams' order (work runs at once, on the host).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dist/comm.h"
#include "cuda/nccl_api.h"

namespace pt::test {

class NcclDouble {
 public:
  // Installs the double as NCCL until it is destroyed; one at a time.
  explicit NcclDouble(std::chrono::milliseconds patience = std::chrono::seconds(15));
  ~NcclDouble();
  NcclDouble(const NcclDouble&) = delete;
  NcclDouble& operator=(const NcclDouble&) = delete;

  // Runs body(rank, host_world) for ranks 0 .. ranks-1, each on its own thread, and returns when
  // all have ended. host_world is the host-memory world Comm that NcclComm::make_world takes; it
  // carries broadcast only (the unique id). Every NCCL call must come from inside a body. When a
  // rank throws, the ranks waiting for it give up, and run() throws RuntimeError with the first
  // rank's message and the double's errors().
  void run(int ranks, const std::function<void(int rank, Comm& host_world)>& body);

  // Why the double refused each call it refused, "rank R: ..." (an NCCL error code cannot say).
  std::vector<std::string> errors() const;
  // Communicators made and not yet destroyed or aborted.
  int live_comms() const;
  // What ncclCommGetAsyncError reports from now on (ncclSuccess: healthy).
  void set_async_error(nccl::ncclResult_t state);
  // The double's NCCL table (the one installed), for tests that call NCCL directly.
  const nccl::Api& api() const;

  struct World;  // the shared state of the ranks (nccl_double.cpp)

 private:
  std::unique_ptr<World> world_;
};

}  // namespace pt::test
