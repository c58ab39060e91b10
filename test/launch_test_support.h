// A tiny training run for tests that launch the picotrain binary under mpirun (mpi_launch, the
// cluster tests): a temporary directory with random tokens and a config of a 2-layer model that
// trains in a fraction of a second per step, what its metrics.jsonl says, and the pids of its ranks.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/shard.h"

namespace pt::test {

struct TempRun {
  std::filesystem::path dir;
  // `tag` names the directory (picotrain_<tag>_<pid> in the temporary directory).
  explicit TempRun(const std::string& tag = "mpi_launch") {
    namespace fs = std::filesystem;
    dir = fs::temp_directory_path() / ("picotrain_" + tag + "_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::mt19937 rng(3);
    std::vector<uint16_t> tokens(8000);
    for (auto& t : tokens) t = rng() % 256;
    pt::write_shard((dir / "l_train_000000.bin").string(), tokens);
    std::ofstream(dir / "c.json") << R"({
      "run": {"name": "launch", "out_dir": ")" << (dir / "run").string() << R"("},
      "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "vocab_size": 256, "max_seq_len": 64},
      "batch": {"micro_batch_size": 2, "seq_len": 16},
      "schedule": {"total_steps": 3},
      "data": {"train": ")" << (dir / "l_train_*.bin").string() << R"("},
      "logging": {"peak_tflops": 1}
    })";
  }
  ~TempRun() { std::filesystem::remove_all(dir); }
  TempRun(const TempRun&) = delete;
  TempRun& operator=(const TempRun&) = delete;
  std::string train(const std::string& sets) const { return "train --config " + (dir / "c.json").string() + " " + sets; }
};

// step -> (loss, grad_norm) from a metrics.jsonl.
inline std::map<int, std::pair<double, double>> metrics(const std::filesystem::path& file) {
  std::map<int, std::pair<double, double>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out[j["step"].get<int>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
  }
  return out;
}

// The pids of the picotrain processes (argv[0] is the binary, so not mpirun) whose command line
// mentions `marker`.
inline std::vector<pid_t> picotrain_ranks(const std::string& marker) {
  namespace fs = std::filesystem;
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
    if (argv0 == PICOTRAIN_BIN && cmdline.find(marker) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

}  // namespace pt::test
