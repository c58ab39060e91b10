// Checkpointer: what the trainer calls. It decides when to save (checkpoint.every_steps), writes
// the training state (fp32 master weights, Adam m and v, step, token cursor) with the commit
// protocol, prunes old checkpoints (keep_latest, keep_every), and on start resolves
// checkpoint.resume (none | auto | PATH) and restores that state bit-exactly.
//
// State tensors are named "<state>/<parameter>" (state: master, adam_m, adam_v) and written to
// one file per state and rank, "<state>_r00000.bin", each parameter as the chunk(s) this rank
// holds (its ShardLayout pieces: everything on one rank, a flat slice under ZeRO), always in
// the parameter's GLOBAL coordinates: under tensor parallel a piece of a rank's local tensor
// becomes the global runs it holds (tp_chunks.h), so any tp reads any other tp's checkpoint.
//
// Pipeline parallel: each stage's ranks hold (and save and restore) only that stage's
// parameters, the table given to the constructor; the tensors of all stages together make one
// checkpoint of the whole model, which resumes under any other pp (set_not_saved).
//
// State besides the parameters (set_extra_state: delayed FP8 scaling's amax histories) is a
// few named f32 tensors, each whole in one chunk of "extra_r00000.bin", written by one rank and
// read by every rank that holds it; a checkpoint without them restores none.
//
// Several ranks (set_ranks): every rank that holds a shard no other rank writes (the first
// replica under HSDP, dp rank 0 under ZeRO-0) writes its own files into one temporary directory
// and rank 0 commits; every rank restores the pieces of ITS layout from whatever chunks the
// writer's layout produced, so a run may resume under another dp or ZeRO stage. Ranks agree on
// every outcome (which checkpoint, success or failure), so none is left waiting.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/ckpt/manifest.h"
#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace pt::ckpt {

class CheckpointWriter;

// State besides the parameters' that a checkpoint keeps: small f32 tensors with global names
// (delayed FP8 scaling's amax histories), each saved whole by one rank and read back by every
// rank that holds it, whatever the layout.
class ExtraState {
 public:
  virtual ~ExtraState() = default;
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;  // the shape's product of them
  };
  // What to save now (nothing, e.g., before there is any).
  virtual std::vector<Entry> save_entries() = 0;
  // The names restore() looks for.
  virtual std::vector<std::string> names() const = 0;
  // The checkpoint's entries of names(), in that order: nullopt where it has none.
  virtual void restore(const std::vector<std::optional<Entry>>& found) = 0;
};

struct TrainState {
  int step = 0;          // optimizer steps done
  uint64_t cursor = 0;   // global token cursor of the next step
  HealthRecord health;   // skipped steps, rollbacks, the spike window (manifest.h)
};

class Checkpointer {
 public:
  Checkpointer(const RunConfig& cfg, const ParamTable& table);
  // Multi-rank runs: `world` holds every rank (host-memory Comm; not owned); `writes_shard`:
  // this rank writes its shard (false when another rank holds and writes the same one).
  // Without a call the checkpointer acts for a world of one.
  void set_ranks(Comm* world, bool writes_shard);
  // Pipeline parallel: `table` (the constructor's) is this rank's stage's parameters, which it
  // saves and restores; a parameter marked here (indexed like table.specs()) is restored but
  // left to another rank to save: the LM head's copy of the tied wte, saved by the first stage,
  // and under tensor parallel the replicated parameters on tp ranks > 0, saved by tp rank 0.
  // Replaces earlier marks (a rank with both kinds passes their union).
  void set_not_saved(std::vector<bool> not_saved);
  // Expert parallel: this rank's routed experts live in a store of their own (`store`;
  // core/model/expert_split.h), saved and restored with the main one under the same global
  // names. `writes`: this rank writes that store's shard (the first of the ranks holding the same
  // one); `not_saved` as above, indexed like store.table().specs(). Not owned.
  void set_experts(ParamStore& store, bool writes, std::vector<bool> not_saved);
  // State besides the parameters (not owned; nullptr: none), restored by every rank; `writes`:
  // this rank saves it (the first of the ranks holding the same).
  void set_extra_state(ExtraState* state, bool writes);

