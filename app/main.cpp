// picotrain: the command line. Subcommands parse their flags and call into core/; nothing
// else lives here. Exit codes: 0 done, 2 bad config or usage, 1 runtime failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "app/number_flags.h"
#include "app/plan_command.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/llmc_model_file.h"
#include "core/common/build_info.h"
#include "core/common/console.h"
#include "core/common/error.h"
#include "core/config/config_keys.h"
#include "core/config/config_reference.h"
#include "core/config/run_config.h"
#include "core/data/prepare.h"
#include "core/eval/eval_command.h"
#include "core/model/sample_run.h"
#include "core/tokenizer/tokenizer.h"
#include "core/dist/gpu_comm.h"
#include "core/dist/world.h"
#include "core/ops/ops.h"
#include "core/train/trainer.h"

namespace {

// --tokenizer: a known name or an existing path (read, and refused if need be, when it is used).
const CLI::Validator kTokenizerCheck(
    [](const std::string& name) {
      if (pt::is_tokenizer_name(name)) return std::string();
      return "unknown tokenizer '" + name + "' (known: " + pt::kTokenizerNames + ")";
    },
    "TOKENIZER");

// --device of train and sample: "" picks cuda when this build has CUDA and a GPU is visible.
constexpr const char* kDeviceHelp =
    "Backend: cpu (fp32 reference, runs anywhere) or cuda (needs a GPU and a CUDA build). Default: cuda when this "
    "picotrain was built with CUDA and a GPU is visible, else cpu (a GPU machine whose CUDA is broken is an error)";

// --tokenizer and --tokenizer-dir of the commands that read a trained model (sample, eval).
void add_model_tokenizer_options(CLI::App* cmd, std::string& name, std::string& dir) {
  cmd->add_option("--tokenizer", name,
                  "bytes, gpt2, llama3, or the path of a tokenizer.json or of a folder holding one; default: the "
                  "checkpoint's (the one it records, else by the model's vocabulary: 256 bytes, 50257 gpt2, 128256 "
                  "llama3)")
      ->check(kTokenizerCheck);
  cmd->add_option("--tokenizer-dir", dir,
                  "gpt2, llama3: folder with its files (default " + pt::default_tokenizer_dir("NAME") + ")");
}

pt::Device resolve_device(const std::string& arg) {
  if (arg.empty()) return pt::default_device(pt::cuda_presence());
  return arg == "cuda" ? pt::Device::cuda : pt::Device::cpu;
}

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string device;  // "": cuda when this build has CUDA and a GPU is visible, else cpu
};

void add_train_command(CLI::App& app, TrainArgs& a) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a JSON run config");
  cmd->add_option("--config,-c", a.config,
                  "Run config (JSON); `picotrain keys` explains every key (docs/configuration.md)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set,-s", a.overrides,
                  "Override one config key, e.g. --set optim.lr=3e-4 --set run.name=test; the value is parsed as "
                  "JSON when it is valid JSON, else taken as a string. Repeatable; applied after the file, in order");
  cmd->add_option("--device", a.device,
                  std::string(kDeviceHelp) + ". Each rank uses GPU (its rank on the node) modulo (the GPUs it sees)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void add_prepare_command(CLI::App& app, pt::PrepareOptions& o) {
  CLI::App* cmd = app.add_subcommand("prepare", "Turn text files into llm.c token shards (train and val)");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "Tokenizer: bytes (one token per byte, vocabulary 256), gpt2 (GPT-2 BPE, vocabulary 50257; "
                  "documents start with <|endoftext|>), llama3 (Llama 3 BPE, vocabulary 128256; documents start with "
                  "<|begin_of_text|>; uint32 shards), or the path of a byte-level BPE tokenizer.json or of a folder "
                  "holding one")
      ->check(kTokenizerCheck)
      ->capture_default_str();
  cmd->add_option("--tokenizer-dir", o.tokenizer_dir,
                  "gpt2, llama3: folder with its files (default " + pt::default_tokenizer_dir("NAME") +
                      ", fetched by scripts/get_data.sh --tokenizer)");
  cmd->add_option("--input,-i", o.inputs,
                  "Text files, .gz files, .jsonl/.jsonl.gz files (one document per line, field \"text\") or folders "
                  "of them (recursed, sorted); repeatable")
      ->required();
  cmd->add_option("--out,-o", o.out_dir, "Output folder for <name>_train_NNNNNN.bin and <name>_val_NNNNNN.bin")
      ->required();
  cmd->add_option("--name", o.name, "Shard name prefix")->capture_default_str();
  cmd->add_option("--val-fraction", o.val_fraction, "Fraction of tokens held out for validation")
      ->check(pt::cli::between(0.0, 0.5))
      ->capture_default_str();
  cmd->add_option("--shard-tokens", o.shard_tokens, "Maximum tokens per shard file")
      ->check(pt::cli::whole_at_least(1))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "Encoding threads; 0: one per core (the output is the same for any count)")
      ->check(pt::cli::whole_at_least(0, "0: one per core"))
      ->capture_default_str();
}

