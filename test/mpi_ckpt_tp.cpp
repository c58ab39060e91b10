// Checkpoints under tensor parallel: every rank saves its pieces in GLOBAL coordinates, so a
// checkpoint written under any tp (and ZeRO sharding of the pieces) restores under any other,
// and gather_tensor_parallel joins the pieces into the whole model. Run under mpirun with 2 and
// 4 ranks (test/CMakeLists.txt); a layout is tp ranks x a ZeRO-1 shard group over the world:
// 2 ranks: tp2, and tp1 x 2 shards; 4 ranks: tp4, and tp2 x 2 shards (whose ZeRO pieces cut
// the tp pieces mid-run, so partial runs are saved and restored too).
//
// The state is not trained but set: element g (global index) of parameter k in state s
// (master, adam_m, adam_v) is value(s, k, g), so a restored element is right only if it came
// from exactly its own global place.
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpointer.h"
#include "core/config/run_config.h"
#include "core/dist/mpi_comm.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/model/shard_layout.h"
#include "core/ops/ops.h"
#include "core/train/shard_gather.h"
#include "mpi_test_support.h"
#include "tp_test_model.h"

using namespace pt;
using namespace pt::test;
namespace fs = std::filesystem;

namespace {

constexpr size_t kBucketCap = 3000;  // elements: several ZeRO-1 buckets, cut inside parameters

// Exact in fp32 (multiples of 1/64 below 2^17) and distinct across states, parameters (fewer
// than 64 of them) and elements (fewer than 16384 per parameter).
float value(int state, size_t param, size_t global) {
  return static_cast<float>(state) * 32768.0f + static_cast<float>(param) * 256.0f + static_cast<float>(global) / 64.0f;
}

// A directory every rank sees: rank 0 makes it and says where; removed when all are done.
struct SharedDir {
  fs::path path;
  SharedDir() {
    char buf[512] = {};
    if (whole_world().rank == 0) {
      const fs::path d = fs::temp_directory_path() / ("picotrain_mpi_ckpt_tp_" + std::to_string(::getpid()));
      fs::remove_all(d);
      fs::create_directories(d);
      std::snprintf(buf, sizeof buf, "%s", d.c_str());
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (whole_world().rank == 0) fs::remove_all(path);
  }
  std::string sub(const std::string& name) const { return (path / name).string(); }
};

// The checkpointer's config: only the model, checkpoint.dir and checkpoint.resume matter here.
RunConfig config(const std::string& dir, const std::string& resume) {
  const nlohmann::json j = {
      {"run", {{"name", "tp"}, {"out_dir", dir}, {"seed", 5}}},
      {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 4}, {"vocab_size", 250}, {"pad_vocab_multiple", 64},
                 {"max_seq_len", 16}}},
      {"batch", {{"micro_batch_size", 2}, {"seq_len", 16}, {"global_batch_tokens", 64}}},
      {"schedule", {{"total_steps", 10}}},
      {"data", {{"train", dir + "/unused_*.bin"}}},
      {"checkpoint", {{"dir", dir}, {"resume", resume}}},
  };
  RunConfig cfg = config_from_json(j, {}, 1);
  REQUIRE(cfg.model.padded_vocab == tp_test_model().padded_vocab);
  return cfg;
}

// World rank w is tp rank w % tp of shard rank w / tp.
struct Layout {
  int tp = 1, shards = 1;
};

std::vector<Layout> layouts(int world) {
  return {Layout{world, 1}, world > 2 ? Layout{world / 2, 2} : Layout{1, world}};
}

// One rank's state under a layout: its tp pieces (a local table) sharded by ZeRO-1 (ZeRO-0
// for a shard group of one).
struct RankState {
  Layout layout;
  int tp_rank, shard_rank;
  ParamTable table;
  ParamStore store;
  RankState(const ParamTable& full, Layout l, int world_rank, Ops& ops)
      : layout(l),
        tp_rank(world_rank % l.tp),
        shard_rank(world_rank / l.tp),
        table(tensor_parallel_table(full, l.tp, tp_rank)),
        store(table, ShardLayout(table, l.shards > 1 ? 1 : 0, l.shards, shard_rank, kBucketCap), ops) {}
  RankState(const RankState&) = delete;  // store and its layout point at `table`

