#include "core/common/build_info.h"

#include "picotrain_build_info.h"  // generated in the build folder

namespace pt {

const BuildInfo& build_info() {
#ifdef PICOTRAIN_WITH_CUDA
  constexpr bool cuda = true;
#else
  constexpr bool cuda = false;
#endif
#ifdef PICOTRAIN_WITH_MPI
  constexpr bool mpi = true;
#else
  constexpr bool mpi = false;
#endif
  static const BuildInfo info{PICOTRAIN_BUILD_COMMIT, PICOTRAIN_BUILD_TREE, cuda, mpi};
  return info;
}

std::string build_description() {
  const BuildInfo& b = build_info();
  std::string s = "commit " + b.commit + " (" + b.tree + " tree)";
  s += b.cuda ? ", CUDA backend" : ", no CUDA backend";
  s += b.mpi ? ", MPI" : ", no MPI";
  return s;
}

}  // namespace pt
