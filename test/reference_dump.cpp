// reference_dump: what picotrain computes for one batch from a checkpoint, for the independent
// PyTorch GPT-2, Llama and Mixtral in scripts/torch_reference.py to check. A test tool, not a user
// command: it loads the checkpoint's fp32 master weights with picotrain's own reader (it verifies
// every chunk's checksum) into the model the trainer runs (ParamTable, ParamStore, DecoderStage)
// on the chosen backend, and writes
//
//   dump.json    the checkpoint (its step directory, step, model and the checksums of its
//                master weights' chunks), the backend, the batch shape and seed, the loss (the
//                cross-entropy below, picotrain's logged loss), for a model with experts
//                aux_loss (the mean over its sparse blocks of their load-balancing losses, of the
//                training pass), and the files below with their shapes
//   tokens.i32   [B, T] inputs: random ids in [0, vocab_size), a function of --seed only
//   targets.i32  [B, T] the next token of each sequence; position 1 is -1 (ignored)
//   logits.f32   [B*T, padded_vocab] of an eval pass (dloss 0)
//   routing.i32  for a model with experts: [sparse blocks, B*T, top_k] the experts the training
//                pass chose for each token (a bf16 backend may break a near-tie otherwise than
//                float64; the reference then routes as the dump did, and checks the choice)
//   grads.f32    one training pass from zero gradients, no optimizer step: the gradient of
//                loss = (sum of per-token cross-entropies) / (B*T), plus moe.aux_loss_coef *
//                aux_loss for a model with experts (the objective the trainer minimises), for
//                every parameter, whole (global shapes, row-major), back to back in the order of
//                the checkpoint's master/* tensors (ParamTable order), as dump.json lists them
//
// Everything is little-endian. Exit status: 0 written, 2 bad arguments or no such checkpoint,
// 1 anything else (a corrupt checkpoint, a backend failure).
//
//   reference_dump --checkpoint runs/x/checkpoints --out dump/cpu --device cpu
//   reference_dump --checkpoint runs/x/checkpoints --out dump/cuda_bf16 --device cuda --dtype bf16
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checksum.h"
#include "core/ckpt/manifest.h"
#include "core/common/counter_rng.h"
#include "core/common/error.h"
#include "core/model/decoder_stage.h"
#include "core/model/param_store.h"
#include "core/model/param_table.h"
#include "core/ops/ops.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string checkpoint, out;
  std::string device = "cpu";
  std::string dtype = "fp32";
  int batch = 2;
  // 47: not a multiple of any tile, so every attention kernel runs a partial last tile.
  int seq_len = 47;
  uint64_t seed = 1;
};

// B sequences of T+1 random ids; each gives T inputs and the T targets one position on, as a
// training batch does. One target is -1, so the ignored-position path is compared too.
void make_batch(const Args& a, int vocab, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  const size_t T = a.seq_len;
  tokens.resize(size_t(a.batch) * T);
  targets.resize(tokens.size());
  for (size_t b = 0; b < size_t(a.batch); ++b) {
    for (size_t t = 0; t <= T; ++t) {
      const uint64_t i = b * (T + 1) + t;
      const auto id = static_cast<int32_t>(pt::counter_uniform(a.seed, pt::hash_name("reference_dump"), i) * vocab);
      if (t < T) tokens[b * T + t] = id;
      if (t > 0) targets[b * T + t - 1] = id;
    }
  }
  if (targets.size() > 1) targets[1] = -1;
}

void write_file(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f.good()) throw pt::RuntimeError("cannot write " + path.string());
}

template <class T>
void write_vector(const fs::path& path, const std::vector<T>& v) {
  write_file(path, v.data(), v.size() * sizeof(T));
}