struct ConvertArgs {
  std::string from, to, dtype = "fp32", format;
  CLI::Option* dtype_option = nullptr;
};

void add_convert_command(CLI::App& app, ConvertArgs& a) {
  CLI::App* cmd = app.add_subcommand("convert",
                                     "Move a model between picotrain checkpoints and llm.c model files or Hugging Face "
                                     "model folders (the direction follows --from)");
  cmd->add_option("--from", a.from,
                  "A picotrain checkpoint (a step_N directory, or a checkpoint directory: its latest) to export; an "
                  "llm.c model file (.bin, version 3 fp32 or 5 bf16) or a Hugging Face folder (config.json + "
                  "model.safetensors) to import")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--to", a.to,
                  "Export: the llm.c model file or Hugging Face folder to write. Import: a new checkpoint directory "
                  "(a weights-only checkpoint at step 0; train from it with --set checkpoint.resume=DIR)")
      ->required();
  cmd->add_option("--format", a.format,
                  "Export only: llmc (an llm.c model file; the default when --to ends in .bin) or hf (a Hugging Face "
                  "folder: config.json + model.safetensors, for AutoModelForCausalLM.from_pretrained). Import reads "
                  "what --from is")
      ->check(CLI::IsMember({"llmc", "hf"}));
  a.dtype_option = cmd->add_option("--dtype", a.dtype,
                                   "Export only: parameter dtype, fp32 or bf16 (rounded to nearest even; llm.c "
                                   "version 3 or 5, safetensors F32 or BF16)")
                       ->check(CLI::IsMember({"fp32", "bf16"}))
                       ->capture_default_str();
}

// The direction follows --from: a Hugging Face folder or an llm.c file is imported, a
// checkpoint is exported. An export's format is --format, else llmc for a --to ending in
// .bin; any other --to must say which, since a wrong guess writes a file the user's tools
// cannot read.
int run_convert(const ConvertArgs& a) {
  namespace fs = std::filesystem;
  namespace ck = pt::ckpt;
  const bool hf_from = ck::is_hf_model_folder(a.from);
  if (hf_from || !fs::is_directory(a.from)) {
    const std::string what = hf_from ? "hf" : "llmc";
    if (!a.format.empty() && a.format != what)
      throw pt::ConfigError("convert --format " + a.format + ": --from " + a.from + " is " +
                            (hf_from ? "a Hugging Face folder" : "an llm.c model file") + " (--format applies to export)");
    if (a.dtype_option->count() > 0)
      throw pt::ConfigError("convert --dtype applies to export only (an imported file's own dtype is read)");
    const std::string dst = hf_from ? ck::import_hf(a.from, a.to) : ck::import_llmc(a.from, a.to);
    pt::print_linef(pt::Stream::out, "imported %s into %s (weights only, step 0)", a.from.c_str(), dst.c_str());
    return 0;
  }
  std::string format = a.format;
  if (format.empty()) {
    if (!a.to.ends_with(".bin"))
      throw pt::ConfigError("convert --to " + a.to + ": say --format hf (a Hugging Face folder) or --format llmc (an "
                            "llm.c model file, the default for a --to ending in .bin)");
    format = "llmc";
  }
  const bool bf16 = a.dtype == "bf16";
  if (format == "hf") {
    const std::string src = ck::export_hf(a.from, a.to, bf16 ? ck::HfDtype::bf16 : ck::HfDtype::f32);
    const bool tokenizer = std::filesystem::exists(std::filesystem::path(a.to) / "tokenizer.json");
    pt::print_linef(pt::Stream::out, "exported %s to %s (Hugging Face folder: config.json, model.safetensors%s, %s)",
                    src.c_str(), a.to.c_str(), tokenizer ? ", tokenizer" : "", a.dtype.c_str());
    return 0;
  }
  const std::string src = ck::export_llmc(a.from, a.to, bf16 ? ck::LlmcDtype::bf16 : ck::LlmcDtype::f32);
  pt::print_linef(pt::Stream::out, "exported %s to %s (llm.c model file, %s)", src.c_str(), a.to.c_str(), a.dtype.c_str());
  return 0;
}

