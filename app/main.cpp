// picotrain: the command line. Subcommands parse their flags and call into core/; nothing
// else lives here. Exit codes: 0 done, 2 bad config or usage, 1 runtime failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/config/run_config.h"
#include "core/data/prepare.h"
#include "core/dist/world.h"
#include "core/ops/ops.h"
#include "core/train/trainer.h"

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string device = "cpu";
};

void add_train_command(CLI::App& app, TrainArgs& a) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a JSON run config");
  cmd->add_option("--config,-c", a.config, "Run config (JSON); every key is listed in README.md")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set,-s", a.overrides,
                  "Override one config key, e.g. --set optim.lr=3e-4 --set run.name=test; the value is parsed as "
                  "JSON when it is valid JSON, else taken as a string. Repeatable; applied after the file, in order");
  cmd->add_option("--device", a.device,
                  "Backend: cpu (fp32 reference, runs anywhere) or cuda (needs a GPU and a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void add_prepare_command(CLI::App& app, pt::PrepareOptions& o) {
  CLI::App* cmd = app.add_subcommand("prepare", "Turn text files into llm.c token shards (train and val)");
  cmd->add_option("--tokenizer", o.tokenizer, "Tokenizer: bytes (one token per byte, vocabulary 256)")
      ->check(CLI::IsMember({"bytes"}));
  cmd->add_option("--input,-i", o.inputs, "Text files or folders (recursed, sorted); repeatable")->required();
  cmd->add_option("--out,-o", o.out_dir, "Output folder for <name>_train_NNNNNN.bin and <name>_val_NNNNNN.bin")
      ->required();
  cmd->add_option("--name", o.name, "Shard name prefix")->capture_default_str();
  cmd->add_option("--val-fraction", o.val_fraction, "Fraction of tokens held out for validation")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  cmd->add_option("--shard-tokens", o.shard_tokens, "Maximum tokens per shard file")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

int run_train(const TrainArgs& a, const pt::World& world) {
  const pt::RunConfig cfg = pt::load_config(a.config, a.overrides, world.size);
  auto ops = pt::make_ops(a.device == "cuda" ? pt::Device::cuda : pt::Device::cpu);
  pt::Trainer trainer(cfg, world, *ops);
  trainer.run();
  return 0;
}

int run_prepare(const pt::PrepareOptions& o) {
  const pt::PrepareResult r = pt::prepare_dataset(o);
  std::printf("prepared %llu train and %llu val tokens in %zu file(s) under %s\n",
              static_cast<unsigned long long>(r.train_tokens), static_cast<unsigned long long>(r.val_tokens),
              r.files.size(), o.out_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const pt::World world = pt::init_world(&argc, &argv);
  // Errors are printed by every rank, prefixed with the rank when there are several.
  const std::string who = world.size > 1 ? "rank " + std::to_string(world.rank) + ": " : "";
  auto fail = [&](const std::string& msg, int code) {
    std::fflush(stdout);
    std::cerr << "error: " << who << msg << std::endl;
    pt::finalize_world();
    return code;
  };

  CLI::App app{"picotrain: pretrain GPT-style language models, from one CPU or GPU to a cluster"};
  app.require_subcommand(1);
  TrainArgs train_args;
  pt::PrepareOptions prepare_args;
  add_train_command(app, train_args);
  add_prepare_command(app, prepare_args);

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
  } catch (const CLI::ParseError& e) {
    return fail(e.what(), 2);
  }

  try {
    int rc = 0;
    if (app.got_subcommand("train")) rc = run_train(train_args, world);
    else if (app.got_subcommand("prepare")) rc = run_prepare(prepare_args);
    pt::finalize_world();
    return rc;
  } catch (const pt::ConfigError& e) {
    return fail(e.what(), 2);
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}
