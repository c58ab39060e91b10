// MoeLayer: the routed-experts half of a sparse (mixture-of-experts) block's MLP, Mixtral's
// block_sparse_moe, run through Ops on the rows of the residual stream this rank holds:
//
//   logits = x @ router^T                                   [rows, E]
//   probs = softmax(logits); each token's top_k experts, weights renormalised over them
//   x_perm = x's rows copied to their experts' groups       [rows k, C] (dropless: every choice)
//   for each expert e, on its rows:  y_e = down_e(silu(gate_e(x)) * up_e(x))
//   out[n] = sum_j weight[n, j] y[row of (n, j)]            [rows, C]
//
// Routing is deterministic: the same token reaches the same experts, and each expert sees its
// tokens in (token, choice) order, on every layout. No token is ever dropped: the permuted
// buffers are sized for every choice (rows x top_k rows), which is the layer's whole memory
// bound (there is no capacity factor to tune).
//
// Everything runs where the tensors are: the routing plan (each expert's rows, Ops::moe_route),
// the balancing loss and the experts, as two grouped products over the device's row offsets
// (Ops::grouped_matmul_*), so on a GPU a sparse block never waits for the host. Expert parallel
// (the all-to-all's sizes) and FP8 experts (per-expert scales) read the offsets on the host and
// run the experts one by one; the stats reach the host once per take_stats.
//
// The load-balancing loss (Switch Transformer / Hugging Face's Mixtral): over the micro-batch's
// tokens, f_i = the share of tokens with expert i among their choices, P_i = the mean router
// probability of expert i, aux = E sum_i f_i P_i (1 x top_k when perfectly even). Its statistics
// are summed over every rank that holds part of the micro-batch's tokens (`token_groups`: the
// sequence-parallel tp group, the cp group), so it is the same on every layout. Its gradient
// reaches each token's probabilities as d aux / d probs[n, i] = E f_i / tokens (f_i is a count,
// not differentiated), times the caller's aux_weight.
//
// Expert parallel (`ep_group` of ep data-parallel ranks): rank r runs experts
// [r E/ep, (r + 1) E/ep). After routing, each rank sends every (token, choice) row to the rank
// of its expert and receives the rows of its own experts from every rank (all_to_all, blocks
// padded to the largest count, which every rank knows after one all_gather of the counts); its
// experts run on their rows grouped by expert in (source rank, token, choice) order, and the
// outputs go back the same way before the combine. Backward sends the outputs' gradients the same
// way and the inputs' gradients back. A rank holds its own experts only: MoeParams' up and down
// (and their gradients) are [E/ep, 2H, C] and [E/ep, C, H], this rank's experts in order, held in
// the trainer's expert ParamStore and reduced over the ranks that hold the same experts
// (core/model/expert_split.h). The routed buffers on the experts' side hold up to
// ep x rows x top_k rows: every token of the group may choose this rank's experts.
//
// Tensor parallel: the routed experts are not split; each tp rank routes the rows it holds. Under
// sequence parallel those are its own rows, so the router's and experts' gradients are partial
// and summed over tp here (like a norm weight's); without it every tp rank holds every row and
// computes the same gradients. Recompute: what backward needs is always kept (per micro-batch
// slot), whatever recompute.mode says; it is rows x top_k x (2 C + 3 expert_hidden) values.
//
// FP8 (enable_fp8; precision.fp8_layers names experts): each expert's up and down products run
// through an Fp8Linear, under delayed scaling only. An expert's rows are a different set of
// tokens under each layout (sequence and context parallel split a micro-batch's rows over ranks,
// expert parallel joins several ranks' micro-batches in one product), so a scale taken from the
// rows at hand would make every layout quantise differently; delayed scaling's history is the
// largest over every rank and micro-batch of the step (merged over tp and dp x cp, which holds
// the ep group), the same under every layout. Until a history exists (the first step) the
// products run in the compute dtype and only record their operands' amaxes. An expert records its
// weights' amaxes every forward, chosen or not; one that received no row in the whole history
// scales its input and output gradient as an all-zero tensor does (scale 1; satfinite) until it
// has. The GPU's FP8 weight-gradient product takes a multiple of 16 rows (its inner dimension):
// where an expert's row count is not one, its rows are copied into buffers padded with zero rows
// for that product (zeros add nothing; on both backends, so they compute alike).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/dist/comm.h"
#include "core/model/architecture.h"
#include "core/ops/ops.h"
#include "core/parallel/fp8_linear.h"

