// ZeRO on one rank (a world of one, no MPI needed): the shard layout's arithmetic, the memory
// plan, LocalComm, and that ZeRO 1/2/3 train exactly like ZeRO-0 with exactly ZeRO-0's memory:
// with one shard the shard is the whole model, and no stage keeps a second copy of anything
// (test/mpi_parity.cpp runs the collectives over MPI; test/mpi_zero.cpp checks one shard per
// rank on two ranks, and the memory of two shards).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/dist/local_comm.h"
#include "core/model/decoder_stage.h"
#include "core/model/shard_layout.h"
#include "core/train/grad_sync.h"
#include "core/plan/stage_memory.h"
#include "core/train/memory_plan.h"
#include "core/train/trainer.h"

using namespace pt;
namespace fs = std::filesystem;

namespace {

ModelSection tiny_model() {
  ModelSection m;
  m.n_layers = 2;
  m.d_model = 32;
  m.n_heads = 2;
  m.vocab_size = 250;
  m.pad_vocab_multiple = 16;
  m.padded_vocab = 256;
  m.max_seq_len = 64;
  return m;
}

// Every element of the table lies in exactly one piece of one rank, at the offsets the layout
// says, and nothing else does.
void check_partition(const ParamTable& t, const ShardLayout& l) {
  std::vector<int> owner(t.total_numel(), -1);
  size_t twice = 0, wrong_arena = 0, outside = 0, slot_reused = 0;
  for (int k = 0; k < l.shard_count(); k++) {
    std::vector<bool> slot_used(l.shard_numel());
    for (const ShardPiece& p : l.pieces(k)) {
      const ParamSpec& spec = t.specs()[p.param];
      REQUIRE(p.end <= spec.numel);
      wrong_arena += p.arena_offset != l.arena_offset(spec) + p.begin;
      for (size_t i = p.begin; i < p.end; i++) {
        twice += owner[spec.offset + i] != -1;
        owner[spec.offset + i] = k;
        const size_t slot = p.shard_offset + (i - p.begin);
        if (slot >= l.shard_numel()) {
          outside++;
          continue;
        }
        slot_reused += slot_used[slot];
        slot_used[slot] = true;
      }
    }
  }
  CHECK(twice == 0);
  CHECK(wrong_arena == 0);
  CHECK(outside == 0);
  CHECK(slot_reused == 0);
  CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
}

}  // namespace

TEST_CASE("buckets are whole layers filled from the last layer, padded per shard", "[zero]") {
  const ParamTable t = build_param_table(tiny_model());
  const size_t block = t.get("h.1.ln_1.weight").offset - t.get("h.0.ln_1.weight").offset;
  const size_t lnf = 2 * 32, emb = t.get("h.0.ln_1.weight").offset;

  SECTION("one bucket when everything fits") {
    const ShardLayout l(t, 1, 4, 1, t.total_numel());
    REQUIRE(l.buckets().size() == 1);
    CHECK(l.buckets()[0].padded % 4 == 0);
    CHECK(l.shard_numel() * 4 == l.arena_numel());
    check_partition(t, l);
  }
  SECTION("a cap of two blocks: final norm + last block, the first block, the embeddings") {
    const ShardLayout l(t, 1, 3, 2, block + lnf);
    REQUIRE(l.buckets().size() == 3);
    CHECK(l.buckets()[2].first_layer == 1);
    CHECK(l.buckets()[2].last_layer == 2);
    CHECK(l.buckets()[1].first_layer == 0);
    CHECK(l.buckets()[0].last_layer == -1);
    CHECK(l.buckets()[0].numel() == emb);
    for (const auto& b : l.buckets()) CHECK(b.padded % 3 == 0);
    for (int k = 0; k < 3; k++) check_partition(t, ShardLayout(t, 1, 3, k, block + lnf));
  }
  SECTION("ZeRO-2 and 3: one layer per bucket whatever the cap") {
    for (int stage : {2, 3}) {
      const ShardLayout l(t, stage, 4, 0, t.total_numel());
      CHECK(l.buckets().size() == 4);  // embeddings, 2 blocks, final norm
      CHECK(l.bucket_of_layer(2).numel() == lnf);
      CHECK_FALSE(l.grads_resident());
      CHECK(l.params_resident() == (stage == 2));
      check_partition(t, l);
    }
  }
  SECTION("ZeRO-0 shards nothing: the arena is the table's flat order") {
    const ShardLayout l(t, 0, 4, 3, 1000);
    CHECK(l.shard_count() == 1);
    CHECK(l.arena_numel() == t.total_numel());
    CHECK(l.shard_numel() == t.total_numel());
    for (const auto& p : t.specs()) CHECK(l.arena_offset(p) == p.offset);
    check_partition(t, l);
  }
}

