#include "core/ckpt/vocab_padding.h"

namespace pt::ckpt {

namespace {

int default_multiple() { return ModelSection{}.pad_vocab_multiple; }

int padded_by_default(int vocab_size) {
  const int def = default_multiple();
  return (vocab_size + def - 1) / def * def;
}

}  // namespace

void pad_vocab_by_default(ModelSection& m) {
  m.pad_vocab_multiple = default_multiple();
  m.padded_vocab = padded_by_default(m.vocab_size);
}

int pad_multiple_for(int vocab_size, int padded_vocab) {
  return padded_by_default(vocab_size) == padded_vocab ? default_multiple() : padded_vocab;
}

}  // namespace pt::ckpt
