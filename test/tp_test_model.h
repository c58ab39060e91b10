// The small GPT-2 shape the tensor-parallel table and checkpoint tests cut into pieces: 4 heads
// of 8 channels, so tp 2 and 4 both split the heads, the MLP and the padded vocabulary (250
// real rows padded to 256: the last tp rank's rows straddle the padding).
#pragma once
#include "core/config/run_config.h"

namespace pt::test {

inline ModelSection tp_test_model() {
  ModelSection m;
  m.n_layers = 2;
  m.d_model = 32;
  m.n_heads = 4;
  m.vocab_size = 250;
  m.pad_vocab_multiple = 64;
  m.padded_vocab = 256;
  m.max_seq_len = 16;
  return m;
}

}  // namespace pt::test