TEST_CASE("the memory plan follows the ZeRO stage", "[zero]") {
  const ModelSection m = tiny_model();
  const ParamTable t = build_param_table(m);
  const size_t N = t.total_numel();
  const auto plan = [&](int stage, int shards) {
    return plan_memory(ShardLayout(t, stage, shards, 0, N), DType::f32, 0);
  };
  const MemoryPlan z0 = plan(0, 4), z1 = plan(1, 4), z2 = plan(2, 4), z3 = plan(3, 4);
  CHECK(z0.params == 4 * N);
  CHECK(z0.master == 0);  // fp32 compute: the params are the master weights
  CHECK(z0.optimizer == 8 * N);
  CHECK(z1.params == 4 * N);
  CHECK(z1.optimizer == 8 * ShardLayout(t, 1, 4, 0, N).shard_numel());
  CHECK(z1.master * 4 >= 4 * N);
  CHECK(z1.master * 4 < 4 * N + 64);  // padding only
  CHECK(z2.grads < z1.grads);
  CHECK(z2.grads_working > 0);
  CHECK(z3.params_working > 0);
  CHECK(z3.params + z3.params_working < z2.params);
  CHECK(z0.total() > z1.total());
  CHECK(z1.total() > z2.total());
  CHECK(z2.total() > z3.total());
  const MemoryPlan bf16 = plan_memory(ShardLayout(t, 0, 1, 0, N), DType::bf16, 0);
  CHECK(bf16.params == 2 * N);
  CHECK(bf16.master == 4 * N);

  SECTION("activations from the shapes equal what the stage allocates") {
    CpuOps ops;
    ParamStore store(t, ops);
    for (auto [B, T] : {std::pair{2, 16}, std::pair{3, 7}}) {
      const DecoderStage stage(m, store, ops, B, T);
      CHECK(decoder_activation_bytes(m, B, T, DType::f32) == stage.activation_bytes());
    }
  }
}

// A shard group of one rank (one GPU, or dp = cp = 1 beside tp or pp) gains nothing from
// sharding: every stage must cost what ZeRO-0 does, in either compute dtype, and say so.
TEST_CASE("with one shard every ZeRO stage plans ZeRO-0's bytes", "[zero][memory]") {
  const ParamTable t = build_param_table(tiny_model());
  const size_t N = t.total_numel();
  for (DType compute : {DType::f32, DType::bf16}) {
    const MemoryPlan z0 = plan_memory(ShardLayout(t, 0, 1, 0, N), compute, 0);
    for (int stage : {1, 2, 3}) {
      INFO("ZeRO-" << stage << ", compute " << dtype_name(compute));
      const MemoryPlan z = plan_memory(ShardLayout(t, stage, 1, 0, 1000), compute, 0);
      CHECK(z.grads == 4 * N);  // one fp32 gradient, no reduced copy of it
      CHECK(z.grads_working == 0);
      CHECK(z.params_working == 0);
      CHECK(z.optimizer == 8 * N);
      CHECK(z.total() == z0.total());
      CHECK_THAT(z.describe(), !Catch::Contains("reduced shard") && !Catch::Contains("per-layer"));
    }
  }
}

TEST_CASE("LocalComm: a group of one", "[zero]") {
  CpuOps ops;
  LocalComm c(7, ops);
  CHECK(c.size() == 1);
  CHECK(c.members() == std::vector<int>{7});
  Tensor a = ops.alloc(4, DType::f32), b = ops.alloc(4, DType::f32);
  for (int i = 0; i < 4; i++) a.f32()[i] = float(i);
  c.reduce_scatter(a, b);
  CHECK(b.f32()[3] == 3.0f);
  c.all_reduce(b);
  CHECK(b.f32()[3] == 3.0f);
  double d = 2.5;
  c.all_reduce(&d, 1);
  CHECK(d == 2.5);
  CHECK_THROWS_WITH(c.send(a, 1), Catch::Contains("no other rank"));
  ops.release(a);
  ops.release(b);
}