  // Resolves checkpoint.resume. none: nullopt (and a ConfigError when checkpoint.dir already
  // holds committed checkpoints, which a fresh run would prune). auto: the newest committed
  // checkpoint that verifies, warning about and skipping corrupt ones; nullopt when there is
  // none. PATH: that checkpoint (a step directory, or a checkpoint directory's latest); corrupt
  // is an error. A model-shape mismatch is a ConfigError naming the key. Loads the master
  // weights and Adam moments into `store` (moments zero for a weights-only checkpoint).
  // `train_tokens`: the size of the training set, to warn when it changed.
  std::optional<TrainState> restore(ParamStore& store, Ops& ops, uint64_t train_tokens);

  // A periodic checkpoint is due after `step` (checkpoint.every_steps).
  bool due(int step) const;
  // Writes and commits the checkpoint of `state`, then prunes; returns its directory.
  // Throws RuntimeError naming the path and errno text on a write failure (earlier checkpoints
  // stay as they were), and naming the tensor when the state holds a NaN or an infinity: a
  // checkpoint is never committed with a non-finite value.
  std::string save(const TrainState& state, ParamStore& store, Ops& ops, uint64_t train_tokens);
  // Loads the checkpoint on disk (path_on_disk(): the newest this session saved or resumed
  // from) into `store` again, on every rank: the loss-spike rollback. nullopt when there is none.
  std::optional<TrainState> reload(ParamStore& store, Ops& ops, uint64_t train_tokens);

  // The step whose checkpoint is on disk (saved or resumed from); -1 when none.
  int step_on_disk() const { return step_on_disk_; }
  // That checkpoint's directory (save()'s answer, or the one resumed from); "" when none.
  const std::string& path_on_disk() const { return path_on_disk_; }
  const std::string& resumed_from() const { return resumed_from_; }
  // Warnings printed so far (corrupt checkpoints skipped, failed deletions...).
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  // One store's tensors: the main one (the constructor's table, the store given to save and
  // restore) and under expert parallel the experts'.
  struct Part {
    const ParamTable* table;
    ParamStore* store;
    const std::vector<bool>* not_saved;  // empty: save everything
    bool writes;
  };
  std::vector<Part> parts(ParamStore& main) const;
  void warn(const std::string& msg);
  TrainState load(const std::string& dir, ParamStore& store, Ops& ops, uint64_t train_tokens);
  // load() on every rank; any rank's failure becomes every rank's (so all resume from the same
  // checkpoint): a CorruptCheckpoint when some rank found it corrupt, else the failure itself.
  TrainState load_everywhere(const std::string& dir, ParamStore& store, Ops& ops, uint64_t train_tokens);
  // The commit protocol with several ranks writing (see the file comment); returns step_N's path.
  // `writes`: this rank writes files (some store's shard of it is its to save).
  std::string save_with_ranks(const Manifest& meta, bool writes, const std::function<void(CheckpointWriter&)>& fill);
  void remove_leftovers();
  void prune();
  bool several_ranks() const { return world_ && world_->size() > 1; }

  RunConfig cfg_;
  const ParamTable& table_;
  Comm* world_ = nullptr;
  bool writes_shard_ = true;
  std::vector<bool> not_saved_;  // by spec index; empty: save everything
  ParamStore* expert_store_ = nullptr;  // set_experts
  bool expert_writes_ = false;
  std::vector<bool> expert_not_saved_;
  ExtraState* extra_ = nullptr;  // set_extra_state
  bool extra_writes_ = false;
  int step_on_disk_ = -1;
  std::string path_on_disk_;
  std::string resumed_from_;
  std::vector<std::string> warnings_;
};

// The states saved per parameter, in file order.
inline const std::vector<std::string>& state_names() {
  static const std::vector<std::string> names = {"master", "adam_m", "adam_v"};
  return names;
}

}  // namespace pt::ckpt
