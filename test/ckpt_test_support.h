// Shared by the checkpoint tests (test_ckpt_*.cpp): a temporary run directory with a shard of
// random tokens, a tiny GPT-2 config around it, and readers of a trainer's state.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/data/shard.h"
#include "core/train/trainer.h"

namespace pt::test {

namespace fs = std::filesystem;

class CkptFixture {
 public:
  // `tag` keeps concurrently running test executables apart.
  explicit CkptFixture(const std::string& tag, int vocab = 256) : vocab_(vocab) {
    dir = fs::temp_directory_path() / ("picotrain_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::mt19937 rng(11);
    std::vector<uint16_t> tokens(30000);
    for (auto& t : tokens) t = static_cast<uint16_t>(rng() % vocab);
    write_shard((dir / "d_train_000000.bin").string(), tokens);
  }
  ~CkptFixture() { fs::remove_all(dir); }
  CkptFixture(const CkptFixture&) = delete;
  CkptFixture& operator=(const CkptFixture&) = delete;

  // 2 layers, d_model 32, 2 micro-batches of 2 x 16 tokens per step, 20 steps with warmup and
  // cosine decay (so the schedule position matters), checkpoints in <dir>/<run>/checkpoints.
  nlohmann::json json(const std::string& run = "run") const {
    return {
        {"run", {{"name", "t"}, {"out_dir", (dir / run).string()}, {"seed", 7}}},
        {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}, {"vocab_size", vocab_}, {"max_seq_len", 64}}},
        {"batch", {{"micro_batch_size", 2}, {"seq_len", 16}, {"global_batch_tokens", 64}}},
        {"optim", {{"lr", 1e-3}}},
        {"schedule", {{"total_steps", 20}, {"warmup_steps", 3}, {"min_lr_ratio", 0.1}}},
        {"data", {{"train", (dir / "d_train_*.bin").string()}}},
        {"logging", {{"peak_tflops", 1.0}}},
    };
  }
  RunConfig config(const std::vector<std::string>& sets = {}, const std::string& run = "run") const {
    return config_from_json(json(run), sets, 1);
  }
  std::string ckpt_dir(const std::string& run = "run") const { return (dir / run / "checkpoints").string(); }
  std::string step_dir(int step, const std::string& run = "run") const {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step);
    return (fs::path(ckpt_dir(run)) / name).string();
  }

  fs::path dir;

 private:
  int vocab_;
};

inline std::vector<float> master_weights(Trainer& t) {
  std::vector<float> w(t.params().table().total_numel());
  t.params().save_master(w.data());
  return w;
}

// The master weights and both Adam moments, back to back, as raw bytes for a byte compare.
inline std::vector<float> full_state(Trainer& t, Ops& ops) {
  std::vector<float> out = master_weights(t);
  for (Tensor s : {t.params().adam_m_shard(), t.params().adam_v_shard()}) {
    std::vector<float> host(s.numel);
    ops.download(host.data(), DType::f32, s, s.numel);
    out.insert(out.end(), host.begin(), host.end());
  }
  return out;
}

// Byte equality of two states (CHECK(same_bytes(a, b)) rather than CHECK(a == b): a failure
// should not print thousands of floats).
inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace pt::test
