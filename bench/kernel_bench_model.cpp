// kernel_bench's model table: every op of one GPT-2 training step (embeddings, LayerNorm, the five
// matmul shapes forward and backward, attention at the model's shape, GELU alone and fused into
// the fc matmuls, residual adds, the memsets of backward, the loss, the gradient norm, AdamW, casts)
// at micro-batch B, as core/model/decoder_stage.cpp calls them. Each row carries its calls per
// optimizer step (micro-batch B, grad accumulation accum, zero_stage 0, no recompute), which the
// report multiplies by the median and sums: where the GPU time of a training step goes.
#include <algorithm>
#include <iterator>
#include <random>

#include "bench/kernel_bench.h"

namespace pt::kernel_bench {
namespace {

// Parameter tensor sizes in GPT-2's order (llm.c's), for AdamW per tensor and the totals.
std::vector<size_t> param_sizes(const ModelShape& m) {
  const size_t C = m.C;
  std::vector<size_t> s = {size_t(m.Vp) * C, size_t(1024) * C};  // wte, wpe (max_seq_len 1024)
  for (int l = 0; l < m.L; l++) {
    const size_t layer[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    s.insert(s.end(), std::begin(layer), std::end(layer));
  }
  s.push_back(C);  // ln_f
  s.push_back(C);
  return s;
}

}  // namespace

// Every op of a GPT-2 training step at micro-batch B, as core/model/decoder_stage.cpp calls them.
void bench_model(Bench& b, Ops& ops, const ModelShape& m) {
  const std::string sec = m.name;
  const int B = m.B, T = m.T, C = m.C, L = m.L, NH = m.NH, Vp = m.Vp, V = m.V;
  const int N = B * T, F = 4 * C;
  const size_t NC = size_t(N) * C;
  const DType bf = ops.compute_dtype(), f32 = DType::f32;  // activations (bf16; f32 in --smoke), gradients
  const double s = static_cast<double>(dtype_size(bf)), g = 4;
  const double A = m.accum;   // micro-batches per optimizer step
  const std::string nshape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
  Buffers buf(ops);
  std::mt19937 rng(1);
  std::vector<int32_t> tok(N), pos_rows(N), pos(T);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % V);
  for (int i = 0; i < N; i++) pos_rows[i] = i % T;
  for (int t = 0; t < T; t++) pos[t] = t;
  std::vector<int32_t> sorted = tok;
  std::sort(sorted.begin(), sorted.end());
  const double U = static_cast<double>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());

  // ---- embeddings
  {
    Tensor tokens = buf.ints(tok), prow = buf.ints(pos_rows), p = buf.ints(pos);
    Tensor wte = buf.rand(size_t(Vp) * C, bf, 0.02f), wpe = buf.rand(size_t(T) * C, bf, 0.02f);
    Tensor x = buf.zeros(NC, bf), dx = buf.rand(NC, bf, 1);
    Tensor dwte = buf.zeros(size_t(Vp) * C, f32), dwpe = buf.zeros(size_t(T) * C, f32);
    b.run({sec, "embedding_forward", nshape, false, NC * 2 * s + 4.0 * N, "N*C*2s + 4N", A},
          [&] { ops.embedding_forward(x, tokens, wte, N, C, 0, Vp); });
    b.run({sec, "position_forward", nshape, false, NC * 2 * s + double(T) * C * s, "N*C*2s + T*C*s", A},
          [&] { ops.position_forward(x, wpe, prow, 1, N, C); });
    b.run({sec, "embedding_backward", nshape + " U=" + std::to_string(int(U)), false,
           NC * s + 2 * U * C * g + 4.0 * N, "N*C*s + 2*U*C*4 + 4N (U distinct tokens)", A},
          [&] { ops.embedding_backward(dwte, dx, tokens, N, C, 0, Vp); });
    b.run({sec, "position_backward", nshape, false, NC * s + 2.0 * T * C * g, "N*C*s + 2*T*C*4", A},
          [&] { ops.position_backward(dwpe, dx, p, B, T, C); });
  }
  buf.clear();

