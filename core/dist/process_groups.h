// The communicators one rank uses, made from the Grid's groups. With one rank each is a LocalComm,
// so a world of one and the -DPICOTRAIN_MPI=OFF build run the same code with no library.
// Otherwise the backend is chosen by choose_comm_backend (comm_backend.h): MpiComm (host memory,
// or device memory staged through pinned host memory) or NcclComm; the world communicator is
// always an MpiComm, because coordination (coordination.h, checkpoints) passes host buffers
// through it.
#pragma once
#include <memory>
#include <string>

#include "core/dist/comm.h"
#include "core/dist/comm_backend.h"
#include "core/dist/grid.h"
#include "core/dist/timed_comm.h"
#include "core/dist/world.h"
#include "core/ops/ops.h"

namespace pt {

struct ProcessGroups {
  std::unique_ptr<Comm> world;      // every rank; takes host buffers (coordination)
  std::unique_ptr<Comm> dp_cp;      // gradient reduction and the loss mean (Grid::dp_cp_group)
  std::unique_ptr<Comm> shard;      // ZeRO shards: dp_shard x cp (= dp_cp without HSDP)
  std::unique_ptr<Comm> replicate;  // HSDP replicas of one shard (one rank without HSDP)
  std::unique_ptr<Comm> pp;         // this pipeline's stages, in stage order (Grid::group(rank, pp))
  std::unique_ptr<Comm> tp;         // tensor parallel: the ranks that split one layer's matrices
  std::unique_ptr<Comm> cp;         // context parallel: the ranks that split one sequence
  std::unique_ptr<Comm> ep;         // expert parallel: the dp ranks that split the routed experts (Grid::ep_group)
  // Expert parallel only (null when parallel.ep is 1): the routed experts' gradient reduction and
  // ZeRO shard groups (Grid::expert_dp_cp_group, expert_shard_group; core/model/expert_split.h).
  std::unique_ptr<Comm> expert_dp_cp, expert_shard;
  // The tied embedding's two copies: the first and the last stage of this pipeline when pp > 1
  // (rank 0 = first stage); every other rank (and every rank when pp == 1) is a group of one.
  std::unique_ptr<Comm> embedding;
  // Time, calls and bytes of every call on the groups above (each is a TimedComm over it).
  std::shared_ptr<CommStats> comm_stats = std::make_shared<CommStats>();
  // The library that moves the groups' tensors, and why (the start-up log's comm line).
  CommBackendChoice backend;
};

// Collective over the whole world: every rank calls it once, in the same order relative to
// other collectives. `requested`: parallel.comm_backend (auto | nccl | mpi); a request that
// cannot be met throws ConfigError on every rank.
ProcessGroups make_process_groups(const Grid& grid, const World& world, Ops& ops,
                                  const std::string& requested = "auto");

// A host-capable communicator over `members` (world ranks, in group order): an MpiComm, staging
// `ops`'s device tensors, or a LocalComm for a world of one. Collective over the whole world when
// the world has more than one rank: every rank passes its own group, and groups must partition
// the world.
std::unique_ptr<Comm> make_group_comm(const std::vector<int>& members, const World& world, Ops& ops);

}  // namespace pt
