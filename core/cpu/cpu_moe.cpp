// Mixture of experts: the router (softmax over the experts, top-k, renormalised weights), the
// permutation of tokens into per-expert groups and back, and the weighted combine of the
// experts' outputs, with their backward passes (the contracts are Ops', core/ops/ops.h); the
// routing plan and the balancing loss's statistics; the grouped products, each group an ordinary
// matmul on its rows (so the grouped and the per-expert paths of core/model/moe_layer.cpp give
// the same bits).
// Cost: the router is O(N E) (softmax, then k passes of an arg-max over E); permute and combine
// move k rows of C per token: N k C reads and writes, memory-bound. Tokens are independent, so
// each loop is parallel over n with no reduction across threads (deterministic).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"
#include "core/ops/grouped_by_group.h"
#include "core/ops/moe_routing.h"

namespace pt {

namespace {

int32_t* i32_out(const Tensor& t, size_t n, const char* op, const char* name) {
  return const_cast<int32_t*>(cpu::i32_arg(t, n, op, name));
}

}  // namespace

void CpuOps::moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E,
                                int k) {
  cpu::check_dims("moe_router_forward", {N, E, k});
  check(k >= 1 && k <= E, "CpuOps::moe_router_forward: top-k of " + std::to_string(k) + " from " +
                              std::to_string(E) + " experts");
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  const float* lg = cpu::f32_arg(logits, NE, "moe_router_forward", "logits");
  float* p = cpu::f32_arg(probs, NE, "moe_router_forward", "probs");
  int32_t* ex = i32_out(topk_expert, NK, "moe_router_forward", "topk_expert");
  float* w = cpu::f32_arg(topk_weight, NK, "moe_router_forward", "topk_weight");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = lg + size_t(n) * E;
    float* pr = p + size_t(n) * E;
    float mx = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < E; e++) mx = std::max(mx, x[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
      pr[e] = std::exp(x[e] - mx);
      sum += pr[e];
    }
    for (int e = 0; e < E; e++) pr[e] /= sum;
    // k arg-max passes, each skipping the experts already chosen; '>' keeps the lower index on a tie.
    int32_t* choice = ex + size_t(n) * k;
    float* weight = w + size_t(n) * k;
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int i = 0; i < j; i++) taken = taken || choice[i] == e;
        if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
      }
      choice[j] = best;
      weight[j] = pr[best];
      chosen_sum += pr[best];
    }
    for (int j = 0; j < k; j++) weight[j] /= chosen_sum;
  }
}

void CpuOps::moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight,
                                 Tensor dtopk_weight, Tensor dprobs_all, int N, int E, int k) {
  cpu::check_dims("moe_router_backward", {N, E, k});
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  float* dl = cpu::f32_arg(dlogits, NE, "moe_router_backward", "dlogits");
  const float* p = cpu::f32_arg(probs, NE, "moe_router_backward", "probs");
  const int32_t* ex = cpu::i32_arg(topk_expert, NK, "moe_router_backward", "topk_expert");
  const float* w = cpu::f32_arg(topk_weight, NK, "moe_router_backward", "topk_weight");
  const float* dw = cpu::f32_arg(dtopk_weight, NK, "moe_router_backward", "dtopk_weight");
  const float* dall = cpu::f32_arg(dprobs_all, size_t(E), "moe_router_backward", "dprobs_all");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* pr = p + size_t(n) * E;
    const int32_t* choice = ex + size_t(n) * k;
    const float* wr = w + size_t(n) * k;
    const float* dwr = dw + size_t(n) * k;
    float* out = dl + size_t(n) * E;  // dp first, then dlogits in place
    float S = 0.0f, wdw = 0.0f;
    for (int j = 0; j < k; j++) {
      S += pr[choice[j]];
      wdw += wr[j] * dwr[j];
    }
    for (int e = 0; e < E; e++) out[e] = dall[e];
    for (int j = 0; j < k; j++) out[choice[j]] += (dwr[j] - wdw) / S;
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += pr[e] * out[e];
    for (int e = 0; e < E; e++) out[e] = pr[e] * (out[e] - pdp);
  }
}

