// The two places text is sampled: `picotrain sample` (a model from a checkpoint, printed as it
// is produced) and the training log (logging.sample_every).
//
// The context a prompt is sampled from starts the way every prepared document starts
// (core/data/prepare.h): GPT-2's <|endoftext|> for the gpt2 tokenizer, and for the byte
// tokenizer, which has no special ids, the blank line that ends the document before. So an
// empty prompt samples the start of a document, and the model never sees a context it was not
// trained on. The start tokens are not printed.
#pragma once
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_store.h"
#include "core/model/sampler.h"
#include "core/ops/ops.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

struct SampleCommand {
  std::string checkpoint;     // a step_N directory, or a checkpoint directory (its `latest`)
  std::string prompt;
  std::string tokenizer;      // make_tokenizer's names; "": the checkpoint's (tokenizer_for_checkpoint)
  std::string tokenizer_dir;  // gpt2's or llama3's files; "": default_tokenizer_dir(tokenizer)
  Device device = Device::cpu;
  SampleOptions options;      // stop_token is set from the tokenizer when stop_at_eot
  bool stop_at_eot = true;
};

// picotrain sample: loads the master weights of the checkpoint, prints a description of the
// model and the sampling to stderr (one line), then to `out` the prompt and each piece of the continuation
// as soon as it is a whole UTF-8 text (flushed per token), and a final newline. Throws
// ConfigError for bad arguments (no checkpoint there, a tokenizer that does not fit the model).
void run_sample_command(const SampleCommand& c, std::FILE* out);

// The weights of the checkpoint at `path` (resolved as checkpoint.resume resolves a path):
// the model shape from its manifest and the fp32 master weights in ParamTable order.
struct CheckpointWeights {
  std::string dir;  // the step directory read
  ModelSection model;
  std::vector<float> weights;
};
CheckpointWeights read_checkpoint_weights(const std::string& path);

// The tokens a prompt is sampled after: the document start (see the file comment) + the prompt.
std::vector<int32_t> prompt_context(const Tokenizer& tok, std::string_view prompt);

class KvCacheDecoder;

// The training sample (the log's, and the run report's): logging.sample_tokens tokens after
// logging.sample_prompt from `decoder`'s model, seed run.seed, temperature 0.8, top-k 200,
// stopping at the tokenizer's end of text.
struct TrainingSample {
  std::string text;       // the prompt and its continuation, decoded
  size_t tokens = 0;      // tokens sampled after the prompt
  std::string settings;   // "temperature 0.8, top-k 200, seed 1337"
  std::string tokenizer;  // its name(): "bytes", "gpt2", "llama3" or a path
};
TrainingSample sample_training_text(const RunConfig& cfg, KvCacheDecoder& decoder, const Tokenizer& tok);

// The trainer's hook, called on every rank after each step (run_finished: after the last one).
// When logging.sample_every > 0 and `step` is a multiple of it, or the run has finished, the
// lead rank prints logging.sample_tokens tokens sampled after logging.sample_prompt (seed
// run.seed, temperature 0.8, top-k 200) into the log. Parameters sharded by ZeRO-3, split by
// tensor parallel or (experts) by expert parallel are first gathered with `gather_master`, which
// is collective: every rank calls this function at the same steps. The tokenizer is data.tokenizer, else
// the one model.vocab_size implies (run_tokenizer_name); when there is none, or its files are
// missing, samples are skipped with one warning.
// Returns what the lead rank printed (nothing on the other ranks, or when no sample was due or
// there is no tokenizer).
std::optional<TrainingSample> print_training_sample(const RunConfig& cfg, int step, bool run_finished,
                                                    const ParamStore& store, Ops& ops, bool lead,
                                                    const std::function<std::vector<float>()>& gather_master);

}  // namespace pt