struct SampleArgs {
  pt::SampleCommand cmd;
  std::string device;  // "": as resolve_device decides
  bool ignore_eot = false;
};

void add_sample_command(CLI::App& app, SampleArgs& a) {
  CLI::App* cmd = app.add_subcommand("sample", "Print text a trained model writes after a prompt (KV-cache decoding)");
  pt::SampleCommand& c = a.cmd;
  cmd->add_option("--checkpoint", c.checkpoint,
                  "A picotrain checkpoint: a step_N directory, or a checkpoint directory (the checkpoint its latest "
                  "names)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt,-p", c.prompt,
                  "Text to continue (printed first); sampled as the start of a document, so \"\" samples one from "
                  "scratch")
      ->capture_default_str();
  cmd->add_option("-n,--tokens", c.options.max_new_tokens, "Tokens to sample")
      ->check(pt::cli::whole_at_least(0, "0: print the prompt alone"))
      ->capture_default_str();
  cmd->add_option("--temperature,-t", c.options.temperature,
                  "Softmax temperature; 0: greedy (always the most likely token)")
      ->check(pt::cli::at_least(0, "0: greedy"))
      ->capture_default_str();
  cmd->add_option("--top-k,-k", c.options.top_k, "Sample among the K most likely tokens; 0: all of them")
      ->check(pt::cli::whole_at_least(0, "0: all tokens"))
      ->capture_default_str();
  cmd->add_option("--seed", c.options.seed, "Seed of the sampling stream: the same seed gives the same text")
      ->check(pt::cli::whole_at_least(0))
      ->capture_default_str();
  add_model_tokenizer_options(cmd, c.tokenizer, c.tokenizer_dir);
  cmd->add_flag("--ignore-eot", a.ignore_eot,
                "Keep sampling past the tokenizer's document marker (gpt2: <|endoftext|>, llama3: <|begin_of_text|>; "
                "printed as that text) instead of stopping there");
  cmd->add_option("--device", a.device, kDeviceHelp)->check(CLI::IsMember({"cpu", "cuda"}));
}

int run_sample(SampleArgs a) {
  a.cmd.device = resolve_device(a.device);
  a.cmd.stop_at_eot = !a.ignore_eot;
  pt::run_sample_command(a.cmd, stdout);
  return 0;
}

struct EvalArgs {
  pt::EvalCommand cmd;
  std::string device;  // "": as resolve_device decides
};

