#include "core/model/param_table.h"

#include <algorithm>
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
  for (size_t i = 0; i < specs_.size(); i++) by_role_[{specs_[i].layer, specs_[i].role}].push_back(i);
}

const std::vector<size_t>& ParamTable::role_indices(ParamRole role, int layer) const {
  static const std::vector<size_t> none;
  const auto it = by_role_.find({layer, role});
  return it == by_role_.end() ? none : it->second;
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

ParamTable build_param_table(const ModelSection& m) {
  const Architecture a = describe_architecture(m);
  const int64_t C = a.d_model, L = a.n_layers;
  const double std = 0.02;
  const double resid_std = a.scaled_residual_init ? 0.02 / std::sqrt(2.0 * L) : std;
  std::vector<ParamSpec> s;
  // One role's tensors. `rows`: the output rows of each logical part (q | k | v, gate | up); a
  // role held as one tensor fuses its parts (GPT-2's c_attn: split_groups 3, so a tensor-
  // parallel rank holds its heads' rows of each part), a role held as one tensor per part
  // splits each alike. `cols`: the input features (0: a vector).
  auto add = [&](ParamRole role, int layer, const std::vector<int64_t>& rows, int64_t cols, Split split, Init init,
                 double sd) {
    const std::vector<std::string> names = a.tensor_names(role, layer);
    if (names.empty()) return;
    check(names.size() == 1 || names.size() == rows.size(),
          std::string("architecture ") + a.name + ": role " + to_string(role) + " has " +
              std::to_string(names.size()) + " tensors for " + std::to_string(rows.size()) + " parts");
    for (size_t i = 0; i < names.size(); i++) {
      ParamSpec p;
      p.name = names[i];
      int64_t r = rows[i];
      if (names.size() == 1 && rows.size() > 1) {
        for (size_t j = 1; j < rows.size(); j++)
          check(rows[j] == rows[0], "a fused tensor's parts must be equal: " + p.name);
        r = rows[0] * static_cast<int64_t>(rows.size());
        p.split_groups = static_cast<int>(rows.size());
      }
      p.shape = cols > 0 ? std::vector<int64_t>{r, cols} : std::vector<int64_t>{r};
      p.split = split;
      p.layer = layer;
      p.init = init;
      p.init_std = sd;
      p.weight_decay = p.shape.size() == 2;
      p.role = role;
      s.push_back(std::move(p));
    }
  };
  // A matrix and its bias: the bias splits with a column-parallel matrix and stays whole with a
  // row-parallel one (it is added once, after the reduction).
  auto linear = [&](ParamRole w, ParamRole b, int layer, const std::vector<int64_t>& rows, int64_t cols, Split split,
                    double sd) {
    add(w, layer, rows, cols, split, Init::normal, sd);
    add(b, layer, rows, 0, split == Split::column ? Split::column : Split::replicated, Init::zeros, 0);
  };
  auto norm = [&](ParamRole w, ParamRole b, int layer) {
    add(w, layer, {C}, 0, Split::replicated, Init::ones, 0);
    if (a.norm_has_bias()) add(b, layer, {C}, 0, Split::replicated, Init::zeros, 0);
  };
  const int64_t Vp = a.padded_vocab, Q = a.q_width(), KV = a.kv_width();
  add(ParamRole::token_embedding, -1, {Vp}, C, Split::vocab, Init::normal, std);
  s.back().live_rows = a.vocab_size;
  s.back().also_head = a.tied_head;
  if (a.positions == PositionKind::learned)
    add(ParamRole::position_embedding, -1, {a.max_seq_len}, C, Split::replicated, Init::normal, std);
  for (int l = 0; l < L; l++) {
    norm(ParamRole::norm1, ParamRole::norm1_bias, l);
    linear(ParamRole::qkv, ParamRole::qkv_bias, l, {Q, KV, KV}, C, Split::column, std);
    linear(ParamRole::attn_out, ParamRole::attn_out_bias, l, {C}, Q, Split::row, resid_std);
    norm(ParamRole::norm2, ParamRole::norm2_bias, l);
    // The dense MLP (a sparse block's shared experts, where it has any).
    const int64_t F = a.mlp_hidden(l);
    if (F > 0) {
      const std::vector<int64_t> up_rows =
          a.mlp == MlpKind::swiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F};
      linear(ParamRole::mlp_up, ParamRole::mlp_up_bias, l, up_rows, C, Split::column, std);
      linear(ParamRole::mlp_down, ParamRole::mlp_down_bias, l, {C}, F, Split::row, resid_std);
    }
    if (a.sparse_block(l)) {
      // The router and every routed expert, whole on every tp rank (core/model/moe_layer.h).
      const int64_t E = a.n_experts, H = a.expert_hidden;
      add(ParamRole::moe_router, l, {E}, C, Split::replicated, Init::normal, std);
      add(ParamRole::expert_up, l, std::vector<int64_t>(size_t(2 * E), H), C, Split::replicated, Init::normal, std);
      add(ParamRole::expert_down, l, std::vector<int64_t>(size_t(E), C), H, Split::replicated, Init::normal,
          resid_std);
    }
  }
  norm(ParamRole::final_norm, ParamRole::final_norm_bias, static_cast<int>(L));
  add(ParamRole::head, static_cast<int>(L), {Vp}, C, Split::vocab, Init::normal, std);
  if (s.back().role == ParamRole::head) s.back().live_rows = a.vocab_size;
  return ParamTable(std::move(s));
}

std::vector<const ParamSpec*> role_specs(const ParamTable& table, ParamRole role, int layer) {
  std::vector<const ParamSpec*> out;
  for (size_t i : table.role_indices(role, layer)) out.push_back(&table.specs()[i]);
  return out;
}

RoleRun role_run(const ParamTable& table, ParamRole role, int layer) {
  RoleRun run;
  for (size_t i : table.role_indices(role, layer)) {
    const ParamSpec& p = table.specs()[i];
    if (!run) {
      run = {&p, p.numel};
      continue;
    }
    check(p.offset == run.first->offset + run.numel,
          "the tensors of role " + std::string(to_string(role)) + " are not adjacent (" + p.name + ")");
    run.numel += p.numel;
  }
  return run;
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
  // Tasks of 64K elements; each walks its part of the local tensor in the runs that are
  // contiguous in the global one, so an element's global index is an increment, not a division.
  constexpr size_t kTask = size_t(1) << 16;
  for (const auto& p : table.specs()) {
    float* out = arena + p.offset;
    const CounterStream rng(seed, hash_name(p.name));
    const std::vector<int64_t>& g = p.global_shape;
    const size_t row = g.size() == 2 ? static_cast<size_t>(g[1]) : 1;
    // Rows past live_rows (the padded vocabulary) stay zero whatever the init.
    const size_t live = p.live_rows < 0 ? SIZE_MAX : static_cast<size_t>(p.live_rows) * row;
    const float fill = p.init == Init::ones ? 1.0f : 0.0f;
    const auto draw = [&](size_t local, size_t global, size_t n) {
      for (size_t k = 0; k < n; k++) {
        const size_t gi = global + k;
        float v = 0.0f;
        if (gi < live) v = p.init == Init::normal ? static_cast<float>(p.init_std * rng.normal(gi)) : fill;
        out[local + k] = v;
      }
    };
    const size_t tasks = (p.numel + kTask - 1) / kTask;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < tasks; t++) p.tp.for_each_run(t * kTask, std::min(p.numel, (t + 1) * kTask), draw);
  }
}

}  // namespace pt
