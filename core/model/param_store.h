// ParamStore: the model's parameters, their gradients and the AdamW state in flat arenas on
// the backend's device, laid out by the ParamTable's offsets.
//  - params: the compute dtype (what the forward pass reads)
//  - master: fp32 master weights; on a backend whose compute dtype is f32 it IS params
//  - grads, adam_m, adam_v: fp32
#pragma once
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace pt {

class ParamStore {
 public:
  ParamStore(const ParamTable& table, Ops& ops);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Uploads host fp32 values (total_numel of them) into master and params.
  void load_master(const float* host);
  // Downloads the fp32 master weights to host (total_numel floats).
  void save_master(float* host) const;

  Tensor param(const ParamSpec& p) const { return params_.slice(p.offset, p.numel); }
  Tensor master(const ParamSpec& p) const { return master_.slice(p.offset, p.numel); }
  Tensor grad(const ParamSpec& p) const { return grads_.slice(p.offset, p.numel); }
  Tensor adam_m(const ParamSpec& p) const { return m_.slice(p.offset, p.numel); }
  Tensor adam_v(const ParamSpec& p) const { return v_.slice(p.offset, p.numel); }
  Tensor param(const std::string& name) const { return param(table_.get(name)); }
  Tensor grad(const std::string& name) const { return grad(table_.get(name)); }

  Tensor all_params() const { return params_; }
  Tensor all_grads() const { return grads_; }
  const ParamTable& table() const { return table_; }
  bool master_is_params() const { return master_.data == params_.data; }

 private:
  const ParamTable& table_;
  Ops& ops_;
  Tensor params_, master_, grads_, m_, v_;
};

}  // namespace pt