  Tensor shard(int state) const {
    return state == 0 ? store.master_shard() : state == 1 ? store.adam_m_shard() : store.adam_v_shard();
  }

  // Sets every state to value(): the master weights whole (load_master), the moments' pieces.
  void fill(Ops& ops) {
    std::vector<float> master(table.total_numel());
    for (size_t k = 0; k < table.specs().size(); k++) {
      const ParamSpec& p = table.specs()[k];
      for (size_t i = 0; i < p.numel; i++) master[p.offset + i] = value(0, k, p.tp.global_index(i));
    }
    store.load_master(master.data());
    for (int s : {1, 2}) {
      const Tensor t = shard(s);
      std::vector<float> host(t.numel, 0.0f);
      for_each_element([&](size_t at, size_t k, size_t g) { host[at] = value(s, k, g); });
      ops.upload(t, host.data(), DType::f32, t.numel);
    }
  }

  // Elements of the three states' shards that differ from value().
  size_t wrong(Ops& ops) const {
    size_t bad = 0;
    for (int s : {0, 1, 2}) {
      const Tensor t = shard(s);
      std::vector<float> host(t.numel);
      ops.download(host.data(), DType::f32, t, t.numel);
      for_each_element([&](size_t at, size_t k, size_t g) { bad += host[at] != value(s, k, g); });
    }
    return bad;
  }

  // f(shard offset, parameter index, global index) for every element of this rank's shard.
  template <class F>
  void for_each_element(F&& f) const {
    for (const ShardPiece& piece : store.layout().my_pieces()) {
      const TpSlice& tp = table.specs()[piece.param].tp;
      for (size_t i = piece.begin; i < piece.end; i++) f(piece.shard_offset + (i - piece.begin), piece.param, tp.global_index(i));
    }
  }
};

// Saves `r` with every rank of `world` writing its pieces; the replicated parameters are saved
// by tp rank 0 only. Returns the checkpoint's path.
std::string save(RankState& r, Comm& world, const std::string& dir, Ops& ops) {
  ckpt::Checkpointer c(config(dir, "none"), r.table);
  c.set_ranks(&world, true);
  if (r.tp_rank > 0) {
    std::vector<bool> replicated;
    for (const ParamSpec& p : r.table.specs()) replicated.push_back(p.tp.whole());
    c.set_not_saved(replicated);
  }
  return c.save(ckpt::TrainState{4, 1000}, r.store, ops, 0);
}

// Restores checkpoint `path` into `r` (with the other ranks of `world` when given).
void restore(RankState& r, Comm* world, const std::string& path, const std::string& dir, Ops& ops) {
  ckpt::Checkpointer c(config(dir, path), r.table);
  if (world) c.set_ranks(world, true);
  const auto st = c.restore(r.store, ops, 0);
  REQUIRE(st);
  CHECK(st->step == 4);
  CHECK(st->cursor == 1000);
}

// Every tensor of the checkpoint is stored exactly once (replicated parameters too); returns
// how many of its chunks are strided.
size_t check_stored_once(const std::string& path) {
  ckpt::CheckpointReader r(path);
  size_t strided = 0;
  for (const ckpt::TensorEntry& t : r.manifest().tensors) {
    uint64_t stored = 0;
    for (const ckpt::Chunk& c : t.chunks) {
      stored += c.numel();
      strided += c.strided();
    }
    INFO(t.name);
    CHECK(stored == t.numel());
  }
  CHECK(r.manifest().tensors.size() == 3 * build_param_table(tp_test_model()).specs().size());
  return strided;
}

}  // namespace