namespace pt {

// A sparse block's router and routed experts (or their gradients): role tensors.
struct MoeParams {
  Tensor router;  // [E, C]
  Tensor up;      // [E/ep, 2H, C]: the experts this rank runs (all E without expert parallel)
  Tensor down;    // [E/ep, C, H]
};

// What the training forwards of one step routed, for the log: summed over micro-batches and
// sparse layers since the last take_stats().
// Sums, so that ranks' statistics add up (the trainer divides by layer_batches).
struct MoeStats {
  double aux_sum = 0;        // each (sparse layer, micro-batch)'s aux loss
  double max_load_sum = 0;   // each one's busiest expert's load over an even share: f_max E / top_k
                             // (1: perfectly even; E / top_k: every token on the same experts)
  double layer_batches = 0;  // how many (sparse layer, micro-batch) values were summed
  // With MoeLayer::record_routing on: each training forward's choices, [rows, top_k] expert ids
  // in forward order (a tool's view, e.g. reference_dump: a low-precision backend may route a
  // near-tie otherwise than float64, and a reference must then follow its choices).
  std::vector<int32_t> routing;
};

class MoeLayer {
 public:
  using Alloc = std::function<Tensor(size_t, DType)>;
  // `rows`: the most tokens one forward routes; `layers` sparse layers in `slots` micro-batch
  // slots each keep their activations. `token_groups`: the groups the micro-batch's tokens are
  // spread over (their statistics are summed); `grad_group`: the group whose ranks' gradients
  // are partial sums (sequence-parallel tp), or null. Buffers come from `alloc` (the owner's,
  // so it counts and frees them).
  MoeLayer(Ops& ops, const Architecture& arch, int rows, int layers, int slots, std::vector<Comm*> token_groups,
           Comm* grad_group, const Alloc& alloc, Comm* ep_group = nullptr);

  // out [n, C] (overwritten) = the routed experts' output for x [n, C], n <= rows, keeping what
  // backward needs in (slot, layer). aux_weight: d(objective)/d(aux), the scale of the balancing
  // loss's gradient; `training`: count this forward (and its aux) in the step's statistics.
  void forward(int slot, int layer, Tensor out, Tensor x, int n, const MoeParams& p, float aux_weight, bool training);
  // dx [n, C] += the gradient of x; the parameters' gradients g accumulate (+=).
  void backward(int slot, int layer, Tensor dx, Tensor dout, Tensor x, int n, const MoeParams& p, const MoeParams& g);

  // The experts' products in FP8 under delayed scaling (see above): `state` (not owned) keeps
  // their amaxes at the sites `sites` numbers (sparse block `layer`, expert e, up or down). The
  // padded rows' buffers come from `alloc`; the FP8 scratch is Fp8Linear's (fp8_scratch_bytes
  // counts both). Before the first forward.
  void enable_fp8(Fp8Delayed* state, const Fp8Sites& sites, Fp8Format grad_format, const Alloc& alloc);
  // Bytes enable_fp8 adds, for experts of hidden width H, top_k k, d_model C, `rows` rows: the
  // padded rows (through alloc) and the FP8 products' scratch (fp8_products_bytes, outside it).
  static size_t fp8_scratch_bytes(int k, int H, int C, int rows, DType act, int ep = 1);
  size_t fp8_products_bytes() const;

  MoeStats take_stats();
  // Keep every training forward's choices in the stats (off: a training step's choices would be
  // rows x top_k x sparse layers of host memory for no one).
  void record_routing(bool on) { record_routing_ = on; }
  bool records_routing() const { return record_routing_; }
  // The training forwards counted since the last take_stats (MoeStats::layer_batches): what a
  // replayed recording of a forward adds to and a failed one restores (DecoderStage::HostMarks).
  double counted_batches() const { return stats_.layer_batches; }
  void set_counted_batches(double n) { stats_.layer_batches = n; }
  // Bytes one (slot, layer) keeps, and the shared scratch (with `grad_group`: the partial
  // gradients' buffer), for E experts of hidden width H, top_k k, d_model C: the memory plan
  // counts them (core/train/memory_plan.cpp).
  static size_t kept_bytes(int E, int k, int H, int C, int rows, DType act, int ep = 1);
  static size_t scratch_bytes(int E, int k, int H, int C, int rows, DType act, bool grad_group, int ep = 1);

