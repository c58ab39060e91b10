#include "core/parallel/cp_attention.h"

#include <string>

#include "core/common/error.h"
#include "core/parallel/ring_attention.h"
#include "core/parallel/ulysses.h"

namespace pt {

CpImpl parse_cp_impl(std::string_view name) {
  if (name == "ring") return CpImpl::ring;
  if (name == "ulysses") return CpImpl::ulysses;
  throw ConfigError("parallel.cp_impl=\"" + std::string(name) + "\" must be ring or ulysses");
}

CpSplitKind cp_split_kind(CpImpl impl) { return impl == CpImpl::ring ? CpSplitKind::zigzag : CpSplitKind::contiguous; }

CpAttention::CpAttention(Ops& ops, Comm* cp, CpImpl impl, int B, int T_local, int C, int NH, int NKV, DType dtype,
                         AttentionPrecision prec)
    : ops_(ops), B_(B), T_(T_local), C_(C), NH_(NH), NKV_(NKV), prec_(prec) {
  const bool split = cp && cp->size() > 1;
  if (prec == AttentionPrecision::fp8) {
    const int HS = NH > 0 ? C / NH : 0;
    if (!ops.supports_fp8_attention(HS))
      throw ConfigError("precision.fp8_layers names attention, which this device cannot run in FP8 at head size " +
                        std::to_string(HS) + " (" + ops.device_description() +
                        "; FP8 attention on a GPU needs compute capability 8.9 or later, bf16 and head size 64 or 128)");
    if (split && impl == CpImpl::ring)
      throw ConfigError("precision.fp8_layers names attention, which context parallelism runs only with "
                        "parallel.cp_impl=\"ulysses\"");
  }
  if (!split) return;
  if (impl == CpImpl::ring)
    ring_ = std::make_unique<RingAttention>(ops, *cp, B, T_local, C, NH, NKV, dtype);
  else
    ulysses_ = std::make_unique<UlyssesAttention>(ops, *cp, B, T_local, C, NH, NKV, dtype, prec);
}

CpAttention::~CpAttention() = default;

void CpAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  if (ring_) return ring_->forward(out, lse, qkv);
  if (ulysses_) return ulysses_->forward(out, lse, qkv);
  local_attention_forward(ops_, prec_, out, lse, qkv, B_, T_, C_, NH_, NKV_);
}

void CpAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  if (ring_) return ring_->backward(dqkv, dout, qkv, out, lse);
  if (ulysses_) return ulysses_->backward(dqkv, dout, qkv, out, lse);
  local_attention_backward(ops_, prec_, dqkv, dout, qkv, out, lse, B_, T_, C_, NH_, NKV_);
}

size_t CpAttention::scratch_bytes(CpImpl impl, int cp, int B, int T_local, int C, int NH, int NKV, DType dtype) {
  if (cp <= 1) return 0;
  if (impl == CpImpl::ulysses) return UlyssesAttention::scratch_bytes(B, T_local, C, NH, NKV, dtype);
  return RingAttention::scratch_bytes(B, T_local, C, NH, NKV, dtype);
}

}  // namespace pt