TEST_CASE("tp checkpoints restore under tp=1 and every other layout, and tp=1 ones under tp", "[mpi][ckpt][tp]") {
  const World world = whole_world();
  const auto ops = make_ops(Device::cpu);
  const auto comm = MpiComm::split_world(everyone(world.size));
  const ParamTable full = build_param_table(tp_test_model());
  const SharedDir shared;
  const std::vector<Layout> all = layouts(world.size);

  for (size_t a = 0; a < all.size(); a++) {
    const Layout& saved_by = all[a];
    INFO("saved by tp " << saved_by.tp << " x " << saved_by.shards << " shards");
    std::string path;
    {
      RankState r(full, saved_by, world.rank, *ops);
      r.fill(*ops);
      REQUIRE(r.wrong(*ops) == 0);
      path = save(r, *comm, shared.sub("save_" + std::to_string(a)), *ops);
    }
    if (world.rank == 0) {
      const size_t strided = check_stored_once(path);
      if (saved_by.tp > 1) CHECK(strided > 0);  // the row-parallel matrices
      // (a) the whole model on one rank
      RankState one(full, Layout{}, 0, *ops);
      restore(one, nullptr, path, shared.sub("one_" + std::to_string(a)), *ops);
      CHECK(one.wrong(*ops) == 0);
    }
    // ... and every layout's pieces (the writer's own too) on every rank.
    for (const Layout& into : all) {
      INFO("restored into tp " << into.tp << " x " << into.shards << " shards");
      RankState r(full, into, world.rank, *ops);
      restore(r, comm.get(), path, shared.sub("unused"), *ops);
      CHECK(r.wrong(*ops) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // (b) a tp=1 checkpoint, written by rank 0 alone, into every layout's pieces.
  char path[512] = {};
  if (world.rank == 0) {
    RankState one(full, Layout{}, 0, *ops);
    one.fill(*ops);
    ckpt::Checkpointer c(config(shared.sub("tp1"), "none"), one.table);
    std::snprintf(path, sizeof path, "%s", c.save(ckpt::TrainState{4, 1000}, one.store, *ops, 0).c_str());
    CHECK(check_stored_once(path) == 0);
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  for (const Layout& into : all) {
    INFO("tp=1 checkpoint restored into tp " << into.tp << " x " << into.shards << " shards");
    RankState r(full, into, world.rank, *ops);
    restore(r, comm.get(), path, shared.sub("unused"), *ops);
    CHECK(r.wrong(*ops) == 0);
  }
}

TEST_CASE("gather_tensor_parallel joins every tp rank's pieces into the whole parameters", "[mpi][tp]") {
  const World world = whole_world();
  const auto ops = make_ops(Device::cpu);
  const ParamTable full = build_param_table(tp_test_model());
  for (const Layout& l : layouts(world.size)) {
    INFO("tp " << l.tp << " x " << l.shards << " shards");
    RankState r(full, l, world.rank, *ops);
    r.fill(*ops);
    std::vector<int> tp_group, shard_group;
    for (int k = 0; k < l.tp; k++) tp_group.push_back(r.shard_rank * l.tp + k);
    for (int k = 0; k < l.shards; k++) shard_group.push_back(k * l.tp + r.tp_rank);
    const auto tp = MpiComm::split_world(tp_group);
    const auto shard = MpiComm::split_world(shard_group);
    for (int s : {0, 1}) {
      // This rank's pieces whole (from the ZeRO shards), then the tp ranks' pieces joined.
      const std::vector<float> local = gather_shards(r.store, r.shard(s), *shard, *ops);
      const std::vector<float> whole = gather_tensor_parallel(r.table, local, *tp, *ops);
      REQUIRE(whole.size() == full.total_numel());
      size_t bad = 0;
      for (size_t k = 0; k < full.specs().size(); k++) {
        const ParamSpec& p = full.specs()[k];
        for (size_t g = 0; g < p.numel; g++) bad += whole[p.offset + g] != value(s, k, g);
      }
      CHECK(bad == 0);
      const bool unchanged = whole == local;
      if (l.tp == 1) CHECK(unchanged);
    }
  }
}
