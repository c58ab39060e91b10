// Vocab-parallel softmax + cross-entropy, the per-shard halves (see Ops::cross_entropy_shard_*):
//  stats:  per row of this shard's logits [N, Vl] (global columns vocab_start..), over the real
//          columns (global index < V): m = max, s = sum exp(x - m), t = x[target] if it is here.
//  finish: from every shard's (m, s, t): M = max m_r, S = sum s_r exp(m_r - M) (shards in
//          order), loss = log S + M - sum t_r; dlogits = (exp(x - M) / S - onehot) * dloss in place.
// The sum of the shards' sums is a reassociation of softmax_cross_entropy's single-row sum, so
// the two agree to float rounding (not bitwise).
// Cost per row: stats ~2 Vl FLOPs + Vl exps reading Vl floats; finish the same plus a write at
// dloss != 0. Memory-bound, like the full op; each row is one thread's (thread-count independent).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"

namespace pt {

namespace {

// The real (non-padding) columns of a shard starting at vocab_start: [0, valid).
int real_columns(int Vl, int V, int vocab_start) {
  return static_cast<int>(std::clamp<long long>(static_cast<long long>(V) - vocab_start, 0, Vl));
}

void check_shard(const char* op, int N, int Vl, int V, int vocab_start) {
  cpu::check_dims(op, {N, Vl, V, vocab_start});
  check(V > 0, std::string("CpuOps::") + op + ": the vocabulary size V=" + std::to_string(V) + " must be positive");
}

void check_targets(const char* op, const int32_t* tg, int N, int V) {
  for (int n = 0; n < N; n++)
    check(tg[n] < V, std::string("CpuOps::") + op + ": targets[" + std::to_string(n) + "] = " + std::to_string(tg[n]) +
                         " is not below the vocabulary size " + std::to_string(V));
}

}  // namespace

void CpuOps::cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V,
                                       int vocab_start) {
  const char* op = "cross_entropy_shard_stats";
  check_shard(op, N, Vl, V, vocab_start);
  float* st = cpu::f32_arg(stats, size_t(N) * 3, op, "stats");
  const float* lg = cpu::f32_arg(logits, size_t(N) * Vl, op, "logits");
  const int32_t* tg = cpu::i32_arg(targets, N, op, "targets");
  check_targets(op, tg, N, V);
  const int valid = real_columns(Vl, V, vocab_start);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* row = lg + size_t(n) * Vl;
    float mx = -INFINITY;
    for (int i = 0; i < valid; i++) mx = std::max(mx, row[i]);
    float sum = 0.0f;
    for (int i = 0; i < valid; i++) sum += std::exp(row[i] - mx);
    const int local = tg[n] - vocab_start;
    st[3 * size_t(n)] = mx;
    st[3 * size_t(n) + 1] = sum;
    st[3 * size_t(n) + 2] = (tg[n] >= 0 && local >= 0 && local < valid) ? row[local] : 0.0f;
  }
}

void CpuOps::cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards,
                                        int N, int Vl, int V, int vocab_start, float dloss) {
  const char* op = "cross_entropy_shard_finish";
  check_shard(op, N, Vl, V, vocab_start);
  check(shards >= 1, std::string("CpuOps::") + op + ": shards must be at least 1");
  float* loss = cpu::f32_arg(losses, N, op, "losses");
  float* lg = cpu::f32_arg(logits, size_t(N) * Vl, op, "logits");
  const int32_t* tg = cpu::i32_arg(targets, N, op, "targets");
  const float* st = cpu::f32_arg(all_stats, size_t(shards) * N * 3, op, "all_stats");
  check_targets(op, tg, N, V);
  const int valid = real_columns(Vl, V, vocab_start);
  const bool backward = dloss != 0.0f;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = lg + size_t(n) * Vl;
    if (tg[n] < 0) {
      loss[n] = 0.0f;
      if (backward) std::fill(row, row + Vl, 0.0f);
      continue;
    }
    float M = -INFINITY;
    for (int r = 0; r < shards; r++) M = std::max(M, st[(size_t(r) * N + n) * 3]);
    float S = 0.0f, target_logit = 0.0f;
    for (int r = 0; r < shards; r++) {
      const float* x = st + (size_t(r) * N + n) * 3;
      if (x[0] != -INFINITY) S += x[1] * std::exp(x[0] - M);  // a padding-only shard adds nothing
      target_logit += x[2];
    }
    loss[n] = std::log(S) + M - target_logit;
    if (!backward) continue;
    const float scale = dloss / S;
    for (int i = 0; i < valid; i++) row[i] = std::exp(row[i] - M) * scale;
    std::fill(row + valid, row + Vl, 0.0f);
    const int local = tg[n] - vocab_start;
    if (local >= 0 && local < valid) row[local] -= dloss;
  }
}

}  // namespace pt
