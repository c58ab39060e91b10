// Shared by the checkpoint tests (test_ckpt_*.cpp, test_hf_*.cpp, test_run_guard.cpp,
// gpu_resume.cpp): a temporary run directory with a shard of random tokens, a tiny GPT-2 config
// around it, the experts of the tiny models with experts, a few trained steps saved, readers of
// a trainer's and a checkpoint's state and of a file's bytes, and the straight-vs-resumed runs
// with their bit-exact comparison on any backend.
#pragma once
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/ckpt/checkpoint_reader.h"
#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
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

// `sets` and then `more`: a config's settings with some added.
inline std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// The experts of the tests' models with experts (on a Llama): 4 of width 24 in every block, 2
// per token, and a balancing loss's weight that is not the default.
inline const std::vector<std::string> kTinyMoe = {"moe.n_experts=4", "moe.top_k=2", "moe.expert_hidden=24",
                                                  "moe.aux_loss_coef=0.02"};

// A model read back (from a manifest, a config.json) has kTinyMoe's experts, every block sparse
// and none shared.
inline void check_tiny_moe(const MoeSection& e) {
  CHECK(e.n_experts == 4);
  CHECK(e.top_k == 2);
  CHECK(e.expert_hidden == 24);
  CHECK(e.every == 1);
  CHECK(e.n_shared_experts == 0);
  CHECK(e.aux_loss_coef == 0.02);
}

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

// `steps` steps of `cfg` on the CPU backend, then a checkpoint in its checkpoint.dir: weights
// that are not the initial ones, for the export and import tests. Returns the master weights.
inline std::vector<float> train_and_save(const RunConfig& cfg, int steps) {
  CpuOps ops;
  const World world;
  Trainer t(cfg, world, ops);
  for (int i = 0; i < steps; i++) t.step();
  t.save_checkpoint();
  return master_weights(t);
}

// The master weights of a checkpoint (a step directory or a checkpoint directory), table order.
inline std::vector<float> checkpoint_weights(const std::string& dir, const ParamTable& table) {
  ckpt::CheckpointReader r(ckpt::resolve_checkpoint_path(dir, "test"));
  std::vector<float> w(table.total_numel());
  for (const auto& p : table.specs()) r.read_all("master/" + p.name, p.numel, w.data() + p.offset);
  return w;
}

inline std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Byte equality of two states (CHECK(same_bytes(a, b)) rather than CHECK(a == b): a failure
// should not print thousands of floats).
inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- resume: straight through vs. checkpoint + resume -------------------------------------------
// A fresh backend for each Trainer (CpuOps, or CudaOps of one compute dtype): the resumed run
// shares nothing with the run that saved but the checkpoint on disk.
using OpsFactory = std::function<std::unique_ptr<Ops>()>;

struct ResumeRuns {
  int at = 0, total = 0;
  std::vector<StepResult> straight, split;  // steps 1..total of each (split: 1..at before the save)
  std::vector<float> straight_state, resumed_state;  // full_state() after `total` steps
  uint64_t straight_cursor = 0, resumed_cursor = 0;
  std::string saved;               // save_checkpoint()'s answer after `at` steps
  int resumed_steps_done = -1;     // the resumed trainer's steps_done() before it steps
  std::string resumed_from;        // its checkpointer().resumed_from()
};

// Run A: `total` steps straight (run directory "straight"). Run B: `at` steps, save_checkpoint,
// destroy the trainer and its backend; then a new trainer on a new backend with
// checkpoint.resume=auto (run directory "run": B's checkpoint stays there, fx.step_dir(at)) steps
// on to `total`. `sets` go to every run's config (e.g. the compute dtype); `prepare` (optional)
// is called on each trainer before it steps (e.g. to inject faults).
inline ResumeRuns run_straight_and_resumed(const CkptFixture& fx, const OpsFactory& make_ops, int at, int total,
                                           const std::vector<std::string>& sets = {},
                                           const std::function<void(Trainer&)>& prepare = {}) {
  const World world;
  ResumeRuns r;
  r.at = at;
  r.total = total;
  {
    const std::unique_ptr<Ops> ops = make_ops();
    Trainer a(fx.config(sets, "straight"), world, *ops);
    if (prepare) prepare(a);
    for (int i = 0; i < total; i++) r.straight.push_back(a.step());
    r.straight_state = full_state(a, *ops);
    r.straight_cursor = a.cursor();
  }
  {
    const std::unique_ptr<Ops> ops = make_ops();
    Trainer b(fx.config(sets), world, *ops);
    if (prepare) prepare(b);
    for (int i = 0; i < at; i++) r.split.push_back(b.step());
    r.saved = b.save_checkpoint();
  }  // the first process is gone: only the checkpoint carries the state over
  std::vector<std::string> resume_sets = sets;
  resume_sets.push_back("checkpoint.resume=auto");
  const std::unique_ptr<Ops> ops = make_ops();
  Trainer c(fx.config(resume_sets), world, *ops);
  r.resumed_steps_done = c.steps_done();
  r.resumed_from = c.checkpointer().resumed_from();
  if (r.resumed_steps_done != at) return r;  // check_bit_exact_resume reports it
  if (prepare) prepare(c);
  for (int i = at; i < total; i++) r.split.push_back(c.step());
  r.resumed_state = full_state(c, *ops);
  r.resumed_cursor = c.cursor();
  return r;
}

inline uint64_t double_bits(double x) { return std::bit_cast<uint64_t>(x); }

// Every step's loss, gradient norm and learning rate (the schedule continues from `at`), the
// final data cursor and the final master weights and Adam moments, bit for bit.
inline void check_bit_exact_resume(const ResumeRuns& r, const CkptFixture& fx) {
  CHECK(r.saved == fx.step_dir(r.at));
  REQUIRE(r.resumed_steps_done == r.at);
  CHECK(r.resumed_from == fx.step_dir(r.at));
  REQUIRE(r.split.size() == r.straight.size());
  for (size_t i = 0; i < r.straight.size(); i++) {
    INFO("step " << i + 1 << ": loss " << r.split[i].loss << " vs " << r.straight[i].loss << ", grad norm "
                 << r.split[i].grad_norm << " vs " << r.straight[i].grad_norm);
    CHECK(double_bits(r.split[i].loss) == double_bits(r.straight[i].loss));
    CHECK(double_bits(r.split[i].grad_norm) == double_bits(r.straight[i].grad_norm));
    CHECK(double_bits(r.split[i].lr) == double_bits(r.straight[i].lr));
  }
  CHECK(r.resumed_cursor == r.straight_cursor);
  REQUIRE(r.resumed_state.size() == r.straight_state.size());
  CHECK(same_bytes(r.resumed_state, r.straight_state));
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
