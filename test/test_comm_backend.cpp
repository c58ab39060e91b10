// Choosing what moves tensors between ranks (core/dist/comm_backend.h), the key that asks for one
// (parallel.comm_backend), the GPU each local rank takes, and the NCCL loader's message when the
// library is not there. All on the CPU.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/dist/comm_backend.h"
#include "core/dist/coordination.h"
#include "core/dist/gpu_comm.h"
#include "core/dist/local_comm.h"

#ifdef PICOTRAIN_WITH_CUDA
#include "cuda/nccl_api.h"
#endif

using namespace pt;

namespace {

CommBackendFacts gpus(int ranks, bool nccl_loaded, int ranks_per_gpu, const std::string& requested = "auto") {
  CommBackendFacts f;
  f.device = Device::cuda;
  f.world_size = ranks;
  f.requested = requested;
  f.nccl_loaded = nccl_loaded;
  f.nccl_detail = nccl_loaded ? "2.21.5" : "NCCL could not be loaded from libnccl.so.2 (not found)";
  f.max_ranks_per_gpu = ranks_per_gpu;
  return f;
}

std::string config_error(const std::string& set) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "vocab_size": 64, "max_seq_len": 16},
    "batch": {"micro_batch_size": 2, "seq_len": 16},
    "data": {"train": "unused_train_*.bin"}
  })");
  try {
    const RunConfig c = config_from_json(j, {set}, 1);
    return "(no error: " + c.parallel.comm_backend + ")";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("one rank needs no library, the cpu backend uses MPI", "[comm]") {
  CommBackendFacts one = gpus(1, false, 1, "nccl");
  CHECK(choose_comm_backend(one).backend == CommBackend::local);
  CommBackendFacts cpu;
  cpu.world_size = 4;
  const CommBackendChoice c = choose_comm_backend(cpu);
  CHECK(c.backend == CommBackend::mpi);
  CHECK_FALSE(c.staged);
  cpu.requested = "nccl";
  CHECK_THROWS_WITH(choose_comm_backend(cpu), Catch::Contains("parallel.comm_backend=nccl") &&
                                                  Catch::Contains("cpu backend"));
}

TEST_CASE("GPUs: NCCL when it loads and every rank has its own GPU, else staged MPI", "[comm]") {
  const CommBackendChoice nccl = choose_comm_backend(gpus(8, true, 1));
  CHECK(nccl.backend == CommBackend::nccl);
  CHECK_FALSE(nccl.staged);
  CHECK_THAT(nccl.reason, Catch::Contains("2.21.5"));

  const CommBackendChoice shared = choose_comm_backend(gpus(4, true, 2));
  CHECK(shared.backend == CommBackend::mpi);
  CHECK(shared.staged);
  CHECK_THAT(shared.reason, Catch::Contains("2 ranks share one GPU"));

  const CommBackendChoice missing = choose_comm_backend(gpus(2, false, 1));
  CHECK(missing.backend == CommBackend::mpi);
  CHECK(missing.staged);
  CHECK_THAT(missing.reason, Catch::Contains("NCCL could not be loaded"));

  const CommBackendChoice asked_mpi = choose_comm_backend(gpus(8, true, 1, "mpi"));
  CHECK(asked_mpi.backend == CommBackend::mpi);
  CHECK(asked_mpi.staged);
  CHECK_THAT(asked_mpi.reason, Catch::Contains("parallel.comm_backend=mpi"));

  CHECK(choose_comm_backend(gpus(8, true, 1, "nccl")).backend == CommBackend::nccl);
  CHECK_THROWS_AS(choose_comm_backend(gpus(2, false, 1, "nccl")), ConfigError);
  CHECK_THROWS_WITH(choose_comm_backend(gpus(2, false, 1, "nccl")),
                    Catch::Contains("parallel.comm_backend=nccl") && Catch::Contains("NCCL could not be loaded"));
  CHECK_THROWS_WITH(choose_comm_backend(gpus(4, true, 4, "nccl")), Catch::Contains("4 ranks share one GPU"));
}

TEST_CASE("parallel.comm_backend is auto, nccl or mpi", "[comm][config]") {
  CHECK(config_error("parallel.comm_backend=auto") == "(no error: auto)");
  CHECK(config_error("parallel.comm_backend=nccl") == "(no error: nccl)");
  CHECK(config_error("parallel.comm_backend=mpi") == "(no error: mpi)");
  const std::string bad = config_error("parallel.comm_backend=gloo");
  CHECK_THAT(bad, Catch::Contains("parallel.comm_backend=\"gloo\"") && Catch::Contains("auto, nccl, mpi"));
  CHECK(RunConfig{}.parallel.comm_backend == "auto");
}

TEST_CASE("local ranks take the visible GPUs in turn", "[comm]") {
  CHECK(gpu_for_local_rank(0, 8) == 0);
  CHECK(gpu_for_local_rank(7, 8) == 7);
  CHECK(gpu_for_local_rank(3, 1) == 0);  // e.g. Slurm's --gpus-per-task=1: each rank sees only its own
  CHECK(gpu_for_local_rank(5, 4) == 1);
  CHECK_THROWS_AS(gpu_for_local_rank(0, 0), RuntimeError);
}

#ifdef PICOTRAIN_WITH_CUDA
// The loader runs once per process: this is the only test in this executable that loads NCCL.
TEST_CASE("a missing NCCL library is one line naming the path, the variable and what to install", "[comm][nccl]") {
  const std::string path = "/nonexistent/picotrain-test/libnccl.so.2";
  ::setenv(nccl::kLibraryEnv, path.c_str(), 1);
  CHECK(nccl::try_load() == nullptr);
  const std::string& msg = nccl::load_error();
  CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains("PICOTRAIN_NCCL_LIB") &&
                      Catch::Contains("nvidia-nccl-cu12") && Catch::Contains("site-packages/nvidia/nccl/lib"));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK_THROWS_WITH(nccl::api(), msg);
  const NcclProbe probe = probe_nccl();
  CHECK_FALSE(probe.loaded);
  CHECK(probe.detail == msg);
}

TEST_CASE("NCCL version codes read as major.minor.patch", "[comm][nccl]") {
  CHECK(nccl::version_string(22105) == "2.21.5");
  CHECK(nccl::version_string(2804) == "2.8.4");  // the old encoding, up to 2.8
  CHECK(nccl::version_string(0) == "unknown");
}
#endif

// The world communicator carries coordination's host vectors (checkpoint agreements, the hosts'
// names). In a world of one it is a LocalComm that copies host memory itself: the first GPU run
// found every one-GPU `picotrain train` failing at start-up, because the world's LocalComm
// copied those vectors with the CUDA backend's device-to-device copy.
TEST_CASE("a world of one moves host vectors without the backend's device copies", "[comm]") {
  const std::unique_ptr<LocalComm> world = LocalComm::host(0);
  CHECK(world->size() == 1);
  CHECK(all_gather_strings(*world, "node-a") == std::vector<std::string>{"node-a"});
  CHECK(broadcast_string(*world, "a checkpoint path", 0) == "a checkpoint path");
  std::vector<int32_t> mine = {7, -3, 11}, all(3, 0);
  world->all_gather(Tensor{mine.data(), mine.size(), DType::i32}, Tensor{all.data(), all.size(), DType::i32});
  CHECK(all == mine);
  CHECK_THROWS_WITH(world->all_gather(Tensor{mine.data(), 3, DType::i32}, Tensor{all.data(), 2, DType::i32}),
                    Catch::Contains("same size"));
}
