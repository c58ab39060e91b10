// Token and position embeddings (GPT-2's wte and wpe).
//  forward:  out[n, :] = wte[tokens[n] - vocab_start, :] (0 outside this vocab shard);
//            out[b, t, :] += wpe[pos[t], :].
//  backward: dwte[tokens[n] - vocab_start, :] += dout[n, :]; dwpe[pos[t], :] += sum_b dout[b, t, :].
// No FLOPs to speak of: every op moves about 2-3 x N*C*4 bytes (read the rows, write the rows).
// The backward passes are scatter-adds where several rows may hit the same table row (a token
// repeats). Instead of atomics they are parallel over blocks of channels: each thread owns
// whole columns of the table and walks the rows in order, so the sum is race-free and its order
// (and hence every bit) is independent of the thread count.
#include <string>

#include "core/cpu/cpu_args.h"
#include "core/cpu/cpu_ops.h"
#include "core/cpu/cpu_parallel.h"

namespace pt {

namespace {

// dst[row_of(r), :] += src[r, :] for r = 0..rows-1 in order, skipping rows where row_of < 0.
template <class RowOf>
void scatter_add_rows(float* dst, const float* src, long long rows, int C, RowOf row_of) {
  cpu::for_each_channel_block(C, [&](int c0, int c1) {
    for (long long r = 0; r < rows; r++) {
      long long d = row_of(r);
      if (d < 0) continue;
      float* out = dst + d * C;
      const float* in = src + r * C;
#pragma omp simd
      for (int c = c0; c < c1; c++) out[c] += in[c];
    }
  });
}

// Positions index wpe directly, so one out of range is a caller bug; say which.
void check_positions(const int32_t* pos, int T, size_t wpe_rows, const char* op) {
  for (int t = 0; t < T; t++)
    check(pos[t] >= 0 && static_cast<size_t>(pos[t]) < wpe_rows,
          std::string("CpuOps::") + op + ": pos[" + std::to_string(t) + "] = " + std::to_string(pos[t]) +
              " is outside wpe's " + std::to_string(wpe_rows) + " rows");
}

}  // namespace

void CpuOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start,
                               int vocab_local) {
  cpu::check_dims("embedding_forward", {N, C, vocab_local});
  float* o = cpu::f32_arg(out, size_t(N) * C, "embedding_forward", "out");
  const int32_t* tok = cpu::i32_arg(tokens, N, "embedding_forward", "tokens");
  const float* w = cpu::f32_arg(wte, size_t(vocab_local) * C, "embedding_forward", "wte");
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    long long row = static_cast<long long>(tok[n]) - vocab_start;
    bool in_shard = row >= 0 && row < vocab_local;
    float* dst = o + size_t(n) * C;
    if (in_shard) {
      const float* src = w + row * C;
#pragma omp simd
      for (int c = 0; c < C; c++) dst[c] = src[c];
    } else {
      for (int c = 0; c < C; c++) dst[c] = 0.0f;
    }
  }
}

void CpuOps::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start,
                                int vocab_local) {
  cpu::check_dims("embedding_backward", {N, C, vocab_local});
  float* dw = cpu::optional_f32_arg(dwte, size_t(vocab_local) * C, "embedding_backward", "dwte");
  if (!dw) return;
  const float* d = cpu::f32_arg(dout, size_t(N) * C, "embedding_backward", "dout");
  const int32_t* tok = cpu::i32_arg(tokens, N, "embedding_backward", "tokens");
  scatter_add_rows(dw, d, N, C, [&](long long n) {
    long long row = static_cast<long long>(tok[n]) - vocab_start;
    return row >= 0 && row < vocab_local ? row : -1;
  });
}

void CpuOps::position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) {
  cpu::check_dims("position_forward", {B, T, C});
  float* o = cpu::f32_arg(out, size_t(B) * T * C, "position_forward", "out");
  const float* w = cpu::f32_arg(wpe, 0, "position_forward", "wpe");
  const int32_t* p = cpu::i32_arg(pos, T, "position_forward", "pos");
  check_positions(p, T, C ? wpe.numel / C : 0, "position_forward");
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* dst = o + (size_t(b) * T + t) * C;
      const float* src = w + size_t(p[t]) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) dst[c] += src[c];
    }
  }
}

void CpuOps::position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) {
  cpu::check_dims("position_backward", {B, T, C});
  float* dw = cpu::optional_f32_arg(dwpe, 0, "position_backward", "dwpe");
  if (!dw) return;
  const float* d = cpu::f32_arg(dout, size_t(B) * T * C, "position_backward", "dout");
  const int32_t* p = cpu::i32_arg(pos, T, "position_backward", "pos");
  check_positions(p, T, C ? dwpe.numel / C : 0, "position_backward");
  // Rows are (b, t) in memory order; the same position may appear in every batch row.
  scatter_add_rows(dw, d, static_cast<long long>(B) * T, C, [&](long long r) { return static_cast<long long>(p[r % T]); });
}

}  // namespace pt
