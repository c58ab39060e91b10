// DecoderStage: a consecutive range of transformer blocks run through the Ops interface: the
// whole model on one pipeline rank, or one chunk of a pipeline (core/model/pipeline_stages.h).
// What the blocks are is the model's Architecture (core/model/architecture.h), read as data:
// the norm (LayerNorm, or RMSNorm without a mean or bias), biases or none, learned positions or
// RoPE (applied in place to the q and k heads of the projection's output, at each token's global
// position), the MLP's activation (GELU, or SwiGLU over a gate | up projection twice as wide),
// grouped-query attention's K/V heads, a tied or untied LM head. Parameters are found by role
// (ParamRole), never by name. "ln1/ln2" below stand for the block's two norms of either kind.
// It holds
//  - with `embedding`: the token (+ position) embedding in front of its blocks; otherwise its
//    input is an activation [B*T, C] received from the previous stage (input(slot));
//  - with `head`: the final norm, the LM head (the token embedding when tied) and the fused
//    softmax cross-entropy over the real (unpadded) vocabulary behind them; otherwise its output
//    is the activation [B*T, C] to send on (output()), and backward starts from the gradient
//    of that output received back (grad_output(slot)).
//
// Micro-batches in flight. A pipeline rank forwards several micro-batches before it backwards
// the first (1F1B: up to pp - rank, AFAB: all m), so what backward needs is kept per micro-batch,
// in two kinds of slots the caller hands out (the pipeline executor, from its action list):
//  - an activation set (`slots.activations` of them): the blocks' kept activations and the
//    token ids, from the micro-batch's forward to its backward;
//  - an I/O set (`slots.io`): the stage's input (received, or the embedding output) and the
//    residual stream's gradient (received, or from the head), from the receive of the input
//    to the send of the input's gradient. A receive can come before the backward that frees a
//    slot, so a stage may need one more of these small sets than of activation sets.
// Buffers that live only while one forward or backward runs (the attention and MLP projections
// before their residual add, everything recompute rebuilds, the backward scratch, the logits)
// are one shared set. The stage's output is one shared buffer too: the pipeline sends it
// before this rank computes anything else (pp_schedule.h's ordering rule), after which it is
// free again.
//
// The head's backward runs at the end of the training forward: the logits' gradient (written in
// place by the fused cross-entropy) goes through the LM head and the final norm at once, and
// only the gradient of the last block's output is kept per micro-batch ([B*T, C] instead of
// the [B*T, padded_vocab] logits). The head runs in chunks of rows (core/model/head_chunks.h:
// logits, cross-entropy, backward, then the next chunk), so one chunk's logits exist at a time.
//
// Activation recompute (recompute.mode), per block, what forward keeps for backward:
//   none       ln1 (+ mean, rstd), qkv, atty, lse, res2, ln2 (+ mean, rstd), fch, fch_gelu,
//              and the block's output (the next block's input): 16 B*T*C + 4 B*T + B*NH*T floats
//              at GPT-2's widths (core/train/memory_plan.h counts every architecture's)
//   selective  qkv, res2, fch and the output: 9 B*T*C (GPT-2). Backward first rebuilds the cheap,
//              memory-heavy rest from them: both norm outputs (and statistics) with one
//              norm forward each, the attention output and its log-sum-exps (the
//              softmax state) with one attention forward, the activation output with one activation.
//              The matmuls (the FLOPs) are never redone.
//   full       only the block's output (the next block's input): B*T*C. Backward re-runs the
//              block's forward up to the MLP's activation from its input, then backpropagates.
// (The last block of a chunk keeps nothing of its own output: it is the stage's output, sent
// on, or consumed at once by the head.) Recompute runs the same kernels on the same inputs, so
// gradients are bitwise those of mode none; where forward computed a norm fused with the
// residual add before it (below), recompute rebuilds it with the plain norm from the stored
// residual, which Ops::residual_layernorm_forward (and residual_rmsnorm_forward) guarantees
// gives the same bits. The rebuilt
// buffers live in the one shared set.
// GPT-2's GELU backward runs inside the MLP projection's input-gradient matmul
// (Ops::matmul_backward_input_dgelu, reading the kept fch) in every mode. Its forward stays
// apart (fc matmul, then gelu_forward): a fused forward's fch_gelu is the GELU of the unrounded
// sum, which selective recompute could not rebuild from the stored fch bit for bit, and every
// mode must give the same bits.
//
// Fused residual adds: every residual add that a norm follows in this stage runs as one
// Ops::residual_layernorm_forward (residual_rmsnorm_forward): res2 = x + attproj with ln_2, and res3 = res2 + fcproj with
// the next block's norm_1 (or the final norm, the last block of the head's stage). The latter runs after
// block l's parameters are released and block l+1's (or the final norm's) acquired, so the
// hooks see the same calls in the same order as without fusion. The last block of a stage
// without the head ends in a plain add (its output is sent on).
//
// Around each block it calls the LayerHooks (core/model/layer_hooks.h), through which ZeRO
// gathers parameters and reduces gradients layer by layer.
//
// Tensor and context parallelism (ModelParallel, core/model/model_parallel.h) live inside the
// stage, so one code path runs under every layout; the shapes are StageDims'.
//  - Tensor parallel (Megatron): the QKV and MLP up-projections are column-parallel, the
//    attention and MLP output projections row-parallel (core/parallel/tensor_parallel.h); each
//    rank runs attention on its n_heads/tp heads. The token embedding is vocab-parallel: each
//    rank looks up the tokens in its rows of the token embedding (zero elsewhere) and the partial embeddings are
//    summed over tp; the LM head is a column-parallel layer over the vocabulary rows, and the loss
//    the vocab-parallel cross-entropy (vocab_parallel_ce.h), so no rank holds the full logits.
//  - Sequence parallel: the residual stream, the norms and the residual adds hold rows/tp
//    tokens per rank; the column-parallel layers all-gather their input, the row-parallel ones
//    reduce-scatter their output (and the reverse in backward). The norm weights then get a
//    partial gradient on each rank, summed over tp before it joins the parameter's gradient;
//    the position embedding's gradient is taken from the all-gathered stream gradient, whole.
//  - Context parallel: the stage sees T/cp tokens of each sequence (the caller passes this
//    rank's tokens and targets, core/parallel/zigzag.h) at their global positions, and its
//    attention runs across the cp group (core/parallel/cp_attention.h). Gradients of every
//    parameter are partial over cp and summed by the data-parallel reduction over dp x cp.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/config/run_config.h"
#include "core/parallel/fp8_linear.h"
#include "core/model/architecture.h"
#include "core/model/layer_hooks.h"
#include "core/model/model_parallel.h"
#include "core/model/moe_layer.h"
#include "core/model/param_store.h"
#include "core/model/pipeline_stages.h"
#include "core/ops/ops.h"

