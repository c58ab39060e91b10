// ParamTable: every parameter of the model with its global shape, how tensor parallelism
// splits it, which layer (and so which pipeline stage) owns it, how it is initialised and
// whether weight decay applies. Local shapes, flat-arena offsets, ZeRO shard ranges and
// checkpoint manifests are all derived from this one table.
//
// Order and names: embeddings, then each block's tensors contiguously (so a pipeline stage
// or a ZeRO-3 layer gather is one contiguous range), then the final norm and an untied head.
// Names are the architecture's (Hugging Face's); weights are stored [out, in] as in llm.c and
// PyTorch's nn.Linear.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/architecture.h"
#include "core/model/tp_slice.h"

namespace pt {

// How tensor parallelism splits a parameter (used from the TP issue on).
enum class Split {
  replicated,  // every TP rank holds all of it (LayerNorm, row-parallel biases, wpe)
  column,      // split along dim 0 (output features): QKV and MLP up-projection
  row,         // split along dim 1 (input features): attention and MLP output projections
  vocab,       // split along dim 0 over the padded vocabulary: the token embedding / LM head
};

enum class Init { normal, zeros, ones };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // the shape this rank holds: the global one unless tensor-parallel
  std::vector<int64_t> global_shape;  // the whole parameter's (set from shape when left empty)
  Split split = Split::replicated;
  int split_groups = 1;  // column split: dim 0 is this many blocks split each (3: q | k | v)
  TpSlice tp;            // where this rank's piece lies in the whole parameter (tp_slice.h)
  int layer = -1;  // -1: embeddings; 0..n_layers-1: a block; n_layers: final LayerNorm
  Init init = Init::zeros;
  double init_std = 0.0;
  bool weight_decay = false;  // matrices (2-D) only
  int64_t live_rows = -1;     // global rows >= live_rows are padding kept at zero (padded vocab); -1: all
  ParamRole role = ParamRole::token_embedding;  // what the model uses it for (architecture.h)
  bool also_head = false;  // the token embedding that is also the LM head (a tied head)
  size_t numel = 0;
  size_t offset = 0;  // in the flat parameter arena
};

class ParamTable {
 public:
  explicit ParamTable(std::vector<ParamSpec> specs);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& get(const std::string& name) const;  // throws if unknown
  size_t total_numel() const { return total_; }
  size_t count_numel(bool (*pred)(const ParamSpec&)) const;
  // The indices into specs() of `role`'s tensors in block `layer`, in table order (empty: none).
  // Indexed once: every stage resolves every role of every layer (ParamStore::role), and a table
  // of many experts holds thousands of tensors.
  const std::vector<size_t>& role_indices(ParamRole role, int layer) const;

 private:
  std::vector<ParamSpec> specs_;
  size_t total_ = 0;
  std::map<std::pair<int, ParamRole>, std::vector<size_t>> by_role_;  // (layer, role) -> indices
};

// The model's parameters, from its Architecture (core/model/architecture.h): the embeddings
// (layer -1), each block's tensors in role order (norm1, qkv, attn_out, norm2, mlp_up, mlp_down,
// each followed by its bias where there is one), the final norm and an untied head (layer
// n_layers). Init: matrices and embeddings N(0, 0.02) (GPT-2: the residual output projections
// N(0, 0.02/sqrt(2*n_layers))), biases 0, norm weights 1, padded vocabulary rows 0.
ParamTable build_param_table(const ModelSection& model);
// The specs of `role` in block `layer` (-1 / n_layers outside the blocks), in table order; empty
// when the table has none (no such tensor in the architecture, or not on this pipeline stage).
std::vector<const ParamSpec*> role_specs(const ParamTable& table, ParamRole role, int layer);
// The same tensors as one run: the first one's spec and their elements together. They lie one
// after another in the table (this checks it), and so in every arena, tensor-parallel piece and
// ZeRO-3 layer buffer made from it, where the stages use them as one tensor (llama's q, k, v
// projections are one matmul). Null where there are none.
struct RoleRun {
  const ParamSpec* first = nullptr;
  size_t numel = 0;
  explicit operator bool() const { return first != nullptr; }
};
RoleRun role_run(const ParamTable& table, ParamRole role, int layer);

// Tensor parallel: the same parameters as `full`, each cut to what rank `tp_rank` of `tp`
// holds (its Split: column, row, vocab, or whole when replicated), with ParamSpec::tp saying
// where that piece lies in the global parameter. Throws ConfigError naming a parameter whose
// split dimension tp does not divide. tp == 1 returns `full` unchanged.
ParamTable tensor_parallel_table(const ParamTable& full, int tp, int tp_rank);

// Fills `arena` (total_numel floats) with the initial values: element i of parameter p is
// a function of (seed, p.name, global index of i) only, so every layout (pipeline stages,
// tensor-parallel pieces) starts from the same model.
void init_params(const ParamTable& table, uint64_t seed, float* arena);

}  // namespace pt
