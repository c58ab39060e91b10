#include "core/model/param_table.h"

#include <cmath>
#include <cstdint>

#include "core/common/counter_rng.h"
#include "core/common/error.h"

namespace pt {

ParamTable::ParamTable(std::vector<ParamSpec> specs) : specs_(std::move(specs)) {
  for (auto& p : specs_) {
    if (p.global_shape.empty()) p.global_shape = p.shape;
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
    p.offset = total_;
    total_ += p.numel;
  }
}

const ParamSpec& ParamTable::get(const std::string& name) const {
  for (const auto& p : specs_)
    if (p.name == name) return p;
  throw RuntimeError("no parameter named " + name);
}

size_t ParamTable::count_numel(bool (*pred)(const ParamSpec&)) const {
  size_t n = 0;
  for (const auto& p : specs_)
    if (pred(p)) n += p.numel;
  return n;
}

ParamTable build_gpt2_param_table(const ModelSection& m) {
  if (m.arch != "gpt2")
    throw ConfigError("model.arch=\"" + m.arch + "\": the model code builds GPT-2 only so far (the Llama blocks come next)");
  const int64_t C = m.d_model, L = m.n_layers;
  const double std = 0.02;
  const double resid_std = 0.02 / std::sqrt(2.0 * L);  // GPT-2: scale residual projections
  std::vector<ParamSpec> s;
  auto add = [&](std::string name, std::vector<int64_t> shape, Split split, int layer, Init init, double sd) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.split = split;
    p.layer = layer;
    p.init = init;
    p.init_std = sd;
    p.weight_decay = p.shape.size() == 2;
    s.push_back(std::move(p));
  };
  add("wte", {m.padded_vocab, C}, Split::vocab, -1, Init::normal, std);
  s.back().live_rows = m.vocab_size;
  add("wpe", {m.max_seq_len, C}, Split::replicated, -1, Init::normal, std);
  for (int l = 0; l < L; l++) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, Split::replicated, l, Init::ones, 0);
    add(h + "ln_1.bias", {C}, Split::replicated, l, Init::zeros, 0);
    add(h + "attn.c_attn.weight", {3 * C, C}, Split::column, l, Init::normal, std);
    s.back().split_groups = 3;
    add(h + "attn.c_attn.bias", {3 * C}, Split::column, l, Init::zeros, 0);
    s.back().split_groups = 3;
    add(h + "attn.c_proj.weight", {C, C}, Split::row, l, Init::normal, resid_std);
    add(h + "attn.c_proj.bias", {C}, Split::replicated, l, Init::zeros, 0);
    add(h + "ln_2.weight", {C}, Split::replicated, l, Init::ones, 0);
    add(h + "ln_2.bias", {C}, Split::replicated, l, Init::zeros, 0);
    add(h + "mlp.c_fc.weight", {4 * C, C}, Split::column, l, Init::normal, std);
    add(h + "mlp.c_fc.bias", {4 * C}, Split::column, l, Init::zeros, 0);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, Split::row, l, Init::normal, resid_std);
    add(h + "mlp.c_proj.bias", {C}, Split::replicated, l, Init::zeros, 0);
  }
  add("ln_f.weight", {C}, Split::replicated, static_cast<int>(L), Init::ones, 0);
  add("ln_f.bias", {C}, Split::replicated, static_cast<int>(L), Init::zeros, 0);
  return ParamTable(std::move(s));
}

ParamTable tensor_parallel_table(const ParamTable& full, int tp, int tp_rank) {
  check(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "tensor_parallel_table: rank out of range");
  if (tp == 1) return full;
  std::vector<ParamSpec> specs;
  for (ParamSpec p : full.specs()) {
    const std::vector<int64_t>& g = p.global_shape;
    const int64_t inner = g.size() == 2 ? g[1] : 1;
    TpSlice& t = p.tp;
    if (p.split == Split::replicated) {
      specs.push_back(p);
      continue;
    }
    switch (p.split) {
      case Split::replicated: break;
      case Split::column: t = {p.split_groups, g[0] / p.split_groups, inner, tp, tp_rank}; break;
      case Split::vocab: t = {1, g[0], inner, tp, tp_rank}; break;
      case Split::row:
        check(g.size() == 2, "a row-parallel parameter must be a matrix: " + p.name);
        t = {g[0], g[1], 1, tp, tp_rank};
        break;
    }
    if (t.split % tp != 0)
      throw ConfigError("parallel.tp=" + std::to_string(tp) + " does not divide the " + std::to_string(t.split) +
                        " " + (p.split == Split::row ? "columns" : "rows") + " of parameter " + p.name);
    p.shape = g;
    p.shape[p.split == Split::row ? 1 : 0] /= tp;
    specs.push_back(p);
  }
  return ParamTable(std::move(specs));
}

void init_params(const ParamTable& table, uint64_t seed, float* arena) {
  for (const auto& p : table.specs()) {
    float* out = arena + p.offset;
    const uint64_t stream = hash_name(p.name);
    const std::vector<int64_t>& g = p.global_shape;
    const size_t row = g.size() == 2 ? static_cast<size_t>(g[1]) : 1;
    const size_t live = p.live_rows < 0 ? SIZE_MAX : static_cast<size_t>(p.live_rows) * row;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p.numel; i++) {
      const size_t gi = p.tp.global_index(i);
      float v = 0.0f;
      if (gi < live) {
        if (p.init == Init::ones) v = 1.0f;
        if (p.init == Init::normal) v = static_cast<float>(p.init_std * counter_normal(seed, stream, gi));
      }
      out[i] = v;
    }
  }
}

}  // namespace pt
