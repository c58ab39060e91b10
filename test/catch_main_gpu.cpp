// Catch2 main for GPU tests: exits 77 (ctest: skipped) when no GPU is present, so the same
// test binaries run everywhere and only do work on a GPU machine.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "core/ops/ops.h"

int main(int argc, char* argv[]) {
  if (!pt::cuda_available()) {
    std::printf("no CUDA device: skipping GPU tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
