#include "core/ckpt/hf_config_keys.h"

#include "core/ckpt/vocab_padding.h"

namespace pt::ckpt {

ModelSection read_decoder_shape(const HfConfigKeys& k, const HfDecoderShapeKeys& keys) {
  auto whole = [&](const HfWholeKey& key) { return k.whole(key.key, key.def); };
  ModelSection m;
  m.vocab_size = whole(keys.vocab_size);
  m.max_seq_len = whole(keys.max_seq_len);
  m.d_model = whole(keys.d_model);
  m.n_layers = whole(keys.n_layers);
  m.n_heads = whole(keys.n_heads);
  if (m.d_model % m.n_heads != 0)
    throw k.fail(keys.n_heads.key, std::to_string(m.n_heads) + " does not divide " + keys.d_model.key + "=" +
                                       std::to_string(m.d_model) + " (picotrain's head_dim is their quotient)");
  pad_vocab_by_default(m);
  return m;
}

}  // namespace pt::ckpt