namespace pt {

class CpAttention;
class Comm;
class TensorParallel;
class VocabParallelCrossEntropy;

enum class Recompute { none, selective, full };
// "none" | "selective" | "full" (recompute.mode); ConfigError otherwise.
Recompute parse_recompute(std::string_view mode);
const char* to_string(Recompute mode);

// How many micro-batches a stage holds at once (see above).
struct StageSlots {
  int io = 1;
  int activations = 1;
  bool operator==(const StageSlots&) const = default;
};

// The two slots one micro-batch in flight holds.
struct MicroSlot {
  int io = 0;
  int activations = 0;
};

class DecoderStage {
 public:
  // The whole model, one micro-batch in flight, no recompute, one rank. B x T is the
  // micro-batch shape every forward/backward uses.
  DecoderStage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T);
  // The chunk `layers` with `slots` micro-batches in flight at most, over the tensor- and
  // context-parallel groups `mp` (not owned). T is the whole sequence length; the stage holds
  // T / cp tokens of each sequence. `store` holds this rank's tensor-parallel pieces
  // (tensor_parallel_table).
  DecoderStage(const ModelSection& model, ParamStore& store, Ops& ops, int B, int T, const StageLayers& layers,
            StageSlots slots, Recompute recompute, const ModelParallel& mp = {}, const Fp8Recipe& fp8 = {});
  ~DecoderStage();
  DecoderStage(const DecoderStage&) = delete;
  DecoderStage& operator=(const DecoderStage&) = delete;

