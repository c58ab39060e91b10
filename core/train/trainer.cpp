#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/metrics/flops.h"
#include "core/metrics/peak_probe.h"
#include "core/train/lr_schedule.h"
#include "core/train/optimizer.h"

namespace pt {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}
}  // namespace

Trainer::Trainer(const RunConfig& cfg, const World& world, Ops& ops)
    : cfg_(cfg), world_(world), ops_(ops), table_(build_gpt2_param_table(cfg.model)) {
  // Multi-rank layouts need gradient reduction and the parallel Stage: until the distributed
  // runtime lands, refuse them instead of silently training unsynchronised replicas.
  if (world.size != 1)
    throw ConfigError("this build of picotrain trains on one rank; the world has " + std::to_string(world.size) +
                      " ranks (multi-rank layouts land with the distributed runtime)");
  // Checkpoint keys are accepted (their names are fixed by the design) but writing and
  // resuming land with the checkpoint issue: refuse rather than pretend to save.
  if (cfg.checkpoint.every_steps > 0)
    throw ConfigError("checkpoint.every_steps=" + std::to_string(cfg.checkpoint.every_steps) +
                      ": checkpoint writing is not implemented yet; set it to 0");
  if (cfg.checkpoint.resume != "none")
    throw ConfigError("checkpoint.resume=" + cfg.checkpoint.resume + ": resuming is not implemented yet; use none");
  if (ops.device() == Device::cpu && cfg.precision.compute_dtype == "bf16")
    throw ConfigError("precision.compute_dtype=bf16: the CPU backend computes in fp32 (use fp32 or auto)");

  store_ = std::make_unique<ParamStore>(table_, ops);
  std::vector<float> host(table_.total_numel());
  init_params(table_, cfg.run.seed, host.data());
  store_->load_master(host.data());

  const int B = cfg.batch.micro_batch_size, T = cfg.batch.seq_len;
  stage_ = std::make_unique<Gpt2Stage>(cfg.model, *store_, ops, B, T);
  train_data_ = std::make_unique<DataLoader>(cfg.data.train, cfg.model.vocab_size, B, T);
  if (!cfg.data.val.empty()) val_data_ = std::make_unique<DataLoader>(cfg.data.val, cfg.model.vocab_size, B, T);
  inputs_.resize(static_cast<size_t>(B) * T);
  targets_.resize(static_cast<size_t>(B) * T);
}

Trainer::~Trainer() = default;

int64_t Trainer::sequences_per_step() const {
  return static_cast<int64_t>(cfg_.batch.grad_accum_steps) * cfg_.parallel.dp * cfg_.batch.micro_batch_size;
}

StepResult Trainer::step() {
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const int accum = cfg_.batch.grad_accum_steps, dp = cfg_.parallel.dp;
  // The loss is the token-weighted mean over the whole global batch, so each token's
  // gradient is scaled by 1 / (tokens in the global batch), whatever the split.
  const double batch_tokens = static_cast<double>(sequences_per_step()) * T;
  const float dloss = static_cast<float>(1.0 / batch_tokens);

  ops_.zero(store_->all_grads());
  double loss_sum = 0;
  for (int micro = 0; micro < accum; micro++) {
    const int64_t first_sequence = (static_cast<int64_t>(micro) * dp + 0 /* dp rank */) * B;
    train_data_->load(cursor_, first_sequence, inputs_.data(), targets_.data());
    loss_sum += stage_->forward(inputs_.data(), targets_.data(), dloss);
    stage_->backward();
  }
  cursor_ = (cursor_ + static_cast<uint64_t>(sequences_per_step()) * T) % train_data_->total_tokens();

  StepResult r;
  r.lr = lr_at(cfg_.optim, cfg_.schedule, step_);
  const OptimizerStats s = adamw_step(ops_, *store_, cfg_.optim, r.lr, step_ + 1);
  r.grad_norm = s.grad_norm;
  r.loss = loss_sum / batch_tokens;
  step_++;
  return r;
}

double Trainer::evaluate() {
  check(val_data_ != nullptr, "evaluate() needs data.val");
  const int B = cfg_.batch.micro_batch_size, T = cfg_.batch.seq_len;
  const uint64_t batch_tokens = static_cast<uint64_t>(B) * T;
  const uint64_t available = val_data_->total_tokens() - 1;  // the last token is only a target
  const uint64_t wanted = cfg_.data.val_tokens > 0 ? static_cast<uint64_t>(cfg_.data.val_tokens) : available;
  const int64_t batches = static_cast<int64_t>(std::max<uint64_t>(1, std::min(wanted, available) / batch_tokens));
  double loss_sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    val_data_->load(0, i * B, inputs_.data(), targets_.data());
    loss_sum += stage_->forward(inputs_.data(), targets_.data(), 0.0f);
  }
  return loss_sum / (static_cast<double>(batches) * batch_tokens);
}

