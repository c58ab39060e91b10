// classify_cuda_presence, the rule by which GPU tests run, skip (exit 77) or fail: only a
// machine without a GPU or a driver may skip; every other CUDA error must fail, so that a
// broken GPU machine never reports its GPU tests as skipped. CPU-side: the rule is fed each
// cudaGetDeviceCount outcome, error codes as the CUDA headers number them.
#include <catch2/catch.hpp>

#include "core/ops/ops.h"

using pt::classify_cuda_presence;
using State = pt::CudaPresence::State;

TEST_CASE("devices counted without an error are present; none is absent", "[cuda_presence]") {
  CHECK(classify_cuda_presence(pt::kCudaSuccess, "cudaSuccess", 2, true).state == State::present);
  CHECK(classify_cuda_presence(pt::kCudaSuccess, "cudaSuccess", 0, true).state == State::absent);
}

TEST_CASE("no device (also CUDA_VISIBLE_DEVICES=) is absent", "[cuda_presence]") {
  for (bool driver : {true, false})
    CHECK(classify_cuda_presence(pt::kCudaErrorNoDevice, "cudaErrorNoDevice", 0, driver).state == State::absent);
}

TEST_CASE("'insufficient driver' is absent only when no driver library loads", "[cuda_presence]") {
  const auto without = classify_cuda_presence(pt::kCudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", 0, false);
  CHECK(without.state == State::absent);
  CHECK_THAT(without.detail, Catch::Contains("no NVIDIA driver is installed"));
  // A driver that is installed but older than the runtime: a GPU machine set up wrong.
  const auto mismatch = classify_cuda_presence(pt::kCudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", 0, true);
  CHECK(mismatch.state == State::broken);
  CHECK_THAT(mismatch.detail, Catch::Contains("cudaErrorInsufficientDriver") && Catch::Contains("35"));
}

TEST_CASE("without --device: cuda when present, cpu when absent, an error naming the fault when broken",
          "[cuda_presence]") {
  CHECK(pt::default_device({State::present, "1 device"}) == pt::Device::cuda);
  CHECK(pt::default_device({State::absent, "no NVIDIA driver"}) == pt::Device::cpu);
  CHECK_THROWS_WITH(pt::default_device({State::broken, "cudaErrorStubLibrary (cudaError 34)"}),
                    Catch::Contains("cudaErrorStubLibrary (cudaError 34)") && Catch::Contains("--device cpu"));
}

TEST_CASE("every other CUDA error is broken and named", "[cuda_presence]") {
  // cudaErrorInitializationError 3, cudaErrorStubLibrary 34 (the toolkit's stub libcuda loaded),
  // cudaErrorDevicesUnavailable 46, cudaErrorSystemNotReady 802, cudaErrorSystemDriverMismatch 803,
  // cudaErrorCompatNotSupportedOnDevice 804, cudaErrorUnknown 999, and a code no header has.
  for (int error : {3, 34, 46, 802, 803, 804, 999, 12345}) {
    for (bool driver : {true, false}) {
      INFO("error " << error << ", driver library loads " << driver);
      const auto p = classify_cuda_presence(error, "cudaErrorSomething: text", 0, driver);
      CHECK(p.state == State::broken);
      CHECK_THAT(p.detail, Catch::Contains("cudaErrorSomething: text") && Catch::Contains(std::to_string(error)));
    }
  }
}