void add_eval_command(CLI::App& app, EvalArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "eval", "Score a trained model: loss and perplexity on token shards, accuracy on a multiple-choice task "
              "(HellaSwag's JSONL); under mpirun with any layout of train");
  pt::EvalCommand& c = a.cmd;
  cmd->add_option("--checkpoint", c.checkpoint,
                  "A picotrain checkpoint (a step_N directory, or a checkpoint directory: its latest) or a Hugging "
                  "Face folder (config.json + model.safetensors, imported for the run)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--shards", c.shards, "Glob of llm.c token shards: prints their mean loss and perplexity");
  cmd->add_option("--tokens", c.tokens, "Tokens of --shards to score, rounded down to whole batches; 0: all of them")
      ->check(pt::cli::whole_at_least(0, "0: all"))
      ->capture_default_str();
  cmd->add_option("--task", c.task,
                  "Multiple-choice task, HellaSwag's JSONL (ctx, endings, label per line; scripts/get_data.sh "
                  "--hellaswag): prints acc and acc_norm")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-examples", c.max_examples, "The task's first N examples; 0: all of them")
      ->check(pt::cli::whole_at_least(0, "0: all"))
      ->capture_default_str();
  cmd->add_option("--scores", c.scores,
                  "Write each scored example (its token ids, each ending's summed and mean loss, the predictions) "
                  "to this JSONL file");
  cmd->add_option("--config,-c", c.config,
                  "Run config (JSON) for the layout and batch (parallel.*, batch.micro_batch_size, batch.seq_len, "
                  "precision.*); its model section is ignored: the model is the checkpoint's")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set,-s", c.overrides,
                  "Override one config key, as for train (e.g. --set parallel.tp=2 --set batch.seq_len=512); "
                  "batch.seq_len defaults to the model's max_seq_len");
  add_model_tokenizer_options(cmd, c.tokenizer, c.tokenizer_dir);
  cmd->add_option("--device", a.device,
                  std::string(kDeviceHelp) + ". Each rank uses GPU (its rank on the node) modulo (the GPUs it sees)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

struct KeysArgs {
  std::string filter;
  bool markdown = false;
};

void add_keys_command(CLI::App& app, KeysArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "keys", "Explain the run config's keys: each one's type, default and meaning (docs/configuration.md)");
  auto* filter = cmd->add_option("filter", a.filter,
                                 "Only these keys: a section (e.g. parallel), a key (parallel.zero_stage) or any part of "
                                 "a key's name (timeout). Default: every key");
  cmd->add_flag("--markdown", a.markdown,
                "Print the whole reference as markdown: docs/configuration.md is this output "
                "(picotrain keys --markdown > docs/configuration.md)")
      ->excludes(filter);
}

int run_keys(const KeysArgs& a) {
  if (a.markdown) {
    pt::print_text(pt::Stream::out, pt::config::config_reference_markdown());
    return 0;
  }
  std::string text = pt::config::format_key_help(pt::config::config_reference(), a.filter);
  if (text.empty())
    throw pt::ConfigError("no config key matches '" + a.filter + "'; the sections are " +
                          pt::config::join_names(pt::config::config_sections()));
  if (a.filter.empty())
    text += "\nSet a key with `picotrain train --config FILE --set section.key=value` (the value is read as JSON "
            "when it parses, else as text). docs/configuration.md has the rules shared by every key (unknown "
            "keys, derived keys, the resolved config.json).";
  pt::print_line(pt::Stream::out, text);
  return 0;
}

// How a command's error ends this rank: printed (prefixed with the rank when there are several),
// then, once ranks wait on each other in collectives, the whole world ended (the others would wait
// for this one forever), else a normal exit with `code`.
int fail(const pt::World& world, const std::string& msg, int code) {
  std::fflush(stdout);  // `picotrain sample` streams its text through stdio
  pt::print_error((world.size > 1 ? "rank " + std::to_string(world.rank) + ": " : "") + msg);
  if (pt::ranks_in_lockstep()) pt::abort_world(code);
  pt::finalize_world();
  return code;
}

int exit_code_of(const std::exception& e) { return dynamic_cast<const pt::ConfigError*>(&e) ? 2 : 1; }

// The backend of a run config on every rank (train, eval): precision.compute_dtype on --device.
std::unique_ptr<pt::Ops> make_run_ops(const pt::RunConfig& cfg, const std::string& device_arg,
                                      const pt::World& world) {
  std::unique_ptr<pt::Ops> ops;
  std::exception_ptr failure;
  try {
    const pt::Device device = resolve_device(device_arg);
    // One GPU per rank, chosen before the backend makes its stream and buffers on the current device.
    if (device == pt::Device::cuda) pt::use_gpu_of_local_rank(world);
    // precision.compute_dtype: auto leaves the choice to the backend (fp32 on the CPU, bf16 on CUDA).
    const std::string& dtype = cfg.precision.compute_dtype;
    ops = dtype == "auto" ? pt::make_ops(device) : pt::make_ops(device, dtype == "bf16" ? pt::DType::bf16 : pt::DType::f32);
  } catch (...) {
    failure = std::current_exception();
  }
  // A rank whose backend failed (no GPU, its memory already taken: cuBLASLt's workspace) stops
  // them all here, instead of leaving the others waiting in the trainer's first collective.
  pt::agree_on_startup(world, failure);
  return ops;
}

