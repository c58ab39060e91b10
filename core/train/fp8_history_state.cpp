#include "core/train/fp8_history_state.h"

namespace pt {

std::string Fp8HistoryState::name(int layer, Fp8Layer kind) {
  if (kind == Fp8Layer::lm_head) return "fp8_amax_history/lm_head";
  return "fp8_amax_history/layers." + std::to_string(layer) + "." + fp8_layer_names()[static_cast<size_t>(kind)];
}

std::string Fp8HistoryState::expert_name(int layer, int expert, bool down) {
  return "fp8_amax_history/layers." + std::to_string(layer) + ".experts." + std::to_string(expert) +
         (down ? ".down" : ".up");
}

Fp8HistoryState::Fp8HistoryState(std::vector<DecoderStage*> chunks, const Fp8Recipe& recipe) {
  for (DecoderStage* chunk : chunks) {
    Fp8Delayed* state = chunk->fp8_delayed();
    if (!state) continue;
    const StageLayers& layers = chunk->layers();
    const Fp8Sites& at = chunk->fp8_sites();
    const Architecture& arch = chunk->dims().arch;
    int sparse = 0;  // the chunk's sparse blocks so far
    for (int l = layers.first_layer; l < layers.end_layer; l++) {
      for (int k = 0; k < kFp8BlockLayers; k++) {
        const bool mlp = Fp8Layer(k) == Fp8Layer::mlp_up || Fp8Layer(k) == Fp8Layer::mlp_down;
        // A sparse block may have no dense MLP.
        if (!recipe.on(Fp8Layer(k)) || (mlp && arch.mlp_hidden(l) == 0)) continue;
        sites_.push_back({state, at.block(l - layers.first_layer, Fp8Layer(k)), name(l, Fp8Layer(k))});
      }
      if (at.sparse == 0 || !arch.sparse_block(l)) continue;
      for (int e = 0; e < at.experts; e++)
        for (bool down : {false, true}) sites_.push_back({state, at.expert(sparse, e, down), expert_name(l, e, down)});
      sparse++;
    }
    if (at.head) sites_.push_back({state, at.lm_head(), name(-1, Fp8Layer::lm_head)});
  }
}

std::vector<std::string> Fp8HistoryState::names() const {
  std::vector<std::string> out;
  for (const Site& s : sites_) out.push_back(s.name);
  return out;
}

std::vector<ckpt::ExtraState::Entry> Fp8HistoryState::save_entries() {
  std::vector<Entry> out;
  // Each chunk's histories in one download (sites_ lists a chunk's sites together).
  const Fp8Delayed* downloaded = nullptr;
  std::vector<std::vector<float>> histories;
  for (const Site& s : sites_) {
    if (!s.state->has_history()) continue;  // nothing recorded yet: the resumed run starts afresh too
    if (s.state != downloaded) histories = s.state->histories(), downloaded = s.state;
    out.push_back({s.name, {s.state->history(), Fp8Delayed::kOperands}, histories[size_t(s.site)]});
  }
  return out;
}

void Fp8HistoryState::restore(const std::vector<std::optional<Entry>>& found) {
  check(found.size() == sites_.size(), "Fp8HistoryState::restore: " + std::to_string(found.size()) +
                                           " entries for " + std::to_string(sites_.size()) + " layers");
  bool complete = true;
  for (size_t i = 0; i < found.size(); i++) {
    if (!found[i]) complete = false;
    else if (found[i]->shape.size() != 2 || found[i]->shape[1] != Fp8Delayed::kOperands)
      throw ckpt::CorruptCheckpoint("tensor " + found[i]->name + " is not [steps, " +
                                    std::to_string(int(Fp8Delayed::kOperands)) + "]");
  }
  // Each chunk's histories, by site (sites without FP8 stay empty).
  std::vector<Fp8Delayed*> states;
  for (const Site& s : sites_)
    if (states.empty() || states.back() != s.state) states.push_back(s.state);
  for (Fp8Delayed* state : states) {
    std::vector<std::vector<float>> rows;
    if (complete) {
      rows.resize(static_cast<size_t>(state->sites()));
      for (size_t i = 0; i < sites_.size(); i++)
        if (sites_[i].state == state) rows[static_cast<size_t>(sites_[i].site)] = found[i]->values;
    }
    state->restore(rows);
  }
}

}  // namespace pt
