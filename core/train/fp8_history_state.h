// Delayed FP8 scaling's amax histories (core/parallel/fp8_delayed.h) as checkpoint state: one
// tensor per FP8 layer of the model, "fp8_amax_history/layers.<layer>.<qkv|attn_out|mlp_up|
// mlp_down>", "fp8_amax_history/layers.<layer>.experts.<e>.<up|down>" (a sparse block's routed
// expert e) and "fp8_amax_history/lm_head", [steps, 3] floats (the x, w and dout amaxes of each
// step, the oldest first), named by the block's global index so a checkpoint resumes under any
// pipeline split. Every rank of a
// pipeline stage holds the same histories (they are merged over tp and dp x cp every step): one
// rank per stage writes them, every rank reads its chunks'. A checkpoint that lacks any of this
// run's layers (written without delayed scaling, or with other fp8_layers) restores none: the
// run starts its histories afresh, its next step scaling dynamically.
#pragma once
#include <string>
#include <vector>

#include "core/ckpt/checkpointer.h"
#include "core/model/decoder_stage.h"

namespace pt {

class Fp8HistoryState : public ckpt::ExtraState {
 public:
  // `chunks`: this rank's pipeline chunks (not owned), those with delayed scaling taking part;
  // `recipe`: which layers are in FP8.
  Fp8HistoryState(std::vector<DecoderStage*> chunks, const Fp8Recipe& recipe);

  std::vector<Entry> save_entries() override;
  std::vector<std::string> names() const override;
  void restore(const std::vector<std::optional<Entry>>& found) override;

  // The checkpoint name of block `layer`'s FP8 layer `kind`, or of the LM head's (layer unused).
  static std::string name(int layer, Fp8Layer kind);
  // The checkpoint name of block `layer`'s routed expert `expert`, its up or down projection.
  static std::string expert_name(int layer, int expert, bool down);

 private:
  // Every (chunk, site) whose layer is in FP8, in names() order.
  struct Site {
    Fp8Delayed* state;
    int site;
    std::string name;
  };
  std::vector<Site> sites_;
};

}  // namespace pt
