// CpAttention: the causal self-attention of a Stage's blocks on this rank's tokens, whichever
// way the sequence is split: with no context parallelism it is Ops::attention_forward/backward;
// with cp > 1 ring attention (ring_attention.h, zigzag split) or Ulysses (ulysses.h, contiguous
// split). All three take the same tensors (qkv [B, T_local, (NH + 2 NKV) HS], out
// [B, T_local, C], lse B*NH*T_local f32), so the model code makes one call whatever the layout.
// NKV is the number of key/value heads (grouped-query attention; NKV == NH for GPT-2).
#pragma once
#include <memory>
#include <string_view>

#include "core/dist/comm.h"
#include "core/ops/ops.h"
#include "core/parallel/local_attention.h"
#include "core/parallel/zigzag.h"

namespace pt {

enum class CpImpl { ring, ulysses };
// "ring" | "ulysses" (parallel.cp_impl); ConfigError otherwise.
CpImpl parse_cp_impl(std::string_view name);
// How each implementation splits the sequence over the cp ranks.
CpSplitKind cp_split_kind(CpImpl impl);

class RingAttention;
class UlyssesAttention;

class CpAttention {
 public:
  // cp: the context-parallel group (nullptr or a group of one: plain attention). B, T_local, C,
  // NH and NKV are this rank's (after any tensor-parallel head split). Allocates the scratch of
  // the chosen implementation in `dtype` (scratch_bytes()). `prec`: the attention the local heads
  // run (local_attention.h); FP8 needs a backend that runs it at this head size and is refused
  // under ring attention (ConfigError naming the keys; core/common/fp8_attention.h says why).
  CpAttention(Ops& ops, Comm* cp, CpImpl impl, int B, int T_local, int C, int NH, int NKV, DType dtype,
              AttentionPrecision prec = AttentionPrecision::compute);
  ~CpAttention();
  CpAttention(const CpAttention&) = delete;
  CpAttention& operator=(const CpAttention&) = delete;

  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv = the gradient of forward's out (out and lse are forward's), overwritten like
  // Ops::attention_backward's.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);

  // Bytes of scratch the context-parallel implementation holds (0 without cp); the formula,
  // so the memory planner can use it without building one.
  static size_t scratch_bytes(CpImpl impl, int cp, int B, int T_local, int C, int NH, int NKV, DType dtype);

 private:
  Ops& ops_;
  int B_, T_, C_, NH_, NKV_;
  AttentionPrecision prec_;
  std::unique_ptr<RingAttention> ring_;
  std::unique_ptr<UlyssesAttention> ulysses_;
};

}  // namespace pt