  // Forward of one micro-batch into the slots `at`. tokens (B*T i32 ids on the device; under
  // context parallel this rank's B x T/cp) are read with the embedding, else input(at.io) must
  // hold the received activation; targets (the same shape; < 0: ignored) with the head, which
  // writes the SUM of the per-token losses to loss_sum[0] (f32, on the device; under tensor
  // parallel every tp rank the same sum). Stages without them take null tensors. Nothing waits
  // for the device, so the work can be recorded (Ops::record).
  // dloss != 0: training; the loss gradient per token is dloss and backward(at) must follow.
  // dloss == 0: evaluation; nothing is kept and backward(at) must not be called.
  void forward(MicroSlot at, Tensor tokens, Tensor targets, float dloss, Tensor loss_sum);
  // The same from host ids: uploads them, and returns the loss sum (0 without a head; waits for
  // the device).
  double forward(MicroSlot at, const int32_t* tokens, const int32_t* targets, float dloss);
  // Backpropagates the micro-batch in `at`, accumulating into the parameter gradients.
  // Without the head, grad_output(at.io) must hold the gradient of the output.
  void backward(MicroSlot at);
  // The whole-model form: slots 0.
  double forward(const int32_t* tokens, const int32_t* targets, float dloss) { return forward({}, tokens, targets, dloss); }
  void backward() { backward({}); }

  // Where the received activation goes (no embedding).
  Tensor input(int io_slot) const;
  // After forward, the activation to send (no head); valid until the next forward or backward.
  Tensor output() const;
  // The hidden state the last forward ended with: the final norm's output with the head (what
  // the LM head reads), else output(). The corruption check fingerprints it (run.replay_every_steps).
  Tensor last_hidden() const { return layers_.head ? lnf_ : output_; }
  // Where the received gradient of the output goes (no head).
  Tensor grad_output(int io_slot) const;
  // After backward, the gradient of the input to send back (no embedding); valid until the I/O
  // slot is used again.
  Tensor grad_input(int io_slot) const;

  // What forward and backward leave on the host besides their device work: whether each
  // activation set waits for its backward, and the sparse blocks' count of training forwards
  // (MoeStats::layer_batches). A recorded forward or backward (Ops::record: the pipeline
  // executor's CUDA graphs) runs its host code once; each replay is followed by after_replay,
  // which leaves the marks as the host code would have, and a recording that failed is undone
  // with restore before the work runs for real.
  struct HostMarks {
    std::vector<bool> backward_due;
    double moe_batches = 0;
    bool operator==(const HostMarks&) const = default;
  };
  HostMarks host_marks() const;
  void restore(const HostMarks& marks);
  void after_replay(bool forward, MicroSlot at, float dloss);

  // The data-parallel runtime's hooks (not owned; nullptr: everything is resident).
  void set_hooks(LayerHooks* hooks) { hooks_ = hooks ? hooks : &no_hooks_; }

