#include "core/model/param_store.h"

namespace pt {

ParamStore::ParamStore(const ParamTable& table, Ops& ops) : table_(table), ops_(ops) {
  const size_t n = table.total_numel();
  params_ = ops.alloc(n, ops.compute_dtype());
  // With an fp32 compute dtype a separate master copy would only duplicate params.
  master_ = ops.compute_dtype() == DType::f32 ? params_ : ops.alloc(n, DType::f32);
  grads_ = ops.alloc(n, DType::f32);
  m_ = ops.alloc(n, DType::f32);
  v_ = ops.alloc(n, DType::f32);
}

ParamStore::~ParamStore() {
  if (!master_is_params()) ops_.release(master_);
  ops_.release(params_);
  ops_.release(grads_);
  ops_.release(m_);
  ops_.release(v_);
}

void ParamStore::load_master(const float* host) {
  ops_.upload(master_, host, DType::f32, master_.numel);
  if (!master_is_params()) ops_.copy(params_, master_, master_.numel);
}

void ParamStore::save_master(float* host) const { ops_.download(host, DType::f32, master_, master_.numel); }

}  // namespace pt