  // ---- LayerNorm, residual add, the memsets of backward
  {
    Tensor x = buf.rand(NC, bf, 1), out = buf.zeros(NC, bf), dout = buf.rand(NC, bf, 1), dx = buf.zeros(NC, bf);
    Tensor w = buf.rand(C, bf, 1), bias = buf.rand(C, bf, 0.1f), dw = buf.zeros(C, f32), db = buf.zeros(C, f32);
    Tensor mean = buf.zeros(N, f32), rstd = buf.zeros(N, f32);
    // Forward: every LayerNorm but the first block's ln_1 runs fused with the residual add before
    // it (DecoderStage), so the plain add is no longer a step op: its row stays for comparison.
    const double ln_calls = A * (2 * L + 1);
    b.run({sec, "layernorm_forward", nshape, false, NC * 2 * s + 8.0 * N + 2.0 * C * s, "N*C*2s + 8N + 2Cs", A},
          [&] { ops.layernorm_forward(out, mean, rstd, x, w, bias, N, C); });
    b.run({sec, "residual_layernorm_forward", nshape, false, NC * 4 * s + 8.0 * N + 2.0 * C * s,
           "N*C*4s (a, b, residual, out) + 8N + 2Cs", A * 2 * L},
          [&] { ops.residual_layernorm_forward(dx, out, mean, rstd, x, dout, w, bias, N, C); });
    b.run({sec, "layernorm_backward", nshape, false, NC * 4 * s + 8.0 * N + 4.0 * C * g,
           "N*C*4s (x, dout, dinp +=) + 8N + 4*C*4", ln_calls},
          [&] { ops.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C); });
    b.run({sec, "add (residual)", nshape, false, NC * 3 * s, "N*C*3s", 0},
          [&] { ops.add(out, x, dout, NC); });
    // Backward zeroes only the residual stream's gradient (once per micro-batch, at the head): the
    // matmuls', GELU's and attention's input gradients are overwritten, not accumulated (Ops).
    b.run({sec, "zero (memset)", nshape, false, NC * s, "N*C*s", A}, [&] { ops.zero(out); });
  }
  buf.clear();

  // ---- the matmuls: forward and backward of each of the five shapes (bf16 in, f32 gradients).
  // The fc forward and the fc projection's backward are counted with their GELU (the "fc + gelu"
  // rows below), so their plain rows count 0 calls: they stay for comparison.
  struct Mm {
    const char* name;
    int IC, OC;
    bool bias;
    double fwd_calls, bwd_calls;
  };
  const Mm mms[] = {{"qkv", C, 3 * C, true, A * L, A * L},
                    {"attn proj", C, C, true, A * L, A * L},
                    {"fc", C, F, true, 0, A * L},
                    {"fc proj", F, C, true, A * L, 0},
                    {"lm head", C, Vp, false, A, A}};
  for (const Mm& mm : mms) {
    const std::string shape = "N=" + std::to_string(N) + " IC=" + std::to_string(mm.IC) + " OC=" + std::to_string(mm.OC);
    Tensor inp = buf.rand(size_t(N) * mm.IC, bf, 1), w = buf.rand(size_t(mm.OC) * mm.IC, bf, 0.02f);
    Tensor bias = mm.bias ? buf.rand(mm.OC, bf, 0.02f) : Tensor{};
    Tensor out = buf.zeros(size_t(N) * mm.OC, bf);
    Tensor dinp = buf.zeros(size_t(N) * mm.IC, bf), dw = buf.zeros(size_t(mm.OC) * mm.IC, f32);
    Tensor dbias = mm.bias ? buf.zeros(mm.OC, f32) : Tensor{};
    const double fl = 2.0 * N * mm.IC * mm.OC;
    b.run({sec, std::string("matmul_forward ") + mm.name, shape, true, fl, "2*N*IC*OC", mm.fwd_calls},
          [&] { ops.matmul_forward(out, inp, w, bias, N, mm.IC, mm.OC); });
    b.run({sec, std::string("matmul_backward ") + mm.name, shape, true, 2 * fl,
           mm.bias ? "4*N*IC*OC (dinp, dW; dbias not counted)" : "4*N*IC*OC (dinp, dW)", mm.bwd_calls},
          [&] { ops.matmul_backward(dinp, dw, dbias, out, inp, w, N, mm.IC, mm.OC); });
    // The same products on the fastest of cuBLASLt's top candidates (precision.matmul_algos=timed;
    // comparison rows, 0 calls), then the heuristic's choices again for every row after these.
    const std::string library = ops.matmul_library();
    if (!library.empty()) {
      ops.use_matmul_algos({library, {}});  // forget the products' choices, so that they are timed
      ops.time_matmul_algos();
      ops.matmul_forward(out, inp, w, bias, N, mm.IC, mm.OC);
      ops.matmul_backward(dinp, dw, dbias, out, inp, w, N, mm.IC, mm.OC);
      ops.use_matmul_algos(ops.timed_matmul_algos());
      b.run({sec, std::string("matmul_forward ") + mm.name + " (timed algorithm)", shape, true, fl, "2*N*IC*OC", 0},
            [&] { ops.matmul_forward(out, inp, w, bias, N, mm.IC, mm.OC); });
      b.run({sec, std::string("matmul_backward ") + mm.name + " (timed algorithm)", shape, true, 2 * fl,
             "4*N*IC*OC", 0},
            [&] { ops.matmul_backward(dinp, dw, dbias, out, inp, w, N, mm.IC, mm.OC); });
      ops.use_matmul_algos({library, {}});
    }
    buf.clear();
  }

  // ---- attention at the model's shape (GPT-2: multi-head, n_kv_heads = n_heads)
  {
    const int hd = C / NH;
    Tensor qkv = buf.rand(NC * 3, bf, 1), out = buf.zeros(NC, bf), lse = buf.zeros(size_t(B) * NH * T, f32);
    Tensor dout = buf.rand(NC, bf, 1), dqkv = buf.zeros(NC * 3, bf);
    const double fl = 4.0 * B * NH * double(T) * T * hd / 2;
    const std::string shape = "B=" + std::to_string(B) + " NH=" + std::to_string(NH) + " T=" + std::to_string(T) +
                              " hd=" + std::to_string(hd);
    b.run({sec, "attention_forward", shape, true, fl, "4*B*NH*T^2*hd/2 (causal)", A * L},
          [&] { ops.attention_forward(out, lse, qkv, B, T, C, NH, NH); });
    b.run({sec, "attention_backward", shape, true, 2.5 * fl, "2.5 x forward", A * L},
          [&] { ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH); });
  }
  buf.clear();

  // ---- GELU, alone (comparison rows) and with the matmuls it can be fused into: the fc forward
  // (matmul_gelu_forward) and the fc projection's backward (matmul_backward_input_dgelu, then dW
  // and dbias), each next to the pair it replaces at the same shapes. The trainer runs the
  // forward apart (decoder_stage.h: selective recompute must rebuild fch_gelu bit for bit) and
  // the backward fused; the step model counts those two rows. CudaOps falls back to the pair
  // where cuBLASLt refuses the epilogue, and then both rows time the same work.
  {
    const size_t n = size_t(N) * F;
    Tensor x = buf.rand(n, bf, 2), y = buf.zeros(n, bf), dy = buf.rand(n, bf, 1), dx = buf.zeros(n, bf);
    const std::string shape = "n=N*4C=" + std::to_string(n);
    b.run({sec, "gelu_forward", shape, false, 2.0 * n * s, "2ns", 0}, [&] { ops.gelu_forward(y, x, n); });
    b.run({sec, "gelu_backward", shape, false, 3.0 * n * s, "3ns (inp, dout, dinp)", 0},
          [&] { ops.gelu_backward(dx, x, dy, n); });
    Tensor ln = buf.rand(NC, bf, 1), wfc = buf.rand(size_t(F) * C, bf, 0.02f), bfc = buf.rand(F, bf, 0.02f);
    Tensor wproj = buf.rand(size_t(C) * F, bf, 0.02f), dres = buf.rand(NC, bf, 1);
    Tensor dwproj = buf.zeros(size_t(C) * F, f32), dbproj = buf.zeros(C, f32);
    const double fl = 2.0 * N * C * F;
    const std::string mshape = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " 4C=" + std::to_string(F);
    b.run({sec, "fc + gelu forward, fused", mshape, true, fl, "2*N*C*4C", 0},
          [&] { ops.matmul_gelu_forward(y, x, ln, wfc, bfc, N, C, F); });
    b.run({sec, "fc + gelu forward, apart", mshape, true, fl, "2*N*C*4C", A * L}, [&] {
      ops.matmul_forward(x, ln, wfc, bfc, N, C, F);
      ops.gelu_forward(y, x, n);
    });
    b.run({sec, "fc proj + gelu backward, fused", mshape, true, 2 * fl, "4*N*4C*C (dinp, dW; dbias not counted)",
           A * L},
          [&] {
            ops.matmul_backward_input_dgelu(dx, dres, wproj, x, N, F, C);
            ops.matmul_backward(Tensor{}, dwproj, dbproj, dres, y, wproj, N, F, C);
          });
    b.run({sec, "fc proj + gelu backward, apart", mshape, true, 2 * fl, "4*N*4C*C (dinp, dW; dbias not counted)", 0},
          [&] {
            ops.matmul_backward(dy, dwproj, dbproj, dres, y, wproj, N, F, C);
            ops.gelu_backward(dx, x, dy, n);
          });
  }
  buf.clear();

  // ---- the loss
  {
    Tensor logits = buf.rand(size_t(N) * Vp, bf, 2), losses = buf.zeros(N, f32), targets = buf.ints(tok);
    const std::string shape = "N=" + std::to_string(N) + " Vp=" + std::to_string(Vp);
    // Training writes dlogits over the logits in place: one read and one write of the row, which
    // is all the kernel moves (it holds the row on chip between the two).
    b.run({sec, "softmax_cross_entropy (train)", shape, false, 2.0 * N * Vp * s + 8.0 * N, "N*Vp*2s + 8N", A},
          [&] { ops.softmax_cross_entropy(losses, logits, targets, N, V, Vp, 1.0f / N); });
    // sum and sum_squares return to the host: their time includes the copy and the round trip.
    b.run({sec, "sum (losses, to host)", "n=" + std::to_string(N), false, 4.0 * N, "4n", A},
          [&] { (void)ops.sum(losses, N); });
  }
  buf.clear();

  // ---- the optimizer step: gradient norm, AdamW, zeroing the gradients, casts
  {
    const std::vector<size_t> sizes = param_sizes(m);
    size_t P = 0;
    for (size_t n : sizes) P += n;
    const std::string shape = "P=" + std::to_string(P);
    Tensor params = buf.rand(P, bf, 0.02f), master = buf.rand(P, f32, 0.02f), grad = buf.rand(P, f32, 0.01f);
    Tensor mom = buf.zeros(P, f32), var = buf.zeros(P, f32);
    b.run({sec, "sum_squares (grad norm, to host)", shape, false, 4.0 * P, "4P (f32 gradients)", 1},
          [&] { (void)ops.sum_squares(grad, P); });
    int t = 1;
    b.run({sec, "adamw_update (one call)", shape, false, 30.0 * P, "30P (grad, master, m, v; master, m, v, bf16 param)",
           0},
          [&] { ops.adamw_update(params, master, grad, mom, var, P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t++, 1.0f); });
    b.run({sec, "adamw_update (per tensor, " + std::to_string(sizes.size()) + " calls)", shape, false, 30.0 * P,
           "30P", 1},
          [&] {
            size_t off = 0;
            for (size_t n : sizes) {
              ops.adamw_update(params.slice(off, n), master.slice(off, n), grad.slice(off, n), mom.slice(off, n),
                               var.slice(off, n), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f);
              off += n;
            }
            t++;
          });
    b.run({sec, "zero (f32 gradients)", shape, false, 4.0 * P, "4P", 1}, [&] { ops.zero(grad); });
    b.run({sec, "cast f32 -> bf16 (copy)", shape, false, 6.0 * P, "P*(4+2)", 0}, [&] { ops.copy(params, master, P); });
    b.run({sec, "cast bf16 -> f32 (copy)", shape, false, 6.0 * P, "P*(2+4)", 0}, [&] { ops.copy(master, params, P); });
    b.run({sec, "scale (f32)", shape, false, 8.0 * P, "2P*4", 0}, [&] { ops.scale(grad, 1.0f, P); });
  }
  buf.clear();
}

}  // namespace pt::kernel_bench
