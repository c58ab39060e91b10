// The process world: which rank this process is and how many there are. With MPI built in,
// the launcher (mpirun, srun) decides; a process started without a launcher is a world of
// one. Without MPI (-DPICOTRAIN_MPI=OFF) the world is always one rank.
#pragma once
#include <exception>

namespace pt {

struct World {
  int rank = 0;
  int size = 1;
  // This rank among the ranks on its node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED, which
  // every launcher supports: no mpirun- or Slurm-specific variables). It picks the rank's GPU.
  int local_rank = 0;
  int local_size = 1;
};

// Initialises MPI when built with it (idempotent). Call once at start-up.
World init_world(int* argc, char*** argv);
// Finalises MPI if init_world started it.
void finalize_world();
// Ends every rank at once (MPI_Abort) after a fatal error on one rank; exit() without MPI.
[[noreturn]] void abort_world(int code);

// The start-up agreement. Every rank calls it once, after the set-up it can do alone (config
// checks, opening data, allocating) and before its first collective, passing the exception its
// set-up threw (or nullptr). If any rank failed, every rank throws: the failed ones their own
// error, the others one naming the lowest failed rank, of the same kind (ConfigError or
// RuntimeError). So one rank's missing file cannot leave the others waiting in a collective,
// and every rank prints its line and exits with the same code.
void agree_on_startup(const World& world, std::exception_ptr local_failure);

// Set once ranks wait on each other in collectives: from then on a failure on one rank must end
// the world (abort_world) rather than return, or the others would wait for it forever.
void set_ranks_in_lockstep(bool in_lockstep);
bool ranks_in_lockstep();

}  // namespace pt