void CpuOps::moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) {
  cpu::check_dims("moe_permute", {N, C, k});
  const size_t NK = size_t(N) * k;
  float* o = cpu::f32_arg(out, NK * C, "moe_permute", "out");
  const float* xi = cpu::f32_arg(x, size_t(N) * C, "moe_permute", "x");
  const int32_t* slot = cpu::i32_arg(slot_of, NK, "moe_permute", "slot_of");
  for (size_t i = 0; i < NK; i++)
    check(slot[i] >= 0 && size_t(slot[i]) < NK, "CpuOps::moe_permute: slot out of range");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      float* dst = o + size_t(slot[size_t(n) * k + j]) * C;
      const float* src = xi + size_t(n) * C;
      for (int c = 0; c < C; c++) dst[c] = src[c];
    }
}

void CpuOps::moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) {
  cpu::check_dims("moe_permute_backward", {N, C, k});
  const size_t NK = size_t(N) * k;
  float* d = cpu::f32_arg(dx, size_t(N) * C, "moe_permute_backward", "dx");
  const float* dy = cpu::f32_arg(dout, NK * C, "moe_permute_backward", "dout");
  const int32_t* slot = cpu::i32_arg(slot_of, NK, "moe_permute_backward", "slot_of");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      const float* src = dy + size_t(slot[size_t(n) * k + j]) * C;
      float* dst = d + size_t(n) * C;
      for (int c = 0; c < C; c++) dst[c] += src[c];
    }
}

void CpuOps::moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  cpu::check_dims("moe_combine", {N, C, k});
  const size_t NK = size_t(N) * k;
  float* out = cpu::f32_arg(y, size_t(N) * C, "moe_combine", "y");
  const float* eo = cpu::f32_arg(expert_out, NK * C, "moe_combine", "expert_out");
  const float* w = cpu::f32_arg(topk_weight, NK, "moe_combine", "topk_weight");
  const int32_t* slot = cpu::i32_arg(slot_of, NK, "moe_combine", "slot_of");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* dst = out + size_t(n) * C;
    for (int c = 0; c < C; c++) dst[c] = 0.0f;
    for (int j = 0; j < k; j++) {
      const float wj = w[size_t(n) * k + j];
      const float* src = eo + size_t(slot[size_t(n) * k + j]) * C;
      for (int c = 0; c < C; c++) dst[c] += wj * src[c];
    }
  }
}

void CpuOps::moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out,
                                  Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  cpu::check_dims("moe_combine_backward", {N, C, k});
  const size_t NK = size_t(N) * k;
  // Either output may be null (not needed); each reads only what it needs.
  float* deo = cpu::optional_f32_arg(dexpert_out, NK * C, "moe_combine_backward", "dexpert_out");
  float* dw = cpu::optional_f32_arg(dtopk_weight, NK, "moe_combine_backward", "dtopk_weight");
  const float* g = cpu::f32_arg(dy, size_t(N) * C, "moe_combine_backward", "dy");
  const float* eo = dw ? cpu::f32_arg(expert_out, NK * C, "moe_combine_backward", "expert_out") : nullptr;
  const float* w = deo ? cpu::f32_arg(topk_weight, NK, "moe_combine_backward", "topk_weight") : nullptr;
  const int32_t* slot = cpu::i32_arg(slot_of, NK, "moe_combine_backward", "slot_of");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* gn = g + size_t(n) * C;
    for (int j = 0; j < k; j++) {
      const size_t r = size_t(slot[size_t(n) * k + j]);
      if (deo) {
        const float wj = w[size_t(n) * k + j];
        float* d = deo + r * C;
        for (int c = 0; c < C; c++) d[c] = wj * gn[c];
      }
      if (dw) {
        const float* e = eo + r * C;
        float dot = 0.0f;
        for (int c = 0; c < C; c++) dot += gn[c] * e[c];
        dw[size_t(n) * k + j] = dot;
      }
    }
  }
}

