// Fused softmax + cross-entropy over the first V of Vp columns (the padded columns of the LM
// head are never predicted), with the backward fused in as llm.c does:
//  losses[n] = logsumexp(logits[n, :V]) - logits[n, target]  (0 when target < 0),
//  and, when dloss != 0, logits[n, :] is overwritten with (softmax - onehot(target)) * dloss,
//  padded columns (and whole rows without a target) with 0. dloss == 0 (eval) leaves logits be.
// The row max is subtracted before exp, so no logit is too large for float.
// Cost per row: ~4V FLOPs + V exps; bytes: logits read twice and written once (12 V per row at
// dloss != 0): memory-bound, and the biggest single pass of a training step at V = 50304.
// Parallel over rows; each row is one thread's, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

void CpuOps::softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp,
                                   float dloss) {
  cpu::check_dims("softmax_cross_entropy", {N, V, Vp});
  check(V > 0 && V <= Vp, "CpuOps::softmax_cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                              " Vp=" + std::to_string(Vp));
  float* loss = cpu::f32_arg(losses, N, "softmax_cross_entropy", "losses");
  float* lg = cpu::f32_arg(logits, size_t(N) * Vp, "softmax_cross_entropy", "logits");
  const int32_t* tg = cpu::i32_arg(targets, N, "softmax_cross_entropy", "targets");
  // A target past the vocabulary would read outside the row: a data bug worth naming.
  for (int n = 0; n < N; n++)
    check(tg[n] < V, "CpuOps::softmax_cross_entropy: targets[" + std::to_string(n) + "] = " +
                         std::to_string(tg[n]) + " is not below the vocabulary size " + std::to_string(V));
  bool backward = dloss != 0.0f;

#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = lg + size_t(n) * Vp;
    int target = tg[n];
    if (target < 0) {
      loss[n] = 0.0f;
      if (backward) std::fill(row, row + Vp, 0.0f);
      continue;
    }
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = std::max(mx, row[i]);
    float target_logit = row[target];
    float sum = 0.0f;
    if (backward) {
      // Keep each exp in the row: the gradient needs it again, and exp is the costly part.
      for (int i = 0; i < V; i++) {
        row[i] = std::exp(row[i] - mx);
        sum += row[i];
      }
      float inv = 1.0f / sum;
      for (int i = 0; i < V; i++) row[i] = row[i] * inv * dloss;
      row[target] -= dloss;
      std::fill(row + V, row + Vp, 0.0f);
    } else {
      for (int i = 0; i < V; i++) sum += std::exp(row[i] - mx);
    }
    loss[n] = std::log(sum) + mx - target_logit;
  }
}

}  // namespace pt
