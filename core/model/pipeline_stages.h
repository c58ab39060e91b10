// Pipeline stages: which blocks each pipeline rank runs and which parameters it therefore holds.
//
// The n_layers blocks are cut into S = pp * v consecutive virtual stages (v =
// parallel.pp_virtual_stages): parallel.pp_layers lists the blocks of each, or, when empty, every
// virtual stage gets n_layers / S. Pipeline rank r runs the v chunks c = 0..v-1, chunk c being
// virtual stage c*pp + r (pp_schedule.h). Virtual stage 0 also runs the token and position
// embeddings; the last one the final norm, the LM head and the loss.
//
// Parameters. A rank's ParamStore holds only what its chunks use, as a ParamTable of its own
// (stage_param_table): the same specs (names, global shapes, layers, init) in the full table's
// order, offsets recomputed. Everything keyed on names and layers (initialisation, ShardLayout
// buckets, ZeRO, checkpoints) then works unchanged on the subset, and ZeRO shards each stage's
// parameters over its own dp x cp group. A tied LM head is the token embedding: with pp > 1
// the first and the last stage each hold a copy of it (GPT-2's `wte`), initialised identically
// (the counter RNG keys on the name), kept identical by summing their gradients over the two
// ranks before the optimizer step (pipeline_executor.h); checkpoints save the first stage's
// copy. An untied head (Llama's lm_head) is a block-less tensor of the last stage, like the
// final norm.
#pragma once
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_table.h"

namespace pt {

// The blocks [first_layer, end_layer) of one chunk and what it runs besides them.
struct StageLayers {
  int first_layer = 0;
  int end_layer = 0;
  bool embedding = true;  // token + position embedding (virtual stage 0)
  bool head = true;       // final norm, LM head and loss (the last virtual stage)
  int virtual_stage = 0;
  int layers() const { return end_layer - first_layer; }
  // "layers 4-7 + head", "embeddings + layers 0-3"
  std::string describe() const;
  bool operator==(const StageLayers&) const = default;
};

// The whole model as one chunk (one pipeline rank).
StageLayers whole_model_layers(const ModelSection& model);

// Blocks per virtual stage: parallel.pp_layers, or the even split (the config checked both).
std::vector<int> pipeline_layer_counts(const ModelSection& model, const ParallelSection& parallel);

// The chunks pipeline rank `pp_rank` runs, in chunk order (chunk c = virtual stage c*pp + rank).
std::vector<StageLayers> pipeline_chunks(const ModelSection& model, const ParallelSection& parallel, int pp_rank);

// The parameters `chunks` use, in the full table's order: their blocks; the embeddings with the
// embedding; the final norm and the head (a tied head: the token embedding) with the head. With one chunk holding the whole model
// it is the full table itself (same order and offsets).
ParamTable stage_param_table(const ParamTable& full, const std::vector<StageLayers>& chunks, int n_layers);

// True for the parameters whose gradient and checkpoint a stage leaves to another: the LM head's
// copy of a tied token embedding on a stage without the embedding (the first stage owns it).
bool is_tied_copy(const ParamSpec& p, const std::vector<StageLayers>& chunks);

}  // namespace pt