 private:
  // Where the (token, choice) rows travel under expert parallel, per forward (host).
  // A run of rows between an all_to_all buffer of padded blocks and a buffer of rows.
  struct Run {
    size_t block_row = 0, row = 0, rows = 0;
  };
  struct Exchange {
    int block = 0;              // rows per all_to_all block: the most any rank sends any rank
    std::vector<Run> sent;      // this rank's permuted rows for each rank -> send block r
    std::vector<Run> received;  // receive block r's rows for each of this rank's experts -> the experts' rows
  };
  struct Kept {
    Tensor probs, topk_expert, topk_weight, slot_of, x_perm, y, dprobs_all;
    Tensor route_offsets;  // [E + 1] i32, on the device: each expert's rows in x_perm
    int rows = 0;          // the forward's routed rows, n top_k
    // The experts' side: their input, hidden, activation and output rows, grouped by (this
    // rank's) expert. Without expert parallel ex and ey are x_perm and y.
    Tensor ex, eh, eact, ey;
    std::vector<int> offsets;  // host, per-expert path only: each of this rank's experts' rows in ex
    Exchange xchg;
  };
  Kept& kept(int slot, int layer);
  // Rows in the permuted order (grouped by expert over all E) -> the experts' side, and back:
  // with expert parallel through the all-to-all, else the same buffer.
  void to_experts(Tensor expert_rows, Tensor permuted, const Exchange& x);
  void from_experts(Tensor permuted, Tensor expert_rows, const Exchange& x);
  // Copies each run into the blocks (into_blocks) or out of them.
  void copy_runs(const std::vector<Run>& runs, Tensor blocks, Tensor rows, bool into_blocks);
  // From every rank's per-expert counts (all: [ep][E]) and this rank's routing offsets: the
  // exchange, and the rows of each of this rank's experts on the experts' side (offsets).
  Exchange plan_exchange(const std::vector<float>& all, const std::vector<int>& route_offsets,
                         std::vector<int>& offsets) const;
  // aux for the routing of n rows (s.route_offsets, s.probs), its statistics summed over the token
  // groups; writes its gradient to s.dprobs_all and, when training, adds aux to the stats.
  void balancing_loss(Kept& s, int n, float aux_weight, bool training);
  // The experts as grouped products over the device's offsets (no host round trip): without
  // expert parallel (whose all-to-all is sized on the host) and FP8 (whose products are per expert).
  bool grouped() const { return !ep_ && !fp8_; }
  // This rank's experts on their rows, and their backward (dx_rows overwritten, grads +=).
  void run_experts(int layer, const Kept& s, const MoeParams& p);
  void experts_backward(int layer, const Kept& s, Tensor dy_rows, Tensor dx_rows, const MoeParams& p,
                        const MoeParams& g);
  // One expert product x [m, IC] @ w [OC, IC]^T into out, and its backward (dinp overwritten, dw
  // +=): in FP8 once the delayed history exists, else in the compute dtype (recording the
  // operands' amaxes when FP8 is on).
  void expert_forward(Tensor out, Tensor x, Tensor w, int m, int IC, int OC, Fp8Site site);
  void expert_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor x, Tensor w, int m, int IC, int OC, Fp8Site site);
  // `src` [m, cols] in `pad`'s first m rows, zero rows after it to m16.
  Tensor padded(Tensor pad, Tensor src, int m, int m16, int cols);
  Fp8Site expert_site(int layer, int local_expert, bool down) const;

  Ops& ops_;
  int E_, k_, H_, C_, rows_;
  std::vector<Comm*> token_groups_;
  Comm* grad_group_;
  Comm* ep_;          // null: no expert parallel
  int ep_size_ = 1, first_expert_ = 0, local_experts_ = 0;
  std::vector<Kept> kept_;  // slot-major
  int layers_;
  // scratch
  Tensor logits_, dlogits_, dy_, dact_, dh_, dx_perm_, dweight_, dx_router_, grad_sum_;
  // the balancing loss's statistics [2 E + 1], and the stats' device sums (aux, max load) since
  // the last take_stats
  Tensor balance_sums_, stats_sums_;
  // expert parallel: the all-to-all's padded send and receive buffers, the counts' exchange, and
  // the experts' side of the gradients
  Tensor send_, recv_, counts_, all_counts_, edy_, edx_;
  MoeStats stats_;
  bool record_routing_ = false;
  // FP8 (enable_fp8): the products, over a group of one (the experts are whole on a rank), the
  // delayed state and its sites, and the padded rows of a weight-gradient product's operands.
  std::unique_ptr<Comm> fp8_group_;
  std::unique_ptr<Fp8Linear> fp8_;
  Fp8Delayed* fp8_state_ = nullptr;
  Fp8Sites fp8_sites_;
  Tensor pad_x_, pad_dout_;
};

}  // namespace pt
