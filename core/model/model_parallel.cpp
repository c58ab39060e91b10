#include "core/model/model_parallel.h"

#include <string>

namespace pt {

StageDims StageDims::make(const ModelSection& m, int B, int seq_len, int tp, bool sp, int cp, int ep, int dp_cp) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw ConfigError(what);
  };
  need(tp >= 1 && cp >= 1, "tensor and context parallel degrees must be at least 1");
  need(seq_len % cp == 0, "parallel.cp=" + std::to_string(cp) + " must divide batch.seq_len=" + std::to_string(seq_len));
  const Architecture a = describe_architecture(m);
  need(m.n_heads % tp == 0, "parallel.tp=" + std::to_string(tp) + " must divide model.n_heads=" + std::to_string(m.n_heads));
  need(a.n_kv_heads % tp == 0,
       "parallel.tp=" + std::to_string(tp) + " must divide model.n_kv_heads=" + std::to_string(a.n_kv_heads));
  need(a.ffn_hidden % tp == 0,
       "parallel.tp=" + std::to_string(tp) + " must divide model.ffn_hidden=" + std::to_string(a.ffn_hidden));
  need(m.padded_vocab % tp == 0,
       "parallel.tp=" + std::to_string(tp) + " must divide model.padded_vocab=" + std::to_string(m.padded_vocab));
  StageDims d;
  d.B = B;
  d.T = seq_len / cp;
  d.N = B * d.T;
  d.sp = sp && tp > 1;
  need(!d.sp || d.N % tp == 0, "parallel.sequence_parallel: the " + std::to_string(d.N) +
                                   " tokens of a micro-batch on one rank (micro_batch_size x seq_len / cp) must "
                                   "divide by parallel.tp=" + std::to_string(tp));
  d.rows = d.sp ? d.N / tp : d.N;
  d.C = m.d_model;
  d.Cl = m.d_model / tp;
  d.NHl = m.n_heads / tp;
  d.NKVl = a.n_kv_heads / tp;
  d.QKVl = a.qkv_width() / tp;
  // The widest dense MLP of any block (an MoE model's sparse blocks may have a narrower one of
  // shared experts, or none); the stage sizes its buffers by it.
  const int F = a.max_mlp_hidden();
  need(F % tp == 0, "parallel.tp=" + std::to_string(tp) + " must divide the MLP width " + std::to_string(F));
  d.Fl = F / tp;
  d.Ul = a.up_width(F) / tp;
  d.Vl = m.padded_vocab / tp;
  d.tp = tp;
  d.cp = cp;
  d.ep = a.n_experts > 0 ? ep : 1;
  d.dp_cp = dp_cp;
  d.arch = a;
  return d;
}

}  // namespace pt