  // Logits of the last forward, [B*T, padded_vocab / tp] (this rank's vocabulary rows; the
  // head; valid when it ran with dloss == 0 and in one chunk: B*T rows of logits within
  // head_chunks.h's budget, as for the small models that read them).
  Tensor logits() const;
  // Each token's loss of the last forward, [B*T] f32 (this rank's tokens; 0 where the target is
  // < 0; the head; the same on every tp rank): what per-example scores (core/eval) sum.
  Tensor token_losses() const { return losses_; }
  const StageDims& dims() const { return d_; }
  // Bytes of activation memory (every slot, the shared buffers, backward scratch, the context-
  // parallel attention's scratch, and the tensor-parallel layers' and vocab-parallel cross-
  // entropy's communication buffers: these grow during the first step, to the size counted here).
  size_t activation_bytes() const { return activation_bytes_; }
  const StageLayers& layers() const { return layers_; }
  StageSlots slots() const { return {static_cast<int>(io_.size()), static_cast<int>(acts_.size())}; }
  Recompute recompute() const { return recompute_; }
  // The routing statistics of the training forwards since the last call (mixture of experts;
  // zeros for a dense model or a stage without sparse blocks).
  MoeStats take_moe_stats() { return moe_ ? moe_->take_stats() : MoeStats{}; }
  // Keep the training forwards' routing choices in those statistics (MoeStats::routing).
  void record_moe_routing(bool on) {
    if (moe_) moe_->record_routing(on);
  }
  // Delayed FP8 scaling (precision.fp8 = "delayed"; core/parallel/fp8_delayed.h), no-ops
  // otherwise: fp8_begin_step before a step's first micro-batch; fp8_end_step after its last
  // backward, collective over this stage's tp and dp_cp groups (ModelParallel), `keep` false
  // for a skipped step.
  void fp8_begin_step();
  void fp8_end_step(bool keep);
  // The delayed scaling state (its sites numbered as fp8_sites() says); nullptr without it.
  Fp8Delayed* fp8_delayed() { return fp8_delayed_.get(); }
  const Fp8Sites& fp8_sites() const { return fp8_sites_; }

