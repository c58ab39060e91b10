#include "core/plan/stage_compute.h"

#include <cmath>

#include "core/common/error.h"
#include "core/model/architecture.h"
#include "core/model/decoder_stage.h"
#include "core/model/head_chunks.h"
#include "core/model/pipeline_stages.h"
#include "core/parallel/fp8_linear.h"
#include "core/plan/step_time.h"

namespace pt {

namespace {

// Forward and backward seconds of one piece of work.
struct Cost {
  double forward = 0, backward = 0;
  Cost& operator+=(const Cost& o) {
    forward += o.forward;
    backward += o.backward;
    return *this;
  }
};

Cost matmul(const KernelTable& k, double n, double ic, double oc) {
  return {k.matmul_s(n, ic, oc, false), k.matmul_s(n, ic, oc, true)};
}

// How the blocks' FP8 layers run: which, and their speed over bf16's.
struct Fp8Plan {
  Fp8Recipe recipe;
  double speedup = 0;  // FP8 peak / bf16 peak
};

// An FP8 layer's product: measured if the table has it, else bf16's at the peaks' ratio.
double fp8_product_s(const KernelTable& k, const Fp8Plan& f, double n, double ic, double oc, bool backward) {
  const double measured = k.measured_fp8_matmul_s(n, ic, oc, backward);
  return measured > 0 ? measured : k.matmul_s(n, ic, oc, backward) / f.speedup;
}

// Quantising one tensor of `elems` values of `s` bytes: the amax pass reads it (not under delayed
// scaling, whose scale comes from earlier steps), the cast reads it again and writes one byte a
// value (the table's fp8_amax / fp8_quantize rows when measured, else its median memory-bound rate).
double fp8_cast_s(const KernelTable& k, double elems, double s, bool delayed) {
  return (delayed ? 0 : k.memory_s("fp8_amax", elems * s)) + k.memory_s("fp8_quantize", elems * (s + 1));
}

// One FP8 layer, x [n, ic] -> [n, oc]: forward quantises x and w; backward dout, w^T, dout^T, x^T.
Cost fp8_casts(const KernelTable& k, double n, double ic, double oc, double s, bool delayed) {
  const double x = fp8_cast_s(k, n * ic, s, delayed), w = fp8_cast_s(k, oc * ic, s, delayed),
               dout = fp8_cast_s(k, n * oc, s, delayed);
  return {x + w, 2 * dout + w + x};
}

// A linear layer x [n, ic] -> [n, oc], in FP8 when `in_fp8` (its casts added to `casts`): its
// weight is cast `weight_casts` times a pass (once per chunk of the LM head's rows; one weight per
// routed expert).
Cost linear(const KernelTable& k, const Fp8Plan& fp8, bool in_fp8, double n, double ic, double oc, double s,
            Cost& casts, double weight_casts = 1) {
  if (!in_fp8) return matmul(k, n, ic, oc);
  Cost c = fp8_casts(k, n, ic, oc, s, fp8.recipe.delayed);
  const double w = fp8_cast_s(k, oc * ic, s, fp8.recipe.delayed) * (weight_casts - 1);
  c += {w, w};
  casts += c;
  return Cost{fp8_product_s(k, fp8, n, ic, oc, false) + c.forward, fp8_product_s(k, fp8, n, ic, oc, true) + c.backward};
}

// One block of the stage's layers on one rank.
struct BlockCost {
  Cost cost;
  double attention_forward = 0;  // what selective recompute redoes
  double attention_cast = 0;     // of it: FP8 attention's cast of q, k, v
  Cost fp8_casts;                // of cost: the FP8 layers' casts
};

BlockCost block_cost(const KernelTable& k, const Architecture& a, const RunConfig& cfg, const Fp8Plan& fp8, int layer,
                     double s) {
  const auto& par = cfg.parallel;
  const auto& b = cfg.batch;
  const double tp = par.tp, n = double(b.micro_batch_size) * b.seq_len / par.cp, c = a.d_model;
  const double norm_rows = par.sequence_parallel ? n / tp : n;
  BlockCost out;
  Cost& x = out.cost;
  // A block's linear layer, in FP8 when the recipe says so.
  auto block_linear = [&](Fp8Layer layer, double rows, double ic, double oc) {
    return linear(k, fp8, fp8.recipe.on(layer), rows, ic, oc, s, out.fp8_casts);
  };
  // The two norms (the residual add fused into them) and their backward.
  x.forward += 2 * k.memory_s("residual_layernorm_forward", norm_rows * c * 4 * s + 8 * norm_rows + 2 * c * s);
  x.backward += 2 * k.memory_s("layernorm_backward", norm_rows * c * 4 * s + 8 * norm_rows + 16 * c);
  x += block_linear(Fp8Layer::qkv, n, c, a.qkv_width() / tp);
  const double heads = a.n_heads / tp;
  out.attention_forward = k.attention_s(b.micro_batch_size, heads, b.seq_len, a.head_dim, false) / par.cp;
  Cost attention{out.attention_forward, k.attention_s(b.micro_batch_size, heads, b.seq_len, a.head_dim, true) / par.cp};
  if (fp8.recipe.on(Fp8Layer::attention)) {
    // FP8 attention (core/common/fp8_attention.h): the forward's products at the FP8 rate, after a
    // cast of q, k, v; the backward is bf16's after a dequantising pass (the cast, then the
    // values written back in the compute dtype).
    const double qkv = n * a.qkv_width() / tp, cast = fp8_cast_s(k, qkv, s, false);
    const Cost casts{cast, cast + k.memory_s("fp8_dequantize", qkv * (1 + s))};
    out.attention_forward = out.attention_forward / fp8.speedup + casts.forward;
    out.attention_cast = casts.forward;
    attention = {out.attention_forward, attention.backward + casts.backward};
    out.fp8_casts += casts;
  }
  x += attention;
  x += block_linear(Fp8Layer::attn_out, n, a.q_width() / tp, c);
  // The MLP: dense (or a sparse block's shared experts), its hidden width split over tp; then
  // the routed experts, whole on every tp rank (core/model/moe_layer.h), which routes the rows
  // it holds: n/tp under sequence parallel, all n without. Each in FP8 as the recipe says (the
  // experts as one product over all their rows, casting each of the rank's experts' weights).
  auto mlp = [&](double rows, double hidden, double split, bool up_fp8, bool down_fp8, double weights = 1) {
    if (hidden <= 0) return;
    x += linear(k, fp8, up_fp8, rows, c, a.up_width(static_cast<int>(hidden)) / split, s, out.fp8_casts, weights);
    const double h = rows * hidden / split;
    if (a.mlp == MlpKind::swiglu) x += {k.memory_s("swiglu_forward", 3 * h * s), k.memory_s("swiglu_backward", 5 * h * s)};
    else x += {k.memory_s("gelu_forward", 2 * h * s), k.memory_s("gelu_backward", 3 * h * s)};
    x += linear(k, fp8, down_fp8, rows, hidden / split, c, s, out.fp8_casts, weights);
  };
  mlp(n, a.mlp_hidden(layer), tp, fp8.recipe.on(Fp8Layer::mlp_up), fp8.recipe.on(Fp8Layer::mlp_down));
  if (a.sparse_block(layer)) {
    x += matmul(k, norm_rows, c, a.n_experts);  // the router, over the rows the rank routes
    const bool experts = fp8.recipe.on(Fp8Layer::experts);
    mlp(norm_rows * a.top_k, a.expert_hidden, 1, experts, experts, double(a.n_experts) / par.ep);
  }
  return out;
}

}  // namespace

std::vector<StageCompute> stage_compute(const RunConfig& cfg, const KernelTable& k, double fp8_speedup) {
  const Fp8Plan fp8{fp8_recipe(cfg.precision),
                    fp8_speedup};
  if (fp8.recipe.any() && !(fp8_speedup > 0))
    throw ConfigError("precision.fp8=" + cfg.precision.fp8 + " needs a GPU with FP8 tensor cores (an FP8 peak > 0)");
  const auto& par = cfg.parallel;
  const auto& b = cfg.batch;
  const Architecture a = describe_architecture(cfg.model);
  const double s = static_cast<double>(dtype_size(planned_dtype(cfg)));
  const double n = double(b.micro_batch_size) * b.seq_len / par.cp, c = a.d_model;
  const Recompute recompute = parse_recompute(cfg.recompute.mode);
  std::vector<StageCompute> out;
  for (int r = 0; r < par.pp; r++) {
    StageCompute st;
    for (const StageLayers& chunk : pipeline_chunks(cfg.model, par, r)) {
      for (int l = chunk.first_layer; l < chunk.end_layer; l++) {
        const BlockCost blk = block_cost(k, a, cfg, fp8, l, s);
        st.forward_s += blk.cost.forward;
        st.backward_s += blk.cost.backward;
        st.fp8_casts_s += blk.fp8_casts.forward + blk.fp8_casts.backward;
        if (recompute == Recompute::selective) {
          st.recompute_s += blk.attention_forward;
          st.fp8_casts_s += blk.attention_cast;
        }
        if (recompute == Recompute::full) {
          st.recompute_s += blk.cost.forward;
          st.fp8_casts_s += blk.fp8_casts.forward;
        }
      }
      if (chunk.embedding) {
        // The lookups scatter into U distinct rows: a uniform draw of n tokens from the
        // vocabulary hits V(1 - e^(-n/V)) of them.
        const double v = a.vocab_size, distinct = v * (1 - std::exp(-n / v));
        st.forward_s += k.memory_s("embedding_forward", n * c * 2 * s + 4 * n) + k.memory_s("zero (memset)", n * c * s);
        st.backward_s += k.memory_s("embedding_backward", n * c * s + 2 * distinct * c * 4 + 4 * n);
        if (a.positions == PositionKind::learned) {
          st.forward_s += k.memory_s("position_forward", n * c * 2 * s + b.seq_len * c * s);
          st.backward_s += k.memory_s("position_backward", n * c * s + 2.0 * b.seq_len * c * 4);
        }
      }
      if (chunk.head) {
        // The LM head runs in chunks of rows (core/model/head_chunks.h); in FP8 each chunk casts
        // the weight again.
        const int vocab = a.padded_vocab / par.tp;
        const int rows = static_cast<int>(n), chunk_rows = head_chunk_rows(rows, vocab, planned_dtype(cfg));
        const double chunks = std::ceil(double(rows) / chunk_rows);
        Cost casts;
        const Cost head = linear(k, fp8, fp8.recipe.on(Fp8Layer::lm_head), n, c, vocab, s, casts, chunks);
        st.fp8_casts_s += casts.forward + casts.backward;
        st.forward_s += k.memory_s("layernorm_forward", n * c * 2 * s + 8 * n + 2 * c * s) + head.forward +
                        k.memory_s("softmax_cross_entropy", n * vocab * 2 * s + 8 * n) + k.memory_s("sum (losses", 4 * n);
        st.backward_s += k.memory_s("layernorm_backward", n * c * 4 * s + 8 * n + 16 * c) + head.backward;
      }
    }
    out.push_back(st);
  }
  return out;
}

double optimizer_step_s(const KernelTable& k, double p) {
  return k.memory_s("sum_squares", 4 * p) + k.memory_s("adamw_update (per tensor", 30 * p) +
         k.memory_s("zero (f32 gradients)", 4 * p);
}

}  // namespace pt
