// What this binary was built from: the commit of its sources and whether their tracked files
// differed from it (cmake/build_info.cmake records both at every build), and the backends compiled
// in. Printed by `picotrain --version`, the log's start-up lines, the run report and the
// benchmarks, so that every measurement names the code it measured.
#pragma once
#include <string>

namespace pt {

struct BuildInfo {
  std::string commit;  // 12 hex digits, or "unknown" (no git, no checkout)
  std::string tree;    // "clean", "modified" (tracked files differ from the commit) or "unknown"
  bool cuda = false;   // the CUDA backend is compiled in
  bool mpi = false;    // multi-rank launch through MPI is compiled in
};

const BuildInfo& build_info();

// One line: "commit 1a2b3c4d5e6f (clean tree), CUDA backend, MPI".
std::string build_description();

}  // namespace pt
