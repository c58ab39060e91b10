#include "core/dist/world.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "core/common/error.h"
#include "core/dist/coordination.h"

#ifdef PICOTRAIN_WITH_MPI
#include <mpi.h>
#endif

namespace pt {

#ifdef PICOTRAIN_WITH_MPI
static bool g_we_initialised_mpi = false;
#endif

World init_world(int* argc, char*** argv) {
  World w;
#ifdef PICOTRAIN_WITH_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPI_Init(argc, argv);
    g_we_initialised_mpi = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  if (w.size > 1) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &w.local_rank);
    MPI_Comm_size(node, &w.local_size);
    MPI_Comm_free(&node);
  }
#endif
  return w;
}

void finalize_world() {
#ifdef PICOTRAIN_WITH_MPI
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (g_we_initialised_mpi && !finalised) MPI_Finalize();
#endif
}

void abort_world(int code) {
#ifdef PICOTRAIN_WITH_MPI
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

static bool g_in_lockstep = false;
void set_ranks_in_lockstep(bool in_lockstep) { g_in_lockstep = in_lockstep; }
bool ranks_in_lockstep() { return g_in_lockstep; }

void agree_on_startup(const World& world, std::exception_ptr local_failure) {
  // Each rank contributes 2*rank + (1 for a config error) when it failed, else INT_MAX; the
  // minimum names the lowest failed rank and the kind of its failure.
  int status = local_failure ? 2 * world.rank + (is_config_error(local_failure) ? 1 : 0) : INT_MAX;
#ifdef PICOTRAIN_WITH_MPI
  if (world.size > 1) MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#endif
  if (local_failure) std::rethrow_exception(local_failure);
  if (status == INT_MAX) return;
  const std::string msg = "rank " + std::to_string(status / 2) + " failed during start-up (see its error)";
  if (status % 2 == 1) throw ConfigError(msg);
  throw RuntimeError(msg);
}

}  // namespace pt
