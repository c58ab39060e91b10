#include "core/model/sample_run.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/manifest.h"
#include "core/common/error.h"
#include "core/model/expert_split.h"
#include "core/model/kv_cache_decoder.h"
#include "core/model/model_tokenizer.h"
#include "core/model/param_table.h"
#include "core/common/console.h"

namespace pt {

CheckpointWeights read_checkpoint_weights(const std::string& path) {
  CheckpointWeights w;
  w.dir = ckpt::resolve_checkpoint_path(path, "sample --checkpoint");
  ckpt::CheckpointReader reader(w.dir);
  w.model = ckpt::model_from_manifest(reader.manifest(), w.dir);
  const ParamTable table = build_param_table(w.model);
  w.weights.resize(table.total_numel());
  for (const auto& p : table.specs()) reader.read_all("master/" + p.name, p.numel, w.weights.data() + p.offset);
  return w;
}

std::vector<int32_t> prompt_context(const Tokenizer& tok, std::string_view prompt) {
  std::vector<int32_t> ids = tok.document_prefix();
  if (ids.empty()) ids = tok.document_suffix();
  const std::vector<int32_t> text = tok.encode(prompt);
  ids.insert(ids.end(), text.begin(), text.end());
  return ids;
}

namespace {

// The id that ends a document, when the tokenizer has one: the one that starts the next (GPT-2's
// <|endoftext|>, Llama 3's <|begin_of_text|>), as prepare writes them.
int32_t end_of_text(const Tokenizer& tok) {
  const std::vector<int32_t> marker = tok.document_prefix();
  return marker.size() == 1 ? marker[0] : -1;
}

std::string describe(const SampleOptions& o) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "temperature %g, top-k %d, seed %llu", o.temperature, o.top_k,
                static_cast<unsigned long long>(o.seed));
  return o.temperature == 0 ? "greedy" : buf;
}

}  // namespace

void run_sample_command(const SampleCommand& c, std::FILE* out) {
  if (c.options.temperature < 0)
    throw ConfigError("sample --temperature " + std::to_string(c.options.temperature) + " must be >= 0 (0: greedy)");
  if (c.options.top_k < 0) throw ConfigError("sample --top-k " + std::to_string(c.options.top_k) + " must be >= 0 (0: all)");
  if (c.options.max_new_tokens < 0) throw ConfigError("sample -n " + std::to_string(c.options.max_new_tokens) + " must be >= 0");
  const CheckpointWeights w = read_checkpoint_weights(c.checkpoint);
  const ModelSection& m = w.model;
  const std::unique_ptr<Tokenizer> tok = tokenizer_for_checkpoint(w.dir, m, c.tokenizer, c.tokenizer_dir);
  const std::string name = tok->name();

  SampleOptions o = c.options;
  o.stop_token = c.stop_at_eot ? end_of_text(*tok) : -1;
  const std::vector<int32_t> context = prompt_context(*tok, c.prompt);
  const auto ops = make_ops(c.device);
  std::fflush(out);  // nothing of `out` may follow the info line out of order
  print_linef(Stream::err,
              "sample    | %s: %s, %d layers, d_model %d, %d heads (%d K/V), vocab %d, max_seq_len %d; %s tokenizer; "
              "%d tokens, %s; %s",
              w.dir.c_str(), m.arch.c_str(), m.n_layers, m.d_model, m.n_heads, m.kv_heads(), m.vocab_size,
              m.max_seq_len, name.c_str(),
              o.max_new_tokens, describe(o).c_str(), ops->device_description().c_str());

  KvCacheDecoder decoder(m, w.weights.data(), *ops);
  std::fwrite(c.prompt.data(), 1, c.prompt.size(), out);
  std::fflush(out);
  Utf8Stream text;
  generate(decoder, context, o, tok->vocab_size(), [&](int32_t id) {
    const std::string piece = text.push(tok->decode(std::span<const int32_t>(&id, 1)));
    std::fwrite(piece.data(), 1, piece.size(), out);
    std::fflush(out);
  });
  const std::string rest = text.flush();
  std::fwrite(rest.data(), 1, rest.size(), out);
  std::fputc('\n', out);
  std::fflush(out);
}