 private:
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj,
        res3;
  };
  struct LayerParams {
    Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
    MoeParams moe;  // a sparse block's router and routed experts
  };
  // One micro-batch's input and gradient.
  struct IoSlot {
    Tensor input;  // the stream entering the first block: embedding output or received activation
    Tensor dres;   // the residual stream's gradient: received (no head) or from the head; in
                   // place through the blocks, it ends as the gradient of `input`
  };
  // One micro-batch's activation set.
  struct ActSlot {
    Tensor tokens;  // embedding: the token ids, for the embedding backward
    std::vector<LayerActs> kept;  // per block: what recompute_ keeps (the rest is null)
    bool backward_due = false;
  };
  LayerParams layer_params(int l, bool grads) const;
  // The parameters (or gradients) of `role` in `layer` (a ParamSpec::layer) as one tensor over
  // its adjacent pieces; null where the architecture has none (biases, learned positions).
  // Read from roles_, so nothing is looked up.
  Tensor role_tensor(ParamRole role, int layer, bool grad) const;
  // The architecture's norm, norm after a residual add, MLP activation and RoPE (in place; with
  // backward, the transpose rotation of a gradient). A null mean is RMSNorm's.
  void norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b);
  void residual_norm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                             Tensor bias);
  void mlp_activation_forward(const LayerActs& a, int l);
  // Block l's dense MLP width on this rank (0: a sparse block without shared experts), and its
  // up-projection's.
  int mlp_local(int l) const { return arch_.mlp_hidden(l) / d_.tp; }
  int up_local(int l) const { return arch_.up_width(arch_.mlp_hidden(l)) / d_.tp; }
  // The index of sparse block l among this stage's (its MoeLayer state).
  int sparse_index(int l) const { return sparse_index_[static_cast<size_t>(l - layers_.first_layer)]; }
  void rope(Tensor qkv, bool backward);
  LayerActs buffers(const ActSlot& s, int l) const;  // kept buffers, the rest from the shared set
  Tensor block_input(const IoSlot& io, const ActSlot& s, int l) const;
  // Runs block l's forward from x into a, up to the MLP projection a.fcproj: the residual add
  // that ends the block (a.res3) is the caller's, fused with the norm that follows where
  // there is one. `ln1_ready`: a.ln1 and its statistics already hold ln_1(x) (computed by the
  // previous block's fused add). `to_gelu`: stop after the activation (full recompute).
  // l: the block; slot: the micro-batch's activation slot (a sparse block keeps its routing there).
  void block_forward(const LayerActs& a, const LayerParams& p, Tensor x, bool ln1_ready, bool to_gelu, int l, int slot);
  // Token + position embedding of this rank's tokens into the residual stream `out`.
  void embed(Tensor out, Tensor tokens);
  void embed_backward(Tensor dres, Tensor tokens);
  // The norm's backward over the residual rows; under sequence parallel its weight gradients are
  // summed over tp first (see the file comment).
  void norm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean, Tensor rstd);
  void recompute_block(const LayerActs& a, const LayerParams& p, Tensor x, int l, int slot);
  void check_slots(MicroSlot at) const;
  const IoSlot& io(int io_slot) const;
  Tensor alloc_act(size_t n, DType dtype);

  StageDims d_;
  const Architecture& arch_ = d_.arch;
  ParamStore& store_;
  // Every role of every layer, found in its store once, when the stage is built (a stage's stores
  // and their tables never change; ZeRO attaches and detaches a layer's buffers, which each read
  // of a ParamStore::Role follows): indexed by ParamSpec::layer + 1 (the embeddings, the blocks,
  // the final norm and head), then by role. Roles the stores do not hold read as null tensors.
  std::vector<std::array<ParamStore::Role, kParamRoles>> roles_;
  LayerHooks no_hooks_;
  LayerHooks* hooks_ = &no_hooks_;
  Ops& ops_;
  StageLayers layers_;
  Recompute recompute_;
  size_t activation_bytes_ = 0;
  std::vector<Tensor> owned_;  // every buffer, released in the destructor

  std::vector<IoSlot> io_;
  std::vector<ActSlot> acts_;
  LayerActs shared_;  // everything no slot keeps (and the projections before their residual add)
  Tensor output_;     // the last block's output
  Tensor pos_, pos_rows_, targets_, lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  Tensor loss_sum_;  // the host form's loss sum (f32 [1])
  int head_rows_ = 0;  // rows of logits the head computes at once (core/model/head_chunks.h)
  // backward scratch
  Tensor dbtc_, dqkv_, dfch_, dfch_gelu_;
  // sequence parallel: every token's embedding (and, in backward, its gradient) before the
  // reduce-scatter / after the all-gather; a norm's partial weight gradients
  Tensor emb_full_, ln_grads_;

  ModelParallel mp_;
  Fp8Recipe fp8_;  // which layers run their products in FP8 (none by default)
  Fp8Sites fp8_sites_;  // the chunk's FP8 layers as delayed scaling numbers them (none without FP8)
  std::unique_ptr<Fp8Delayed> fp8_delayed_;  // delayed scaling's amax histories; null without
  // Block l's layer `layer` FP8 site, or the LM head's (l unused); off when the recipe leaves
  // that layer in the compute dtype.
  Fp8Site fp8_site(int l, Fp8Layer layer) const;
  std::unique_ptr<Comm> own_tp_;  // a group of one when mp.tp is null
  Comm* tp_comm_ = nullptr;
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<CpAttention> attention_;
  std::unique_ptr<VocabParallelCrossEntropy> vocab_ce_;  // tp > 1
  // Mixture of experts: the routed experts of this stage's sparse blocks, and what the current
  // forward passes them (the balancing loss's gradient scale; whether it is a training pass).
  std::unique_ptr<MoeLayer> moe_;
  std::vector<int> sparse_index_;  // per block of the stage: its index in moe_, -1 when dense
  Tensor moe_out_;                 // a sparse block's routed output before it joins the MLP's
  float aux_weight_ = 0.0f;
  bool training_ = false;
};

}  // namespace pt
