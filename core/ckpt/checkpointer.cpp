#include "core/ckpt/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/checkpoint_writer.h"
#include "core/ckpt/durable_io.h"
#include "core/ckpt/tp_chunks.h"
#include "core/dist/coordination.h"
#include "core/train/lr_schedule.h"
#include "core/common/console.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

namespace {

// This rank's shard of one state. What a rank holds is described by its ShardLayout pieces
// (each a range of one parameter at some offset of the shard): one rank under ZeRO-0 holds
// every parameter whole, a ZeRO rank a flat slice. Saving writes exactly the pieces; loading
// reads the pieces of the CURRENT layout from whatever chunks the writer's layout produced.
// Under tensor parallel a parameter is this rank's local piece and a ShardLayout range is a
// range of that piece: ParamSpec::tp maps it to the global elements the checkpoint stores.
Tensor shard_of(const std::string& state, const ParamStore& store) {
  if (state == "master") return store.master_shard();
  return state == "adam_m" ? store.adam_m_shard() : store.adam_v_shard();
}

// The data file of one state written by one rank: the rank in the name keeps ranks from ever
// writing the same file.
std::string state_file(const std::string& state, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s_r%05d.bin", state.c_str(), rank);
  return buf;
}

// The model-shape keys already agree; a tensor of another shape means a damaged manifest.
void check_shape(const CheckpointReader& r, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorEntry* t = r.manifest().find(name);
  if (!t) throw CorruptCheckpoint(r.dir() + "/" + kManifestFile + " has no tensor " + name);
  if (t->shape != shape)
    throw CorruptCheckpoint(r.dir() + "/" + kManifestFile + ": tensor " + name + " has shape " +
                            nlohmann::json(t->shape).dump() + ", the model's is " + nlohmann::json(shape).dump());
}

// A checkpoint is never committed with a NaN or an infinity in it: resuming it could only train
// on garbage. The save fails (on every rank, through the writers' agreement) and the checkpoints
// already on disk stay. `begin`: the local element `data` starts at.
void check_finite(const std::string& tensor, size_t begin, const float* data, size_t n, int step) {
  for (size_t i = 0; i < n; i++)
    if (!std::isfinite(data[i]))
      throw RuntimeError("the training state of step " + std::to_string(step) + " holds a non-finite value (" +
                         std::to_string(data[i]) + " at element " + std::to_string(begin + i) + " of this rank's " +
                         tensor + "): not saved, so that no checkpoint resumes into garbage; the checkpoints "
                         "already on disk are kept");
}

// The newest committed step whose checkpoint says every step since the one before it was
// finite (HealthRecord::skipped_since_save == 0); -1 when none does. Its manifest is read;
// one that cannot be is not counted as clean.
int newest_clean_step(const std::string& dir, const std::vector<int>& committed) {
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    try {
      if (CheckpointReader((fs::path(dir) / step_dir_name(*it)).string()).manifest().health.skipped_since_save == 0)
        return *it;
    } catch (const RuntimeError&) {
    }
  }
  return -1;
}

}  // namespace

Checkpointer::Checkpointer(const RunConfig& cfg, const ParamTable& table) : cfg_(cfg), table_(table) {}

void Checkpointer::set_not_saved(std::vector<bool> not_saved) {
  check(not_saved.empty() || not_saved.size() == table_.specs().size(),
        "Checkpointer::set_not_saved: " + std::to_string(not_saved.size()) + " flags for " +
            std::to_string(table_.specs().size()) + " parameters");
  not_saved_ = std::move(not_saved);
}

void Checkpointer::set_experts(ParamStore& store, bool writes, std::vector<bool> not_saved) {
  const size_t n = store.table().specs().size();
  check(not_saved.empty() || not_saved.size() == n, "Checkpointer::set_experts: " + std::to_string(not_saved.size()) +
                                                        " flags for " + std::to_string(n) + " parameters");
  expert_store_ = &store;
  expert_writes_ = writes;
  expert_not_saved_ = std::move(not_saved);
}

std::vector<Checkpointer::Part> Checkpointer::parts(ParamStore& main) const {
  std::vector<Part> out = {{&table_, &main, &not_saved_, writes_shard_}};
  if (expert_store_) out.push_back({&expert_store_->table(), expert_store_, &expert_not_saved_, expert_writes_});
  return out;
}

void Checkpointer::set_extra_state(ExtraState* state, bool writes) {
  extra_ = state;
  extra_writes_ = state && writes;
}

void Checkpointer::set_ranks(Comm* world, bool writes_shard) {
  world_ = world;
  writes_shard_ = writes_shard;
}

