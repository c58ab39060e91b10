// ZeroHooks: the LayerHooks the Stage calls, forwarded to the two halves of ZeRO: parameter
// gathering (ParamGather) and gradient reduction (GradSync). Under expert parallel a second pair
// serves the store of this rank's routed experts (core/model/expert_split.h), for the layers that
// store holds (the sparse blocks), after the first pair, in the same order on every rank.
#pragma once
#include <vector>

#include "core/model/layer_hooks.h"
#include "core/train/grad_sync.h"
#include "core/train/param_gather.h"

namespace pt {

class ZeroHooks final : public LayerHooks {
 public:
  ZeroHooks(ParamGather& gather, GradSync& sync) { parts_.push_back({&gather, &sync, nullptr}); }
  // Another store's pair, called only for the layers `layout` (that store's) holds.
  void add(ParamGather& gather, GradSync& sync, const ShardLayout& layout) { parts_.push_back({&gather, &sync, &layout}); }

  void acquire_params(int layer) override {
    for_parts(layer, [&](const Part& p) { p.gather->acquire(layer); });
  }
  void release_params(int layer) override {
    for_parts(layer, [&](const Part& p) { p.gather->release(layer); });
  }
  void acquire_grads(int layer) override {
    for_parts(layer, [&](const Part& p) { p.sync->acquire_grads(layer); });
  }
  void grads_ready(int layer) override {
    for_parts(layer, [&](const Part& p) { p.sync->grads_ready(layer); });
  }

 private:
  struct Part {
    ParamGather* gather;
    GradSync* sync;
    const ShardLayout* only;  // null: every layer
  };
  // Calls f on every part that holds `layer`, in order.
  template <class F>
  void for_parts(int layer, F f) const {
    for (const Part& p : parts_)
      if (!p.only || p.only->holds_layer(layer)) f(p);
  }
  std::vector<Part> parts_;
};

}  // namespace pt