int run_train(const TrainArgs& a, const pt::World& world) {
  const pt::RunConfig cfg = pt::load_config(a.config, a.overrides, world.size);
  const std::unique_ptr<pt::Ops> ops = make_run_ops(cfg, a.device, world);
  pt::Trainer trainer(cfg, world, *ops);
  try {
    trainer.run();
  } catch (const std::exception& e) {
    // Ended here, before the trainer's destructor runs: under NCCL it waits for the other ranks
    // (ncclCommDestroy; cudaFree waits for their collectives' kernels), which wait for this one,
    // so the error would never be printed nor the world ended.
    if (pt::ranks_in_lockstep()) fail(world, e.what(), exit_code_of(e));
    throw;
  }
  return 0;
}

int run_eval(const EvalArgs& a, const pt::World& world) {
  const pt::EvalModel model(a.cmd.checkpoint, world.rank);
  const pt::RunConfig cfg = pt::eval_run_config(a.cmd, model, world.size);
  const std::unique_ptr<pt::Ops> ops = make_run_ops(cfg, a.device, world);
  pt::run_eval_command(a.cmd, model, cfg, world, *ops);
  return 0;
}

int run_prepare(const pt::PrepareOptions& o) {
  const pt::PrepareResult r = pt::prepare_dataset(o);
  pt::print_linef(pt::Stream::out,
              "prepared %llu train and %llu val tokens in %zu file(s) under %s (%llu documents, %.1f MB of text, "
              "%.1f MB/s)",
              static_cast<unsigned long long>(r.train_tokens), static_cast<unsigned long long>(r.val_tokens),
              r.files.size(), o.out_dir.c_str(), static_cast<unsigned long long>(r.documents),
              static_cast<double>(r.text_bytes) / 1e6,
              r.seconds > 0 ? static_cast<double>(r.text_bytes) / 1e6 / r.seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const pt::World world = pt::init_world(&argc, &argv);

  CLI::App app{"picotrain: pretrain GPT-style language models, from one CPU or GPU to a cluster"};
  app.require_subcommand(1);
  // What this binary was built from: its commit, whether the tree was clean, the backends in it.
  app.set_version_flag("--version", "picotrain " + pt::build_description(),
                       "Print the commit this binary was built from, whether its tree was clean, and its backends");
  TrainArgs train_args;
  pt::PrepareOptions prepare_args;
  add_train_command(app, train_args);
  add_prepare_command(app, prepare_args);
  ConvertArgs convert_args;
  add_convert_command(app, convert_args);
  SampleArgs sample_args;
  add_sample_command(app, sample_args);
  pt::app::PlanArgs plan_args;
  pt::app::add_plan_command(app, plan_args);
  KeysArgs keys_args;
  add_keys_command(app, keys_args);
  EvalArgs eval_args;
  add_eval_command(app, eval_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    const int rc = app.exit(e);
    pt::finalize_world();
    return rc;
  } catch (const CLI::CallForAllHelp& e) {
    const int rc = app.exit(e);
    pt::finalize_world();
    return rc;
  } catch (const CLI::CallForVersion& e) {
    const int rc = app.exit(e);
    pt::finalize_world();
    return rc;
  } catch (const CLI::ParseError& e) {
    return fail(world, pt::cli::words_for(e), 2);
  }

  try {
    int rc = 0;
    if (app.got_subcommand("train")) rc = run_train(train_args, world);
    else if (app.got_subcommand("prepare")) rc = run_prepare(prepare_args);
    else if (app.got_subcommand("convert")) rc = run_convert(convert_args);
    else if (app.got_subcommand("sample")) rc = run_sample(sample_args);
    else if (app.got_subcommand("plan")) rc = pt::app::run_plan(plan_args);
    else if (app.got_subcommand("keys")) rc = run_keys(keys_args);
    else if (app.got_subcommand("eval")) rc = run_eval(eval_args, world);
    pt::finalize_world();
    return rc;
  } catch (const std::exception& e) {
    return fail(world, e.what(), exit_code_of(e));
  }
}
