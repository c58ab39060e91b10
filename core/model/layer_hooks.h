// LayerHooks: what a Stage tells the data-parallel runtime as it walks its layers, so ZeRO can
// gather parameters just before they are used and reduce gradients as soon as they are final,
// without the model code knowing which ZeRO stage (if any) runs. `layer` is a ParamSpec::layer
// value: -1 the embeddings (token table, also the tied LM head), 0..n_layers-1 the blocks,
// n_layers the final LayerNorm.
//
// The contract a Stage keeps, per micro-batch:
//  - acquire_params(l) before it reads layer l's parameters and release_params(l) when it will
//    not read them again until the next acquire (a pair may repeat: the embeddings are used at
//    the start of forward and again by the LM head);
//  - acquire_grads(l) before backward first writes layer l's gradients, and grads_ready(l) once
//    backward will not write them again in this micro-batch, in the order backward finishes
//    layers (the final LayerNorm first, the embeddings last).
// The default does nothing: every parameter and gradient is resident in the ParamStore.
#pragma once

namespace pt {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void acquire_params(int layer) {}
  virtual void release_params(int layer) {}
  virtual void acquire_grads(int layer) {}
  virtual void grads_ready(int layer) {}
};

}  // namespace pt
