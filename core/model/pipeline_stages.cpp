#include "core/model/pipeline_stages.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

std::string StageLayers::describe() const {
  std::string s;
  if (embedding) s += "embeddings + ";
  if (layers() == 0) s += "no blocks";
  else if (layers() == 1) s += "layer " + std::to_string(first_layer);
  else s += "layers " + std::to_string(first_layer) + "-" + std::to_string(end_layer - 1);
  if (head) s += " + head";
  return s;
}

StageLayers whole_model_layers(const ModelSection& model) { return {0, model.n_layers, true, true, 0}; }

std::vector<int> pipeline_layer_counts(const ModelSection& model, const ParallelSection& par) {
  const int stages = par.pp * par.pp_virtual_stages;
  if (!par.pp_layers.empty()) {
    check(static_cast<int>(par.pp_layers.size()) == stages, "parallel.pp_layers has the wrong length");
    return par.pp_layers;
  }
  check(stages >= 1 && model.n_layers % stages == 0, "model.n_layers is not divisible by the virtual stages");
  return std::vector<int>(static_cast<size_t>(stages), model.n_layers / stages);
}

std::vector<StageLayers> pipeline_chunks(const ModelSection& model, const ParallelSection& par, int pp_rank) {
  check(pp_rank >= 0 && pp_rank < par.pp,
        "pipeline rank " + std::to_string(pp_rank) + " is outside 0.." + std::to_string(par.pp - 1));
  const std::vector<int> counts = pipeline_layer_counts(model, par);
  std::vector<int> start(counts.size() + 1, 0);
  for (size_t s = 0; s < counts.size(); s++) start[s + 1] = start[s] + counts[s];
  check(start.back() == model.n_layers, "parallel.pp_layers does not sum to model.n_layers");
  const int stages = static_cast<int>(counts.size());
  std::vector<StageLayers> out;
  for (int c = 0; c < par.pp_virtual_stages; c++) {
    const int vs = c * par.pp + pp_rank;
    out.push_back({start[vs], start[vs + 1], vs == 0, vs == stages - 1, vs});
  }
  return out;
}

ParamTable stage_param_table(const ParamTable& full, const std::vector<StageLayers>& chunks, int n_layers) {
  const bool embedding = std::any_of(chunks.begin(), chunks.end(), [](const StageLayers& s) { return s.embedding; });
  const bool head = std::any_of(chunks.begin(), chunks.end(), [](const StageLayers& s) { return s.head; });
  std::vector<ParamSpec> specs;
  for (const ParamSpec& p : full.specs()) {
    bool used = false;
    if (p.layer < 0) used = p.also_head ? embedding || head : embedding;  // a tied head's copy
    else if (p.layer >= n_layers) used = head;
    else
      for (const StageLayers& s : chunks) used = used || (p.layer >= s.first_layer && p.layer < s.end_layer);
    if (used) specs.push_back(p);
  }
  check(!specs.empty(), "a pipeline stage without parameters");
  return ParamTable(std::move(specs));
}

bool is_tied_copy(const ParamSpec& p, const std::vector<StageLayers>& chunks) {
  const bool embedding = std::any_of(chunks.begin(), chunks.end(), [](const StageLayers& s) { return s.embedding; });
  return p.also_head && !embedding;
}

}  // namespace pt