void Checkpointer::warn(const std::string& msg) {
  // Every rank sees the same directory and makes the same decisions: rank 0 speaks for them.
  if (!world_ || world_->rank() == 0) print_warning(msg);
  warnings_.push_back(msg);
}

bool Checkpointer::due(int step) const {
  const int every = cfg_.checkpoint.every_steps;
  return every > 0 && step > 0 && step % every == 0;
}

std::optional<TrainState> Checkpointer::restore(ParamStore& store, Ops& ops, uint64_t train_tokens) {
  const auto& c = cfg_.checkpoint;
  if (c.resume == "none") {
    const DirScan s = scan_checkpoint_dir(c.dir);
    if (!s.committed.empty())
      throw ConfigError("checkpoint.resume=\"none\" but checkpoint.dir=" + c.dir +
                        " already holds checkpoints (newest " + step_dir_name(s.committed.back()) +
                        "), which a fresh run would prune: set checkpoint.resume=auto to continue that run, or "
                        "choose another checkpoint.dir (or remove that one) to start over");
    return std::nullopt;
  }

  const bool automatic = c.resume == "auto";
  std::vector<std::string> candidates;  // newest first
  if (automatic) {
    const DirScan s = scan_checkpoint_dir(c.dir);
    if (!s.latest_problem.empty())
      warn("the checkpoint pointer is damaged (" + s.latest_problem + "); considering every complete checkpoint");
    for (auto it = s.committed.rbegin(); it != s.committed.rend(); ++it)
      candidates.push_back((fs::path(c.dir) / step_dir_name(*it)).string());
    if (candidates.empty()) return std::nullopt;
  } else {
    candidates.push_back(resolve_checkpoint_path(c.resume, "checkpoint.resume=" + c.resume));
  }

  for (size_t i = 0; i < candidates.size(); i++) {
    try {
      const TrainState st = load_everywhere(candidates[i], store, ops, train_tokens);
      step_on_disk_ = st.step;
      resumed_from_ = path_on_disk_ = candidates[i];
      return st;
    } catch (const CorruptCheckpoint& e) {
      if (!automatic) throw CorruptCheckpoint("checkpoint.resume=" + c.resume + ": " + e.what());
      warn("skipping checkpoint " + candidates[i] + ": " + e.what() +
           (i + 1 < candidates.size() ? "; falling back to " + candidates[i + 1] : ""));
    }
  }
  throw RuntimeError("checkpoint.resume=auto: none of the " + std::to_string(candidates.size()) +
                     " checkpoint(s) in " + c.dir +
                     " is usable (see the warnings above); move them away to start over, or set "
                     "checkpoint.resume to a copy you trust");
}

std::optional<TrainState> Checkpointer::reload(ParamStore& store, Ops& ops, uint64_t train_tokens) {
  if (path_on_disk_.empty()) return std::nullopt;
  return load_everywhere(path_on_disk_, store, ops, train_tokens);
}

TrainState Checkpointer::load_everywhere(const std::string& dir, ParamStore& store, Ops& ops, uint64_t train_tokens) {
  if (!several_ranks()) return load(dir, store, ops, train_tokens);
  TrainState st;
  std::exception_ptr err;
  bool corrupt = false;
  try {
    st = load(dir, store, ops, train_tokens);
  } catch (const CorruptCheckpoint&) {
    err = std::current_exception();
    corrupt = true;
  } catch (...) {
    err = std::current_exception();
  }
  // Any other failure (a model mismatch, an I/O error) ends the resume on every rank; a corrupt
  // chunk seen by some rank makes the checkpoint corrupt for all, so `auto` falls back together.
  agree(*world_, corrupt ? nullptr : err, "reading checkpoint " + dir);
  const int corrupt_rank = first_rank_with(*world_, corrupt);
  if (corrupt) std::rethrow_exception(err);
  if (corrupt_rank >= 0)
    throw CorruptCheckpoint(dir + ": rank " + std::to_string(world_->members()[corrupt_rank]) +
                            " found it corrupt (see its error)");
  return st;
}