namespace {

// The run's tokenizer for training samples (run_tokenizer_name), shared with the start-up check;
// null when there is none or it fails to load, which is warned about once per process.
std::shared_ptr<const Tokenizer> training_tokenizer(const RunConfig& cfg) {
  static std::once_flag warned;
  const std::string name = run_tokenizer_name(cfg);
  if (name.empty()) {
    std::call_once(warned, [&] {
      print_linef(Stream::out,
                  "warning   | logging.sample_every: model.vocab_size=%d is none of %s and data.tokenizer is not set, "
                  "so there is no tokenizer to print samples with; skipping them",
                  cfg.model.vocab_size, vocabularies_with_a_tokenizer());
    });
    return nullptr;
  }
  try {
    return shared_tokenizer(name);
  } catch (const std::exception& e) {
    std::call_once(warned, [&] {
      print_line(Stream::out, std::string("warning   | logging.sample_every: skipping samples: ") + e.what());
    });
    return nullptr;
  }
}

// Prints `text` as log lines under a header, each line behind the log's column.
void print_block(const std::string& header, const std::string& text) {
  std::string out = "sample    | " + header + "\n";
  size_t at = 0;
  do {
    const size_t end = std::min(text.find('\n', at), text.size());
    out += "          | " + text.substr(at, end - at) + "\n";
    at = end + 1;
  } while (at <= text.size());
  print_line(Stream::out, out);  // the whole block in one write
}

}  // namespace

std::optional<TrainingSample> print_training_sample(const RunConfig& cfg, int step, bool run_finished,
                                                    const ParamStore& store, Ops& ops, bool lead,
                                                    const std::function<std::vector<float>()>& gather_master) {
  const auto& lg = cfg.logging;
  if (lg.sample_every <= 0 || step <= 0 || (!run_finished && step % lg.sample_every != 0)) return std::nullopt;
  // ZeRO-3 holds no full parameters anywhere, tensor parallel only pieces of them: every rank
  // takes part in the gather.
  const auto& specs = store.table().specs();
  const bool pieces = std::any_of(specs.begin(), specs.end(), [](const ParamSpec& p) { return !p.tp.whole(); });
  // Expert parallel keeps the routed experts in a store of their own (expert_split.h).
  const bool experts_elsewhere =
      cfg.model.moe.enabled() && std::none_of(specs.begin(), specs.end(), is_routed_expert);
  std::vector<float> gathered;
  if (!store.layout().params_resident() || pieces || experts_elsewhere) gathered = gather_master();
  if (!lead) return std::nullopt;
  const std::shared_ptr<const Tokenizer> tok = training_tokenizer(cfg);
  if (!tok) return std::nullopt;

  const std::unique_ptr<KvCacheDecoder> decoder =
      gathered.empty() ? std::make_unique<KvCacheDecoder>(cfg.model, store, ops)
                       : std::make_unique<KvCacheDecoder>(cfg.model, gathered.data(), ops);
  const TrainingSample sample = sample_training_text(cfg, *decoder, *tok);
  print_block("step " + std::to_string(step) + ", " + std::to_string(sample.tokens) + " tokens (" + sample.settings +
                  "):",
              sample.text);
  return sample;
}

TrainingSample sample_training_text(const RunConfig& cfg, KvCacheDecoder& decoder, const Tokenizer& tok) {
  const auto& lg = cfg.logging;
  SampleOptions o;
  o.max_new_tokens = lg.sample_tokens;
  o.seed = cfg.run.seed;
  o.stop_token = end_of_text(tok);
  const std::vector<int32_t> ids = generate(decoder, prompt_context(tok, lg.sample_prompt), o, tok.vocab_size());
  return {lg.sample_prompt + tok.decode(ids), ids.size(), describe(o), tok.name()};
}

}  // namespace pt
