#include "core/dist/process_groups.h"

#include <algorithm>
#include <numeric>

#include "core/dist/comm_wait.h"
#include "core/dist/coordination.h"
#include "core/dist/gpu_comm.h"
#include "core/dist/local_comm.h"
#include "core/dist/mpi_comm.h"
#include "core/dist/timed_comm.h"
#include "core/dist/world.h"
#include "core/report/system_info.h"

namespace pt {

namespace {

// A host-capable communicator with the given staging (nullptr: host tensors only). In a world of
// one, `ops` says where its buffers are: the backend's device, or host memory when null.
std::unique_ptr<Comm> host_group_comm(const std::vector<int>& members, const World& world, Ops* ops,
                                      const std::shared_ptr<HostStaging>& staging) {
#ifdef PICOTRAIN_WITH_MPI
  if (world.size > 1) return MpiComm::split_world(members, staging);
#endif
  check(members.size() == 1, "a world of one rank cannot form a group of " + std::to_string(members.size()));
  if (!ops) return LocalComm::host(world.rank);
  return std::make_unique<LocalComm>(world.rank, *ops);
}

// The facts choose_comm_backend needs, agreed by every rank over the host world communicator:
// whether NCCL loads everywhere (else the first failing rank's reason) and how many ranks share
// the most crowded GPU.
CommBackendFacts gather_facts(Comm& host_world, const World& world, Ops& ops, const std::string& requested) {
  CommBackendFacts f;
  f.device = ops.device();
  f.world_size = world.size;
  f.requested = requested;
  if (world.size == 1 || f.device == Device::cpu) return f;
  const NcclProbe probe = probe_nccl();
  const int failed = first_rank_with(host_world, !probe.loaded);
  f.nccl_loaded = failed < 0;
  f.nccl_detail = broadcast_string(host_world, probe.detail, failed < 0 ? 0 : failed);
  if (failed >= 0) f.nccl_detail = "on rank " + std::to_string(failed) + ": " + f.nccl_detail;
  const std::vector<std::string> gpus = all_gather_strings(host_world, gpu_identity());
  const std::string& mine = gpus[host_world.rank()];
  double sharing = static_cast<double>(std::count(gpus.begin(), gpus.end(), mine));
  // The most crowded GPU anywhere: a sum would not do, so each rank reports its count in its own slot.
  std::vector<double> counts(world.size, 0.0);
  counts[host_world.rank()] = sharing;
  host_world.all_reduce(counts.data(), counts.size());
  f.max_ranks_per_gpu = static_cast<int>(*std::max_element(counts.begin(), counts.end()));
  return f;
}

}  // namespace

std::unique_ptr<Comm> make_group_comm(const std::vector<int>& members, const World& world, Ops& ops) {
  return host_group_comm(members, world, &ops, world.size > 1 ? make_host_staging(ops) : nullptr);
}

ProcessGroups make_process_groups(const Grid& grid, const World& world, Ops& ops, const std::string& requested) {
  check(grid.world_size() == world.size, "the grid has " + std::to_string(grid.world_size()) +
                                             " ranks but the world has " + std::to_string(world.size));
  std::vector<int> everyone(world.size);
  std::iota(everyone.begin(), everyone.end(), 0);
  ProcessGroups g;
  // One staging buffer for every MpiComm of this rank (host_staging.h).
  const std::shared_ptr<HostStaging> staging = world.size > 1 ? make_host_staging(ops) : nullptr;
  // The world carries coordination's host vectors (checkpoints, the hosts' names, agreements).
  g.world = host_group_comm(everyone, world, nullptr, staging);
  // Where every rank runs, for the hang watchdog's message (comm_wait.h).
  set_rank_hosts(all_gather_strings(*g.world, host_name()));
  g.backend = choose_comm_backend(gather_facts(*g.world, world, ops, requested));
  GroupCommMaker make = [&](const std::vector<int>& members) { return host_group_comm(members, world, &ops, staging); };
  if (g.backend.backend == CommBackend::nccl) {
    // A rank that fails from here (NCCL's id, its bootstrap, a split) leaves the others inside
    // NCCL's own collectives, which no agreement reaches: a failure must end the world.
    set_ranks_in_lockstep(true);
    make = nccl_group_maker(*g.world, ops);
  }
  // Without HSDP the ZeRO shard groups are the reduction groups themselves, so one communicator
  // serves both. The rule is the layout's, the same on every rank, so every rank skips the same
  // collective set-up.
  const bool hsdp = grid.dp_replicate() > 1;
  const std::shared_ptr<Comm> dp_cp = make(grid.dp_cp_group(world.rank));
  const std::shared_ptr<Comm> shard = hsdp ? make(grid.dp_shard_group(world.rank)) : dp_cp;
  const std::shared_ptr<Comm> replicate = make(grid.dp_replicate_group(world.rank));
  const std::shared_ptr<Comm> tp = make(grid.group(world.rank, Axis::tp));
  const std::shared_ptr<Comm> cp = make(grid.group(world.rank, Axis::cp));
  const std::shared_ptr<Comm> ep = make(grid.ep_group(world.rank));
  std::shared_ptr<Comm> expert_dp_cp, expert_shard;
  if (grid.ep() > 1) {
    expert_dp_cp = make(grid.expert_dp_cp_group(world.rank));
    expert_shard = hsdp ? make(grid.expert_shard_group(world.rank)) : expert_dp_cp;
  }
  const std::vector<int> pipeline = grid.group(world.rank, Axis::pp);
  const std::shared_ptr<Comm> pp = make(pipeline);
  std::vector<int> embedding = {world.rank};
  if (pipeline.size() > 1 && (world.rank == pipeline.front() || world.rank == pipeline.back()))
    embedding = {pipeline.front(), pipeline.back()};
  const std::shared_ptr<Comm> embedding_comm = make(embedding);
  // Every group adds its time and bytes to one CommStats: the run report's communication time.
  auto timed = [&](std::shared_ptr<Comm> c) -> std::unique_ptr<Comm> {
    return c ? std::make_unique<TimedComm>(std::move(c), g.comm_stats) : nullptr;
  };
  g.world = timed(std::move(g.world));
  g.dp_cp = timed(dp_cp);
  g.shard = timed(shard);
  g.replicate = timed(replicate);
  g.tp = timed(tp);
  g.cp = timed(cp);
  g.ep = timed(ep);
  g.expert_dp_cp = timed(expert_dp_cp);
  g.expert_shard = timed(expert_shard);
  g.pp = timed(pp);
  g.embedding = timed(embedding_comm);
  return g;
}

}  // namespace pt