TrainState Checkpointer::load(const std::string& dir, ParamStore& store, Ops& ops, uint64_t train_tokens) {
  CheckpointReader r(dir);
  const Manifest& m = r.manifest();
  // A step directory holds its own step; anything else is a copy or a mix-up. (A checkpoint
  // copied under another kind of name, e.g. best/, is fine.)
  if (const auto named = parse_step_dir_name(fs::path(dir).filename().string()); named && *named != m.step)
    throw CorruptCheckpoint(dir + "/" + kManifestFile + " says step " + std::to_string(m.step) +
                            ", not the step its directory is named after");
  check_model_shape(m, cfg_.model, dir);

  // State by state into each store. A checksum failure half-way leaves the stores partly
  // overwritten, which is harmless: the caller loads another checkpoint or gives up.
  // A weights-only checkpoint (imported from llm.c) starts the optimizer from zero moments.
  const bool has_moments = r.has("adam_m/" + table_.specs().front().name);
  for (const Part& part : parts(store)) {
    const auto& specs = part.table->specs();
    {
      // Master weights whole (load_master gives the resident params and the shard their parts).
      std::vector<float> host(part.table->total_numel());
      for (const auto& p : specs) {
        check_shape(r, "master/" + p.name, p.global_shape);
        read_local(r, "master/" + p.name, p.tp, 0, p.numel, host.data() + p.offset);
      }
      part.store->load_master(host.data());
    }
    for (const char* state : {"adam_m", "adam_v"}) {
      const Tensor shard = shard_of(state, *part.store);
      std::vector<float> host(shard.numel, 0.0f);  // shard padding stays zero
      if (has_moments) {
        for (const auto& p : specs) check_shape(r, std::string(state) + "/" + p.name, p.global_shape);
        for (const auto& piece : part.store->layout().my_pieces()) {
          const ParamSpec& p = specs[piece.param];
          read_local(r, std::string(state) + "/" + p.name, p.tp, piece.begin, piece.end,
                     host.data() + piece.shard_offset);
        }
      }
      ops.upload(shard, host.data(), DType::f32, shard.numel);
    }
  }

  if (extra_) {  // each entry whole, in the shape it was saved with
    std::vector<std::optional<ExtraState::Entry>> found;
    for (const std::string& name : extra_->names()) {
      if (!r.has(name)) {
        found.emplace_back();
        continue;
      }
      const TensorEntry& saved = *m.find(name);
      ExtraState::Entry e{name, saved.shape, {}};
      e.values.resize(saved.numel());
      r.read(name, 0, e.values.size(), e.values.data());
      found.push_back(std::move(e));
    }
    extra_->restore(found);
  }

  if (m.train_tokens != 0 && train_tokens != 0 && m.train_tokens != train_tokens)
    warn("checkpoint " + dir + " was saved with " + std::to_string(m.train_tokens) +
         " training tokens and data.train now has " + std::to_string(train_tokens) + ": the token cursor " +
         std::to_string(m.cursor) + " continues modulo the new size");
  TrainState st;
  st.step = m.step;
  st.cursor = train_tokens ? m.cursor % train_tokens : m.cursor;
  st.health = m.health;
  return st;
}

// Leftovers of saves that were killed, and of prunes that were interrupted: never loaded,
// removed before each save so they do not accumulate.
void Checkpointer::remove_leftovers() {
  for (const auto& left : scan_checkpoint_dir(cfg_.checkpoint.dir).leftovers)
    if (std::string err = remove_tree(left); !err.empty()) warn("cannot remove " + left + ": " + err);
}

std::string Checkpointer::save(const TrainState& state, ParamStore& store, Ops& ops, uint64_t train_tokens) {
  const std::string& dir = cfg_.checkpoint.dir;

  Manifest meta;
  meta.step = state.step;
  meta.cursor = state.cursor;
  meta.train_tokens = train_tokens;
  meta.total_steps = cfg_.schedule.total_steps;
  meta.next_lr = lr_at(cfg_.optim, cfg_.schedule, state.step);
  meta.seed = cfg_.run.seed;
  meta.health = state.health;
  meta.model = model_shape_json(cfg_.model);
  const auto& par = cfg_.parallel;
  meta.layout = {{"world_size", cfg_.world_size}, {"dp", par.dp},   {"tp", par.tp}, {"pp", par.pp},
                 {"cp", par.cp},                  {"zero_stage", par.zero_stage}, {"dp_replicate", par.dp_replicate},
                 {"ep", par.ep}};
  meta.config = config_to_json(cfg_);
  record_tokenizer(meta, cfg_.data.tokenizer);

  const int rank = world_ ? world_->members()[world_->rank()] : 0;
  const std::vector<Part> held = parts(store);
  const auto fill = [&](CheckpointWriter& w) {
    for (const auto& s : state_names())
      for (const Part& part : held) {
        if (!part.writes) continue;
        const Tensor shard = shard_of(s, *part.store);
        std::vector<float> host(shard.numel);
        ops.download(host.data(), DType::f32, shard, shard.numel);
        const std::vector<bool>& not_saved = *part.not_saved;
        for (const auto& piece : part.store->layout().my_pieces()) {
          if (!not_saved.empty() && not_saved[piece.param]) continue;
          const ParamSpec& p = part.table->specs()[piece.param];
          const float* data = host.data() + piece.shard_offset;  // local element piece.begin
          check_finite(s + "/" + p.name, piece.begin, data, piece.numel(), state.step);
          for (const GlobalSpan& g : global_spans(p.tp, piece.begin, piece.end))
            w.add_strided_chunk(s + "/" + p.name, p.global_shape, state_file(s, rank), g.global_begin, g.run,
                                g.stride, data + (g.local_begin - piece.begin), g.numel);
        }
      }
    if (extra_writes_)
      for (const ExtraState::Entry& e : extra_->save_entries()) {
        check_finite(e.name, 0, e.values.data(), e.values.size(), state.step);
        w.add_chunk(e.name, e.shape, state_file("extra", rank), 0, e.values.data(), e.values.size());
      }
  };
  const bool writes =
      extra_writes_ || std::any_of(held.begin(), held.end(), [](const Part& p) { return p.writes; });
  if (several_ranks()) {
    path_on_disk_ = save_with_ranks(meta, writes, fill);
    step_on_disk_ = state.step;
    return path_on_disk_;
  }
  remove_leftovers();
  path_on_disk_ = write_checkpoint(dir, meta, fill);
  step_on_disk_ = state.step;
  prune();
  return path_on_disk_;
}

