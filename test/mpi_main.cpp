// The Catch2 main of the multi-rank tests (test/mpi_*.cpp run under mpirun, see
// CMakeLists.txt): every rank runs every test case, so collectives inside a test match up.
// Rank 0 reports on the terminal; the other ranks write their reports to a file that is shown
// (prefixed with the rank) only when that rank failed, and every rank exits with the same code:
// 1 when a check failed on any rank.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "core/dist/world.h"

int main(int argc, char** argv) {
  const pt::World world = pt::init_world(&argc, &argv);
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) {
    pt::finalize_world();
    return rc;
  }
  const std::string report = (std::filesystem::temp_directory_path() /
                              ("picotrain_mpi_report_" + std::to_string(::getpid()) + ".txt")).string();
  if (world.rank != 0) session.configData().outputFilename = report;

  int failed = session.run();
  int any_failed = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank != 0) {
    if (failed) {
      std::ifstream in(report);
      std::string all, line;
      while (std::getline(in, line)) all += "[rank " + std::to_string(world.rank) + "] " + line + "\n";
      std::cerr << all << std::flush;
    }
    std::filesystem::remove(report);
  } else if (any_failed && !failed) {
    std::cerr << "rank 0 passed, but another rank failed (its report follows on stderr)\n" << std::flush;
  }
  pt::finalize_world();
  return any_failed ? 1 : 0;
}
