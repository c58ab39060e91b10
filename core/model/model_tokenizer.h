// Which tokenizer a model reads and writes: data.tokenizer for a run, the checkpoint's record
// (core/ckpt/checkpoint_tokenizer.h) for a trained model, and otherwise, as before either existed,
// the one its vocabulary implies (tokenizer_for_vocab, sampler.h).
#pragma once
#include <memory>
#include <string>

#include "core/config/run_config.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

// data.tokenizer, else tokenizer_for_vocab(model.vocab_size); "" when neither names one.
std::string run_tokenizer_name(const RunConfig& cfg);

// make_tokenizer(name) from its default files, loaded once per process and shared: the start-up
// check and every training sample use the one copy (Llama 3's tokenizer.json is 9 MB of JSON).
// A load that failed is not tried again: each later call rethrows its exception.
std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& name);

// Throws ConfigError when the tokenizer's ids do not all have a row in the model's embedding:
// its vocabulary must fit in model.vocab_size (which padding then rounds up as usual, so a larger
// model vocabulary is fine). `source` says where the tokenizer came from, for the message
// ("data.tokenizer=llama3", "sample --tokenizer gpt2", "the checkpoint's tokenizer gpt2").
void check_tokenizer_fits(const Tokenizer& tok, int vocab_size, const std::string& source);

// The tokenizer of a trained model in `checkpoint_dir` (a step directory, a checkpoint directory,
// whose `latest` is read, or a Hugging Face model folder): `flag_name` when given (its files from
// `flag_dir`, "": the default folder), else the one the checkpoint records (a Hugging Face
// folder: its tokenizer.json), else the one `model`'s vocabulary implies. Throws ConfigError when
// there is none, when it cannot be loaded, or when it does not fit the model (check_tokenizer_fits).
std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& checkpoint_dir, const ModelSection& model,
                                                    const std::string& flag_name, const std::string& flag_dir);

}  // namespace pt
