// The flash attention kernels a GPU test runs (cuda/attention.h, FlashPath), for the tests that
// check the sm_80 and the Hopper kernels apart (gpu_attention, gpu_attention_block).
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "cuda/attention.h"

namespace pt::gputest {

// Sets the forward's and the backward's kernels for a scope, and puts back what was there.
class KernelPaths {
 public:
  KernelPaths(gpu::FlashPath forward, gpu::FlashPath backward)
      : forward_(gpu::flash_forward_path()), backward_(gpu::flash_backward_path()) {
    gpu::set_flash_forward_path(forward);
    gpu::set_flash_backward_path(backward);
  }
  ~KernelPaths() {
    gpu::set_flash_forward_path(forward_);
    gpu::set_flash_backward_path(backward_);
  }
  KernelPaths(const KernelPaths&) = delete;
  KernelPaths& operator=(const KernelPaths&) = delete;

 private:
  gpu::FlashPath forward_, backward_;
};
constexpr gpu::FlashPath kMma = gpu::FlashPath::mma;
constexpr gpu::FlashPath kWgmma = gpu::FlashPath::wgmma;

// Whether the Hopper kernels are here (compute capability 9.0 and an sm_90a build); where they are
// not, a case says so and checks nothing, unless PICOTRAIN_REQUIRE_SM90=1 (gpu_check.sh sets it on
// an H100/H200), where that is a failure.
inline bool hopper_kernels_here() {
  if (gpu::flash_sm90_available()) return true;
  const char* required = std::getenv("PICOTRAIN_REQUIRE_SM90");
  if (required != nullptr && std::string(required) == "1") FAIL("PICOTRAIN_REQUIRE_SM90=1 but no Hopper kernel here");
  WARN("no Hopper flash kernels here (needs compute capability 9.0 and an sm_90a build): not checked");
  return false;
}

}  // namespace pt::gputest
