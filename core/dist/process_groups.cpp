#include "core/dist/process_groups.h"

#include <numeric>

#include "core/dist/local_comm.h"
#include "core/dist/mpi_comm.h"
#include "core/dist/timed_comm.h"

namespace pt {

std::unique_ptr<Comm> make_group_comm(const std::vector<int>& members, const World& world, Ops& ops) {
#ifdef PICOTRAIN_WITH_MPI
  if (world.size > 1) return MpiComm::split_world(members);
#endif
  check(members.size() == 1, "a world of one rank cannot form a group of " + std::to_string(members.size()));
  return std::make_unique<LocalComm>(world.rank, ops);
}

ProcessGroups make_process_groups(const Grid& grid, const World& world, Ops& ops) {
  check(grid.world_size() == world.size, "the grid has " + std::to_string(grid.world_size()) +
                                             " ranks but the world has " + std::to_string(world.size));
  std::vector<int> everyone(world.size);
  std::iota(everyone.begin(), everyone.end(), 0);
  ProcessGroups g;
  g.world = make_group_comm(everyone, world, ops);
  g.dp_cp = make_group_comm(grid.dp_cp_group(world.rank), world, ops);
  g.shard = make_group_comm(grid.dp_shard_group(world.rank), world, ops);
  g.replicate = make_group_comm(grid.dp_replicate_group(world.rank), world, ops);
  g.tp = make_group_comm(grid.group(world.rank, Axis::tp), world, ops);
  g.cp = make_group_comm(grid.group(world.rank, Axis::cp), world, ops);
  const std::vector<int> pipeline = grid.group(world.rank, Axis::pp);
  g.pp = make_group_comm(pipeline, world, ops);
  std::vector<int> embedding = {world.rank};
  if (pipeline.size() > 1 && (world.rank == pipeline.front() || world.rank == pipeline.back()))
    embedding = {pipeline.front(), pipeline.back()};
  g.embedding = make_group_comm(embedding, world, ops);
  // Every group adds its time and bytes to one CommStats: the run report's communication time.
  for (std::unique_ptr<Comm>* c : {&g.world, &g.dp_cp, &g.shard, &g.replicate, &g.tp, &g.cp, &g.pp, &g.embedding})
    *c = std::make_unique<TimedComm>(std::move(*c), g.comm_stats);
  return g;
}

}  // namespace pt
