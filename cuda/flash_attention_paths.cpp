// Which flash attention kernel runs, the sm_80 one or the Hopper one (attention.h, FlashPath):
// from PICOTRAIN_FLASH_FORWARD and PICOTRAIN_FLASH_BACKWARD, read once, or as a test or benchmark
// sets it.
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/common/error.h"
#include "cuda/attention.h"

namespace pt::gpu {

namespace {

FlashPath path_from_environment(const char* variable, FlashPath unset) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return unset;
  if (std::strcmp(v, "auto") == 0) return FlashPath::automatic;
  if (std::strcmp(v, "mma") == 0) return FlashPath::mma;
  if (std::strcmp(v, "wgmma") == 0) return FlashPath::wgmma;
  throw ConfigError(std::string(variable) + " is '" + v + "'; it takes mma, wgmma or auto");
}

FlashPath& forward_path() {
  static FlashPath path = path_from_environment("PICOTRAIN_FLASH_FORWARD", FlashPath::automatic);
  return path;
}
FlashPath& backward_path() {
  static FlashPath path = path_from_environment("PICOTRAIN_FLASH_BACKWARD", FlashPath::mma);
  return path;
}

}  // namespace

FlashPath flash_forward_path() { return forward_path(); }
void set_flash_forward_path(FlashPath path) { forward_path() = path; }
FlashPath flash_backward_path() { return backward_path(); }
void set_flash_backward_path(FlashPath path) { backward_path() = path; }

bool uses_sm90_kernel(FlashPath path) {
  return path == FlashPath::wgmma || (path == FlashPath::automatic && flash_sm90_available());
}

}  // namespace pt::gpu
