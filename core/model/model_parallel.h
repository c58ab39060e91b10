// ModelParallel: the tensor- and context-parallel groups a stage (core/model/decoder_stage.h) runs
// over, and StageDims: the per-rank activation shapes they give a stage, shared by the stage's
// allocation and the memory accounting (core/train/memory_plan.h) so the two cannot disagree.
//
// Tensor parallel (tp ranks): heads and the MLP width are split, so the attention channels
// (q, k, v, the attention output) and the MLP hidden activations are 1/tp per rank; the token
// embedding and the LM head's logits are split over the (padded) vocabulary. The residual
// stream between the parallel pairs is replicated, [B*T, C] on every rank — unless sequence
// parallel is on, which shards it by token ([B*T/tp, C]).
// Context parallel (cp ranks): every activation is 1/cp per rank along the sequence (T/cp tokens
// of each of the B sequences; core/parallel/zigzag.h says which).
#pragma once
#include <cstddef>

#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/model/architecture.h"
#include "core/parallel/cp_attention.h"

namespace pt {

class ParamStore;

struct ModelParallel {
  Comm* tp = nullptr;  // nullptr: no tensor parallel (a group of one)
  bool sequence_parallel = false;
  Comm* cp = nullptr;  // nullptr: no context parallel
  CpImpl cp_impl = CpImpl::ring;
  Comm* ep = nullptr;  // expert parallel (core/model/moe_layer.h); nullptr: every rank runs every expert
  // The stage's data x context-parallel group, over which delayed FP8 scaling merges the step's
  // amaxes (core/parallel/fp8_delayed.h); nullptr: a group of one.
  Comm* dp_cp = nullptr;
  // Expert parallel: the store of this rank's routed experts (core/model/expert_split.h), which
  // the stage reads the expert roles from; nullptr: the stage's own store holds them.
  ParamStore* experts = nullptr;

  int tp_size() const { return tp ? tp->size() : 1; }
  int tp_rank() const { return tp ? tp->rank() : 0; }
  int cp_size() const { return cp ? cp->size() : 1; }
  int cp_rank() const { return cp ? cp->rank() : 0; }
  // Sequence parallel changes nothing with one tp rank.
  bool sp() const { return sequence_parallel && tp_size() > 1; }
};

struct StageDims {
  int B = 0;      // sequences per micro-batch
  int T = 0;      // tokens of each sequence on this rank: seq_len / cp
  int N = 0;      // B * T: the tokens every matmul sees
  int rows = 0;   // tokens of the residual stream on this rank: N / tp under sequence parallel, else N
  int C = 0;      // d_model
  int Cl = 0;     // attention channels on this rank (its query heads, and the attention output): C / tp
  int NHl = 0;    // query heads on this rank: n_heads / tp
  int NKVl = 0;   // key/value heads on this rank: n_kv_heads / tp
  int QKVl = 0;   // the q | k | v projection's width on this rank: (NHl + 2 NKVl) head_dim
  int Fl = 0;     // MLP hidden width on this rank: ffn_hidden / tp (the widest block's, Architecture::max_mlp_hidden)
  int Ul = 0;     // the MLP's up-projection width on this rank: Fl, or 2 Fl with SwiGLU's gate
  int Vl = 0;     // vocabulary rows on this rank: padded_vocab / tp
  int tp = 1, cp = 1;
  bool sp = false;
  int ep = 1;  // expert-parallel ranks (the experts' side of the exchange holds ep x the routed rows)
  int dp_cp = 1;  // data x context-parallel ranks of the stage (delayed FP8 scaling's merge buffer)
  // The model these are the shapes of: what its blocks are and keep besides the widths above
  // (the norm, the positions, the MLP's activation, the routed experts) is read from it, not
  // copied here.
  Architecture arch;
  // LayerNorm keeps a mean per row (and has a bias); RMSNorm neither.
  bool norm_mean() const { return arch.norm == NormKind::layernorm; }
  // A position embedding (else RoPE, which every stage applies).
  bool learned_positions() const { return arch.positions == PositionKind::learned; }
  // A buffer for the gradient of the MLP activation's output (dfch_gelu): SwiGLU's backward takes
  // it; GELU's runs inside the projection's input-gradient matmul and needs none.
  bool act_out_grad() const { return arch.mlp != MlpKind::gelu; }

  size_t lse() const { return static_cast<size_t>(B) * NHl * T; }  // attention log-sum-exps
  size_t rows_c() const { return static_cast<size_t>(rows) * C; }  // one residual-stream tensor
  // B sequences of seq_len tokens (the global micro-batch shape) under tp, sp and cp; throws
  // ConfigError when a dimension does not divide.
  static StageDims make(const ModelSection& model, int B, int seq_len, int tp, bool sp, int cp, int ep = 1,
                        int dp_cp = 1);
};

}  // namespace pt