void CpuOps::moe_route(Tensor slot_of, Tensor offsets, Tensor topk_expert, int N, int k, int E) {
  cpu::check_dims("moe_route", {N, k, E});
  const size_t NK = size_t(N) * k;
  const MoeRouting r = plan_moe_routing(cpu::i32_arg(topk_expert, NK, "moe_route", "topk_expert"), N, k, E);
  std::copy(r.slot_of.begin(), r.slot_of.end(), i32_out(slot_of, NK, "moe_route", "slot_of"));
  std::copy(r.offsets.begin(), r.offsets.end(), i32_out(offsets, size_t(E) + 1, "moe_route", "offsets"));
}

void CpuOps::moe_balance_sums(Tensor sums, Tensor probs, Tensor offsets, int N, int E) {
  cpu::check_dims("moe_balance_sums", {N, E});
  const float* p = cpu::f32_arg(probs, size_t(N) * E, "moe_balance_sums", "probs");
  const int32_t* off = cpu::i32_arg(offsets, size_t(E) + 1, "moe_balance_sums", "offsets");
  float* out = cpu::f32_arg(sums, 2 * size_t(E) + 1, "moe_balance_sums", "sums");
  for (int e = 0; e < E; e++) {
    double column = 0;  // row order, in double: one rounding
    for (int n = 0; n < N; n++) column += p[size_t(n) * E + e];
    out[e] = static_cast<float>(off[e + 1] - off[e]);
    out[E + e] = static_cast<float>(column);
  }
  out[2 * E] = static_cast<float>(N);
}

void CpuOps::moe_balance_loss(Tensor dprobs_all, Tensor stats, Tensor sums, int E, int k, float aux_weight) {
  cpu::check_dims("moe_balance_loss", {E, k});
  const float* s = cpu::f32_arg(sums, 2 * size_t(E) + 1, "moe_balance_loss", "sums");
  float* d = cpu::f32_arg(dprobs_all, size_t(E), "moe_balance_loss", "dprobs_all");
  const double tokens = s[2 * E];
  check(tokens > 0, "CpuOps::moe_balance_loss: no tokens");
  double aux = 0, busiest = 0;
  for (int e = 0; e < E; e++) {
    const double f = s[e] / tokens, P = s[E + e] / tokens;
    aux += E * f * P;
    busiest = std::max(busiest, f);
    d[e] = static_cast<float>(aux_weight * E * f / tokens);
  }
  if (stats) {
    float* st = cpu::f32_arg(stats, 2, "moe_balance_loss", "stats");
    st[0] += static_cast<float>(aux);
    st[1] += static_cast<float>(busiest * E / k);
  }
}

void CpuOps::grouped_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC,
                                    int OC) {
  cpu::check_dims("grouped_matmul_forward", {G, rows, IC, OC});
  const int32_t* off = cpu::i32_arg(offsets, size_t(G) + 1, "grouped_matmul_forward", "offsets");
  grouped_forward_by_group(*this, checked_group_offsets(off, G, rows, "CpuOps::grouped_matmul_forward"), out, inp,
                           weight, IC, OC);
}

void CpuOps::grouped_matmul_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                                     Tensor offsets, int G, int rows, int IC, int OC) {
  cpu::check_dims("grouped_matmul_backward", {G, rows, IC, OC});
  if (!dinp && !dweight) return;
  const int32_t* off = cpu::i32_arg(offsets, size_t(G) + 1, "grouped_matmul_backward", "offsets");
  grouped_backward_by_group(*this, checked_group_offsets(off, G, rows, "CpuOps::grouped_matmul_backward"), dinp,
                            dweight, dout, inp, weight, IC, OC);
}

}  // namespace pt
