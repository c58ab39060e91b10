// Which library moves this run's tensors between ranks, and why. A pure function of facts every
// rank has agreed on (make_process_groups gathers them), so every rank makes the same choice:
//
//  - one rank: LocalComm (nothing to move);
//  - the cpu backend: MpiComm on host memory;
//  - the cuda backend: NcclComm when NCCL loads on every rank and no two ranks share a GPU (NCCL
//    cannot run two ranks on one GPU); otherwise MpiComm with device buffers staged through pinned
//    host memory (slower, but any MPI and any number of ranks per GPU).
//
// parallel.comm_backend (auto | nccl | mpi) can ask for one: `nccl` where it cannot run is a
// ConfigError naming the reason; `mpi` on a GPU stages.
#pragma once
#include <string>

#include "core/ops/ops.h"

namespace pt {

enum class CommBackend { local, mpi, nccl };
const char* comm_backend_name(CommBackend b);

struct CommBackendFacts {
  Device device = Device::cpu;
  int world_size = 1;
  std::string requested = "auto";  // parallel.comm_backend
  bool nccl_loaded = false;        // on every rank
  std::string nccl_detail;         // its version when loaded, else why not (the first failing rank's reason)
  int max_ranks_per_gpu = 1;       // the most ranks sharing one GPU, over the world
};

struct CommBackendChoice {
  CommBackend backend = CommBackend::local;
  bool staged = false;  // MpiComm with device buffers staged through pinned host memory
  std::string reason;   // one line for the log
};

CommBackendChoice choose_comm_backend(const CommBackendFacts& facts);

}  // namespace pt