namespace {

// A group that reports `size` ranks and records what GradSync asks of it: a reduction started
// or run to completion (moving no data), and where it waits for the started ones.
class RecordingComm final : public Comm {
 public:
  RecordingComm(const std::string& name, int size, Ops& ops, std::vector<std::string>& log)
      : name_(name), size_(size), local_(0, ops), log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return local_.members(); }
  void all_reduce(Tensor) override { note("all_reduce"); }
  void all_reduce(double*, size_t) override { note("all_reduce(host)"); }
  void reduce_scatter(Tensor, Tensor) override { note("reduce_scatter"); }
  void all_gather(Tensor send, Tensor recv) override { local_.all_gather(send, recv); }
  void all_to_all(Tensor send, Tensor recv) override { local_.all_to_all(send, recv); }
  void broadcast(Tensor x, int root) override { local_.broadcast(x, root); }
  void send(Tensor x, int peer) override { local_.send(x, peer); }
  void recv(Tensor x, int peer) override { local_.recv(x, peer); }
  void barrier() override {}
  void start_all_reduce(Tensor) override { note("start_all_reduce"); }
  void start_reduce_scatter(Tensor, Tensor) override { note("start_reduce_scatter"); }
  void wait_started() override { note("wait_started"); }

 private:
  void note(const char* what) { log_.push_back(name_ + "." + what); }
  std::string name_;
  int size_;
  LocalComm local_;
  std::vector<std::string>& log_;
};

}  // namespace

// Overlap needs GradSync to start a final bucket's reduction without waiting for it and to wait
// once, before the optimizer reads the gradient; HSDP's two chained reductions must complete in
// order instead (the second reads the first's output on another communicator). With one shard
// ZeRO-1 reduces like ZeRO-0: in place over dp x cp (then the replicas' group), no
// reduce-scatter of the arena onto itself.
TEST_CASE("GradSync starts each final bucket's reduction and waits for them at the end of the step", "[zero]") {
  const ParamTable t = build_param_table(tiny_model());
  const size_t block = t.get("h.1.ln_1.weight").offset - t.get("h.0.ln_1.weight").offset;
  CpuOps ops;
  struct Case {
    int zero, shards, replicas;
    std::string started, blocking;
  };
  // shards: the shard group's size (ZeRO-0's layout has one shard whatever it is).
  for (const Case& c : {Case{0, 2, 1, "dp_cp.start_all_reduce", ""},
                        Case{1, 1, 1, "dp_cp.start_all_reduce", ""},
                        Case{1, 1, 2, "dp_cp.start_all_reduce", ""},
                        Case{1, 2, 1, "shard.start_reduce_scatter", ""},
                        Case{1, 2, 2, "", "shard.reduce_scatter"}}) {
    INFO("zero_stage " << c.zero << ", " << c.shards << " shards, " << c.replicas << " replicas");
    const ShardLayout layout(t, c.zero, c.shards, 0, block);  // a bucket per layer
    REQUIRE(layout.buckets().size() >= 3);
    ParamStore store(t, layout, ops);
    std::vector<std::string> log;
    RecordingComm dp_cp("dp_cp", c.shards * c.replicas, ops, log), shard("shard", c.shards, ops, log),
        replicate("replicate", c.replicas, ops, log);
    GradSync sync(store, ops, dp_cp, shard, replicate);
    sync.start_step();
    // An earlier micro-step of the step only accumulates.
    sync.start_micro_step(false);
    for (int l = layout.last_layer(); l >= layout.first_layer(); l--) sync.grads_ready(l);
    CHECK(log.empty());
    sync.start_micro_step(true);
    for (int l = layout.last_layer(); l >= layout.first_layer(); l--) sync.grads_ready(l);
    const auto count = [&](const std::string& what) { return std::count(log.begin(), log.end(), what); };
    const auto buckets = static_cast<long>(layout.buckets().size());
    if (!c.started.empty()) {
      CHECK(count(c.started) == buckets);
      CHECK(log.size() == layout.buckets().size());  // nothing waited for inside backward
    } else {
      CHECK(count(c.blocking) == buckets);
      CHECK(count("replicate.all_reduce") == buckets);
    }
    sync.finish_step();
    if (!c.started.empty()) {
      REQUIRE(!log.empty());
      CHECK(log.back() == c.started.substr(0, c.started.find('.')) + ".wait_started");
    }
  }
}

