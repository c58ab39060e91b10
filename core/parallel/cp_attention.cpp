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

CpAttention::CpAttention(Ops& ops, Comm* cp, CpImpl impl, int B, int T_local, int C, int NH, int NKV, DType dtype)
    : ops_(ops), B_(B), T_(T_local), C_(C), NH_(NH), NKV_(NKV) {
  if (!cp || cp->size() == 1) return;
  if (impl == CpImpl::ring)
    ring_ = std::make_unique<RingAttention>(ops, *cp, B, T_local, C, NH, NKV, dtype);
  else
    ulysses_ = std::make_unique<UlyssesAttention>(ops, *cp, B, T_local, C, NH, NKV, dtype);
}

CpAttention::~CpAttention() = default;

void CpAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  if (ring_) return ring_->forward(out, lse, qkv);
  if (ulysses_) return ulysses_->forward(out, lse, qkv);
  ops_.attention_forward(out, lse, qkv, B_, T_, C_, NH_, NKV_);
}

void CpAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  if (ring_) return ring_->backward(dqkv, dout, qkv, out, lse);
  if (ulysses_) return ulysses_->backward(dqkv, dout, qkv, out, lse);
  ops_.attention_backward(dqkv, dout, qkv, out, lse, B_, T_, C_, NH_, NKV_);
}

size_t CpAttention::scratch_bytes(CpImpl impl, int cp, int B, int T_local, int C, int NH, int NKV, DType dtype) {
  if (cp <= 1) return 0;
  if (impl == CpImpl::ulysses) return UlyssesAttention::scratch_bytes(B, T_local, C, NH, NKV, dtype);
  return RingAttention::scratch_bytes(B, T_local, C, NH, NKV, dtype);
}

}  // namespace pt
