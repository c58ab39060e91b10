// The process world: which rank this process is and how many there are. With MPI built in,
// the launcher (mpirun, srun) decides; a process started without a launcher is a world of
// one. Without MPI (-DPICOTRAIN_MPI=OFF) the world is always one rank.
#pragma once

namespace pt {

struct World {
  int rank = 0;
  int size = 1;
};

// Initialises MPI when built with it (idempotent). Call once at start-up.
World init_world(int* argc, char*** argv);
// Finalises MPI if init_world started it.
void finalize_world();
// Ends every rank at once (MPI_Abort) after a fatal error on one rank; exit() without MPI.
[[noreturn]] void abort_world(int code);

}  // namespace pt