void Trainer::print_startup() const {
  const auto& m = cfg_.model;
  const auto& b = cfg_.batch;
  std::printf("picotrain | run %s -> %s\n", cfg_.run.name.c_str(), cfg_.run.out_dir.c_str());
  std::printf("device    | %s\n", ops_.device_description().c_str());
  std::printf("model     | %s: %d layers, d_model %d, %d heads, vocab %d (padded %d), max_seq_len %d, %.2fM params\n",
              m.arch.c_str(), m.n_layers, m.d_model, m.n_heads, m.vocab_size, m.padded_vocab, m.max_seq_len,
              table_.total_numel() / 1e6);
  std::printf("batch     | %d x %d tokens per micro-batch, %d accumulation steps, %lld tokens per step\n",
              b.micro_batch_size, b.seq_len, b.grad_accum_steps, static_cast<long long>(sequences_per_step() * b.seq_len));
  std::printf("layout    | dp %d tp %d pp %d cp %d (world %d)\n", cfg_.parallel.dp, cfg_.parallel.tp, cfg_.parallel.pp,
              cfg_.parallel.cp, world_.size);
  const size_t pbytes = table_.total_numel() * dtype_size(ops_.compute_dtype());
  const size_t fbytes = table_.total_numel() * 4;
  std::printf("memory    | params %s, grads %s, master %s, adam %s, activations %s\n", mib(pbytes).c_str(),
              mib(fbytes).c_str(), store_->master_is_params() ? "(= params)" : mib(fbytes).c_str(),
              mib(2 * fbytes).c_str(), mib(stage_->activation_bytes()).c_str());
  std::printf("data      | train %zu file(s), %llu tokens", train_data_->files().size(),
              static_cast<unsigned long long>(train_data_->total_tokens()));
  if (val_data_)
    std::printf("; val %zu file(s), %llu tokens", val_data_->files().size(),
                static_cast<unsigned long long>(val_data_->total_tokens()));
  std::printf("\n");
}

void Trainer::run() {
  print_startup();
  std::filesystem::create_directories(cfg_.run.out_dir);
  write_resolved_config(cfg_);

  // MFU needs a peak: configured, else the GPU table, else measured (the CPU backend).
  const auto& lg = cfg_.logging;
  double peak = lg.peak_tflops;
  std::string peak_source = "logging.peak_tflops";
  if (peak <= 0 && ops_.device() == Device::cuda) {
    peak = gpu_peak_tflops(ops_.device_description());
    peak_source = "device table";
  }
  if (peak <= 0) {
    const PeakProbe probe = measure_matmul_peak(ops_);
    peak = probe.tflops;
    peak_source = "measured: fp32 matmul " + std::to_string(probe.size) + "^3 on this device";
  }
  const double flops_tok = flops_per_token(table_, cfg_.model, cfg_.batch.seq_len, lg.flops_formula);
  std::printf("mfu       | %s; peak %.4f TFLOP/s (%s)\n",
              flops_formula_description(table_, cfg_.model, lg.flops_formula).c_str(), peak, peak_source.c_str());
  std::fflush(stdout);

  const std::string metrics_path = (std::filesystem::path(cfg_.run.out_dir) / lg.metrics_file).string();
  MetricsLog log(metrics_path, lg.flops_formula);
  const int total = cfg_.schedule.total_steps;
  const double tokens_per_step = static_cast<double>(sequences_per_step()) * cfg_.batch.seq_len;
  double timed_seconds = 0;  // steps after the first (which pays for warm-up)
  int timed_steps = 0;
  const auto run_start = Clock::now();

  while (step_ < total) {
    const auto t0 = Clock::now();
    const StepResult r = step();
    ops_.synchronize();
    const double dt = seconds_since(t0);
    if (step_ > 1) {
      timed_seconds += dt;
      timed_steps++;
    }
    const double avg_dt = timed_steps > 0 ? timed_seconds / timed_steps : dt;

    const bool last = step_ == total;
    const bool do_val = val_data_ && ((cfg_.data.val_every_steps > 0 && step_ % cfg_.data.val_every_steps == 0) || last);
    if (!do_val && step_ % lg.every_steps != 0 && !last) continue;

    StepMetrics m;
    m.step = step_;
    m.total_steps = total;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    m.dt_ms = dt * 1e3;
    m.tokens_per_s = tokens_per_step / dt;
    m.tflops_per_gpu = flops_tok * m.tokens_per_s / world_.size / 1e12;
    m.mfu = m.tflops_per_gpu / peak;
    m.tokens = static_cast<uint64_t>(tokens_per_step) * step_;
    m.eta_s = avg_dt * (total - step_);
    if (do_val) m.val_loss = evaluate();
    log.log(m);
  }
  std::printf("done      | %d steps in %s, metrics in %s\n", step_, format_duration(seconds_since(run_start)).c_str(),
              metrics_path.c_str());
}

}  // namespace pt