std::string Checkpointer::save_with_ranks(const Manifest& meta, bool writes,
                                         const std::function<void(CheckpointWriter&)>& fill) {
  Comm& world = *world_;
  const std::string& dir = cfg_.checkpoint.dir;
  const std::string what = " checkpoint " + step_dir_name(meta.step);
  const bool root = world.rank() == 0;
  std::unique_ptr<CheckpointWriter> w;
  // Every step below ends in an agreement, so a failure on any rank (a full disk) fails the
  // save on all of them, and rank 0 removes the temporary directory.
  const auto together = [&](const std::string& step, const std::function<void()>& f) {
    std::exception_ptr err;
    try {
      f();
    } catch (...) {
      err = std::current_exception();
    }
    try {
      agree(world, err, step + what);
    } catch (...) {
      if (root && w) w->abandon();
      throw;
    }
  };
  // 1. Rank 0 clears what killed saves left and creates the temporary directory.
  together("starting", [&] {
    if (!root) return;
    remove_leftovers();
    w = std::make_unique<CheckpointWriter>(dir, meta.step);
  });
  const std::string tmp = broadcast_string(world, root ? w->temp_dir() : std::string(), 0);
  // 2. Each rank whose shard no other rank writes writes its own files there.
  std::string part;
  together("writing", [&] {
    if (!writes) return;
    if (!root) w = std::make_unique<CheckpointWriter>(dir, meta.step, tmp);
    fill(*w);
    if (!root) part = manifest_to_json(w->finish_part()).dump();
  });
  // 3. Rank 0 adds the other ranks' files and chunks to the manifest and commits.
  const std::vector<std::string> parts = all_gather_strings(world, part);
  std::string path;
  together("committing", [&] {
    if (!root) return;
    for (size_t r = 1; r < parts.size(); r++)
      if (!parts[r].empty()) w->merge_part(manifest_from_json(parts[r], tmp + " (the part of rank " + std::to_string(r) + ")"));
    path = w->commit(meta);
    prune();
  });
  return broadcast_string(world, path, 0);
}

void Checkpointer::prune() {
  const std::string& dir = cfg_.checkpoint.dir;
  const DirScan s = scan_checkpoint_dir(dir);
  // A run that skipped non-finite steps keeps the last checkpoint from before the trouble,
  // however many saves follow it.
  const int clean = newest_clean_step(dir, s.committed);
  for (int step : steps_to_prune(s.committed, cfg_.checkpoint.keep_latest, cfg_.checkpoint.keep_every, clean)) {
    // Renamed aside first, so a crash mid-delete never leaves a half-deleted step directory
    // that still looks complete; the trash is removed here or by the next save.
    const std::string victim = (fs::path(dir) / step_dir_name(step)).string();
    const std::string trash =
        (fs::path(dir) / (".trash_" + step_dir_name(step) + "_" + std::to_string(::getpid()))).string();
    try {
      rename_path(victim, trash);
    } catch (const RuntimeError& e) {
      warn(std::string("cannot prune old checkpoint: ") + e.what());
      continue;
    }
    if (std::string err = remove_tree(trash); !err.empty()) warn("cannot remove " + trash + ": " + err);
  }
}

}  // namespace pt::ckpt
