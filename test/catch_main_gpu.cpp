// Catch2 main for GPU tests: exits 77 (ctest: skipped) on a machine without a GPU, so the same
// test binaries run everywhere and only do work on a GPU machine; exits 1 when CUDA is there but
// fails (exit_unless_gpu), so a broken GPU machine does not pass as one without a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpu_test_support.h"

int main(int argc, char* argv[]) {
  pt::gputest::exit_unless_gpu("the GPU tests");
  return Catch::Session().run(argc, argv);
}