void run(const Args& a) {
  // Resolved here so an error names this tool's option.
  const std::string dir = pt::ckpt::resolve_checkpoint_path(a.checkpoint, "reference_dump --checkpoint");
  // The master weights, read as the sampler reads them (every chunk's checksum verified), but
  // for any architecture the stage runs, not only those the KV-cache decoder samples.
  pt::ckpt::CheckpointReader reader(dir);
  const pt::ModelSection m = pt::ckpt::model_from_manifest(reader.manifest(), dir);
  if (a.seq_len > m.max_seq_len)
    throw pt::ConfigError("reference_dump --seq-len " + std::to_string(a.seq_len) + " is longer than the model's " +
                          "max_seq_len " + std::to_string(m.max_seq_len));
  if (a.device == "cpu" && a.dtype != "fp32")
    throw pt::ConfigError("reference_dump --dtype " + a.dtype + ": the CPU backend computes in fp32 only");
  const pt::Device device = a.device == "cuda" ? pt::Device::cuda : pt::Device::cpu;
  const auto ops = pt::make_ops(device, a.dtype == "bf16" ? pt::DType::bf16 : pt::DType::f32);

  const int B = a.batch, T = a.seq_len, N = B * T;
  std::vector<int32_t> tokens, targets;
  make_batch(a, m.vocab_size, tokens, targets);

  const pt::ParamTable table = pt::build_param_table(m);
  std::vector<float> weights(table.total_numel());
  for (const pt::ParamSpec& p : table.specs())
    reader.read_all("master/" + p.name, p.numel, weights.data() + p.offset);
  pt::ParamStore store(table, *ops);
  store.load_master(weights.data());  // the bf16 backend computes with these rounded to bf16
  pt::DecoderStage stage(m, store, *ops, B, T);

  stage.forward(tokens.data(), targets.data(), 0.0f);
  std::vector<float> logits(size_t(N) * m.padded_vocab);
  ops->download(logits.data(), pt::DType::f32, stage.logits(), logits.size());

  ops->zero(store.all_grads());
  stage.record_moe_routing(true);
  const double loss = stage.forward(tokens.data(), targets.data(), 1.0f / N) / N;
  stage.backward();
  // The training pass's balancing losses (the eval pass above is not counted).
  const pt::MoeStats routed = stage.take_moe_stats();
  std::vector<float> grads(table.total_numel());
  nlohmann::ordered_json grad_list = nlohmann::ordered_json::array();
  for (const pt::ParamSpec& p : table.specs()) {
    ops->download(grads.data() + p.offset, pt::DType::f32, store.grad(p), p.numel);
    grad_list.push_back({{"name", p.name}, {"shape", p.global_shape}, {"offset", p.offset}});
  }

  const fs::path out(a.out);
  fs::create_directories(out);
  write_vector(out / "tokens.i32", tokens);
  write_vector(out / "targets.i32", targets);
  write_vector(out / "logits.f32", logits);
  write_vector(out / "grads.f32", grads);
  if (m.moe.enabled()) write_vector(out / "routing.i32", routed.routing);
  // Which weights these are, for the script to check it reads the same checkpoint: the
  // checksums of the master tensors' chunks, in manifest order.
  nlohmann::ordered_json checksums = nlohmann::ordered_json::array();
  for (const pt::ckpt::TensorEntry& t : reader.manifest().tensors)
    if (t.name.rfind("master/", 0) == 0)
      for (const pt::ckpt::Chunk& c : t.chunks) checksums.push_back(pt::ckpt::checksum_hex(c.checksum));
  nlohmann::ordered_json j = {
      {"checkpoint", dir},
      {"step", reader.manifest().step},
      {"model", reader.manifest().model},
      {"master_checksums", checksums},
      {"device", a.device},
      {"compute_dtype", a.dtype},
      {"device_description", ops->device_description()},
      {"batch", B},
      {"seq_len", T},
      {"seed", a.seed},
      {"loss", loss},
      {"logits", {{"file", "logits.f32"}, {"shape", {N, m.padded_vocab}}}},
      {"grads", {{"file", "grads.f32"}, {"tensors", grad_list}}},
  };
  if (m.moe.enabled()) {
    j["aux_loss"] = routed.aux_sum / routed.layer_batches;
    const size_t k = static_cast<size_t>(m.moe.top_k);
    j["routing"] = {{"file", "routing.i32"}, {"shape", {routed.routing.size() / (size_t(N) * k), N, k}}};
  }
  std::ofstream meta(out / "dump.json");
  meta << j.dump(2) << "\n";
  if (!meta.good()) throw pt::RuntimeError("cannot write " + (out / "dump.json").string());
  std::printf("reference_dump: %s step %d on %s (%s): batch %d x %d, loss %.6f -> %s\n", dir.c_str(),
              reader.manifest().step, ops->device_description().c_str(), a.dtype.c_str(), B, T, loss, a.out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Writes picotrain's logits, loss and gradients for one batch from a checkpoint, for "
               "scripts/torch_reference.py"};
  app.add_option("--checkpoint", a.checkpoint, "A checkpoint: a step_N directory, or a checkpoint directory (its latest)")
      ->required();
  app.add_option("--out", a.out, "Folder to write into (created)")->required();
  app.add_option("--device", a.device, "Backend")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--dtype", a.dtype, "Compute dtype (the CPU backend computes in fp32 only)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--batch", a.batch, "Sequences in the batch")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--seq-len", a.seq_len, "Tokens per sequence (at most the model's max_seq_len)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the random batch")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    run(a);
    return 0;
  } catch (const pt::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
