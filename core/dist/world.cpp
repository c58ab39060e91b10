#include "core/dist/world.h"

#include <cstdlib>

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

}  // namespace pt
