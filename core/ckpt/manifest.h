// manifest.json: what a checkpoint directory holds. It is written last, inside the temporary
// directory, so a checkpoint with a manifest is complete (the rename that follows is the commit).
//
// Tensors are described by their GLOBAL shape and a list of chunks, each a set of elements of
// the row-major flattened global tensor stored at (file, offset, bytes) with its checksum: a
// flat range [begin, end), or a STRIDED chunk of equal runs a fixed distance apart. One rank
// writes each tensor whole (one chunk); a ZeRO rank writes the slice of the flat shard it owns;
// a tensor-parallel rank its piece, which is rows (one range) or, for a row-parallel matrix,
// columns: one run per row, so at most a partial first row, one strided chunk of whole rows
// and a partial last row (core/ckpt/tp_chunks.h). A reader assembles whatever range its own
// layout needs from whichever chunks cover it, so a change of layout needs no change of
// format. Everything is little-endian.
//
// Strided chunks came with tensor parallelism and left format_version at 1: every file without
// them reads exactly as before (and is written byte for byte as before), and a reader that
// predates them cannot misread one. It ignores the unknown "run" and "stride" keys and then
// rejects the chunk as corrupt, since its bytes are fewer than its extent's whenever it has
// several runs with stride > run (and otherwise it IS its extent).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/config/run_config.h"

namespace pt::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "picotrain-checkpoint";
inline constexpr const char* kManifestFile = "manifest.json";

// A checkpoint that cannot be used: missing or truncated files, checksum mismatches, a manifest
// that does not parse. The message names the file. `auto` resume falls back past these.
struct CorruptCheckpoint : RuntimeError {
  using RuntimeError::RuntimeError;
};

struct Chunk {
  std::string file;       // relative to the checkpoint directory
  uint64_t offset = 0;    // byte offset in the file
  uint64_t bytes = 0;     // = numel() * dtype size
  uint64_t begin = 0;     // the extent [begin, end) in the flattened global tensor
  uint64_t end = 0;
  uint64_t checksum = 0;  // checksum64 of the chunk's bytes
  // Strided (run > 0): runs() runs of `run` elements, run j holding global elements
  // [begin + j*stride, begin + j*stride + run), stored one after another; stride >= run and
  // end = begin + (runs() - 1) * stride + run. run 0: contiguous, every element of the extent.
  uint64_t run = 0;
  uint64_t stride = 0;

  bool strided() const { return run != 0; }
  // A contiguous chunk is one run of its whole extent, so readers need only the strided view.
  uint64_t run_length() const { return strided() ? run : end - begin; }
  uint64_t run_stride() const { return strided() ? stride : end - begin; }
  uint64_t runs() const { return strided() ? (end - begin - run) / stride + 1 : 1; }
  uint64_t numel() const { return runs() * run_length(); }
};

struct TensorEntry {
  std::string name;  // "<state>/<parameter>", e.g. "master/h.0.attn.c_attn.weight", "adam_m/wte"
  std::vector<int64_t> shape;
  std::string dtype = "f32";
  std::vector<Chunk> chunks;
  uint64_t numel() const;
};

struct FileEntry {
  std::string name;
  uint64_t bytes = 0;  // the exact file size: a truncated or extended file is corrupt
};

// The run's health as of a checkpoint (core/train/run_guard.h decides with it), saved so that a
// resumed run skips, rolls back and counts exactly as the uninterrupted one would. A manifest
// written before it existed reads as all zero: a clean run.
struct HealthRecord {
  int skipped_steps = 0;       // steps skipped as non-finite over the whole run (AdamW counts the others)
  int skipped_in_a_row = 0;    // of them, the run of skips ending at this step
  int skipped_since_save = 0;  // since the previous checkpoint; 0: every step up to this one was finite
  int rollbacks = 0;           // loss-spike rollbacks so far
  std::vector<double> recent_losses;  // the spike detector's window, oldest first
  bool operator==(const HealthRecord&) const = default;
};

struct Manifest {
  int step = 0;             // optimizer steps done
  uint64_t cursor = 0;      // global token cursor of the next step
  uint64_t train_tokens = 0;  // tokens in the training set when saved (0: unknown, e.g. imported)
  int total_steps = 0;      // schedule length when saved
  double next_lr = 0;       // learning rate the next step runs at (schedule position, for humans)
  uint64_t seed = 0;        // run.seed; no random stream is consumed during training yet
  HealthRecord health;
  nlohmann::json model;     // the model-shape keys (model_shape_json)
  nlohmann::json layout;    // world size and parallel degrees of the writer (informational)
  nlohmann::json config;    // the writer's full resolved config
  nlohmann::json tokenizer;  // the model's tokenizer (checkpoint_tokenizer.h); null: none recorded
  std::vector<FileEntry> files;
  std::vector<TensorEntry> tensors;
  // Files CheckpointWriter::commit copies into the checkpoint as {name there, source path}; the
  // copies are then listed in `files` like any other. Not itself written to manifest.json.
  std::vector<std::pair<std::string, std::string>> copies;

  const TensorEntry* find(const std::string& name) const;
};

nlohmann::ordered_json manifest_to_json(const Manifest& m);
// Parses and checks the structure (chunks inside their tensor and file, sizes and strides
// consistent); throws CorruptCheckpoint naming `path` on anything malformed.
Manifest manifest_from_json(const std::string& text, const std::string& path);

// The keys that fix the model's shape and meaning: a checkpoint loads only into a config whose
// keys all agree (pad_vocab_multiple is left out: only the padded_vocab it produces matters).
// A model with experts adds a "moe" object (n_experts, top_k, expert_hidden, every,
// n_shared_experts); a dense model's keys are exactly what they were before experts existed.
nlohmann::json model_shape_json(const ModelSection& m);
// 16 hex digits: checksum64 of model_shape_json's text, a quick "same model?" label.
std::string model_hash(const ModelSection& m);
// Throws ConfigError naming the first key that differs, e.g.
// "model.d_model=256 but the checkpoint DIR has 128", "moe.top_k=1 but the checkpoint DIR has 2",
// or that one model has experts and the other none.
void check_model_shape(const Manifest& m, const ModelSection& cfg, const std::string& where);
// The ModelSection a manifest describes (for convert and for tools without a run config); its
// moe.aux_loss_coef is the one in the manifest's config.
ModelSection model_from_manifest(const Manifest& m, const std::string& where);

}  // namespace pt::ckpt
