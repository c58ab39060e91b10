// ZeroHooks: the LayerHooks the Stage calls, forwarded to the two halves of ZeRO: parameter
// gathering (ParamGather) and gradient reduction (GradSync).
#pragma once
#include "core/model/layer_hooks.h"
#include "core/train/grad_sync.h"
#include "core/train/param_gather.h"

namespace pt {

class ZeroHooks final : public LayerHooks {
 public:
  ZeroHooks(ParamGather& gather, GradSync& sync) : gather_(gather), sync_(sync) {}
  void acquire_params(int layer) override { gather_.acquire(layer); }
  void release_params(int layer) override { gather_.release(layer); }
  void acquire_grads(int layer) override { sync_.acquire_grads(layer); }
  void grads_ready(int layer) override { sync_.grads_ready(layer); }

 private:
  ParamGather& gather_;
  GradSync& sync_;
};

}  // namespace pt