namespace {

struct TempData {
  fs::path dir;
  TempData() {
    dir = fs::temp_directory_path() / ("picotrain_test_zero_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::mt19937 rng(11);
    std::vector<uint16_t> tokens(12000);
    for (auto& t : tokens) t = rng() % 250;
    write_shard((dir / "z_train_000000.bin").string(), tokens);
    write_shard((dir / "z_val_000000.bin").string(), tokens);
  }
  ~TempData() { fs::remove_all(dir); }
  RunConfig config(int zero_stage, double bucket_mb, const std::vector<std::string>& sets = {}) const {
    nlohmann::json j = {
        {"run", {{"name", "z"}, {"out_dir", (dir / "run").string()}, {"seed", 3}}},
        {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}, {"vocab_size", 250}, {"pad_vocab_multiple", 16}, {"max_seq_len", 64}}},
        {"parallel", {{"zero_stage", zero_stage}, {"grad_bucket_mb", bucket_mb}}},
        {"batch", {{"micro_batch_size", 2}, {"seq_len", 16}, {"global_batch_tokens", 2 * 16 * 3}}},
        {"optim", {{"lr", 3e-3}, {"grad_clip", 0.5}}},
        {"schedule", {{"total_steps", 4}, {"warmup_steps", 0}}},
        {"data", {{"train", (dir / "z_train_*.bin").string()}, {"val", (dir / "z_val_*.bin").string()}, {"val_tokens", 96}}},
    };
    return config_from_json(j, sets, 1);
  }
};

}  // namespace

// One shard: every stage holds the same buffers as ZeRO-0 (the shard is the whole arena) and
// runs the same kernels on them in the same order, so the bits are the same, not just close.
TEST_CASE("ZeRO 1, 2 and 3 on one rank train exactly like ZeRO-0", "[zero]") {
  TempData data;
  World world;
  CpuOps ref_ops;
  Trainer ref(data.config(0, 25), world, ref_ops);
  std::vector<StepResult> want;
  for (int s = 0; s < 4; s++) want.push_back(ref.step());
  const std::vector<float> want_w = ref.gather_master();
  const double want_val = ref.evaluate();

  for (int stage : {1, 2, 3}) {
    // A bucket cap below one block's size puts every layer in its own bucket under ZeRO-1 too.
    for (double bucket_mb : {25.0, 0.01}) {
      INFO("ZeRO-" << stage << ", buckets of " << bucket_mb << " MiB");
      CpuOps ops;
      Trainer t(data.config(stage, bucket_mb), world, ops);
      for (int s = 0; s < 4; s++) {
        const StepResult r = t.step();
        INFO("step " << s);
        CHECK(r.loss == want[s].loss);
        CHECK(r.grad_norm == want[s].grad_norm);
      }
      CHECK(t.gather_master() == want_w);
      CHECK(t.evaluate() == want_val);
    }
  }
}

// What the trainer prints next to the plan (`memory | step 1: allocated X, peak Y (plan Z)`),
// checked byte for byte on the CPU backend, whose memory_use() counts exactly the tensors of
// Ops::alloc. On one rank every stage has one shard and holds ZeRO-0's buffers for the whole
// run: the parameters (also the master weights, fp32), ONE fp32 gradient, Adam's two moments and
// the activations. After a step the live bytes are the plan's total, and so is the peak (the
// step allocates nothing that it frees again). test/mpi_zero.cpp checks two shards, where
// ZeRO-2/3 allocate and free working buffers within the step.
TEST_CASE("the memory plan is what a rank really allocates (one rank, fp32)", "[zero][memory]") {
  TempData data;
  World world;
  for (const char* recompute : {"none", "selective", "full"})
    for (double bucket_mb : {25.0, 0.01})
      for (int stage : {0, 1, 2, 3}) {
        INFO("ZeRO-" << stage << ", recompute " << recompute << ", buckets of " << bucket_mb << " MiB");
        const RunConfig cfg = data.config(stage, bucket_mb, {std::string("recompute.mode=") + recompute});
        const ParamTable table = build_param_table(cfg.model);
        const MemoryPlan plan = plan_stage_memory(cfg, table, DType::f32).at(0).plan;
        const size_t psi = table.total_numel();
        CpuOps ops;
        {
          Trainer t(cfg, world, ops);
          t.step();
          const MemoryUse use = ops.memory_use();
          CHECK(use.device_total == 0);  // the CPU backend has no device figures
          CHECK(use.live == (4 + 4 + 8) * psi + plan.activations);
          CHECK(use.live == plan.total());
          CHECK(use.peak == plan.total());
          ops.reset_peak_memory();
          CHECK(ops.memory_use().peak == use.live);
        }
        CHECK(ops.memory_use().live == 0);  // the trainer released everything it allocated
      }
}
