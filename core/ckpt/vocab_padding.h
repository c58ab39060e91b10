// picotrain's vocabulary padding for a model that comes from (or goes to) another program's
// files. The embedding and an untied head have padded_vocab rows, vocab_size of them real and
// the rest zeros that training keeps zero. A Hugging Face config.json says only vocab_size, so an
// import pads as picotrain's configs do by default; an llm.c header and a checkpoint manifest
// say both sizes, and the pad_vocab_multiple that reproduces them is derived. The padding rows
// themselves are left out on a Hugging Face export and zero-filled on import
// (HfTensorRule::vocab_rows, hf_architecture.h).
#pragma once
#include "core/config/run_config.h"

namespace pt::ckpt {

// Sets m.pad_vocab_multiple to ModelSection's default and m.padded_vocab to m.vocab_size rounded
// up to it (50257 -> 50304, llm.c's).
void pad_vocab_by_default(ModelSection& m);

// A model.pad_vocab_multiple that rounds vocab_size up to exactly padded_vocab (the default
// when it does, else padded_vocab itself), for model shapes read from files.
int pad_multiple_for(int vocab_size, int padded_vocab);

}  // namespace pt::ckpt
