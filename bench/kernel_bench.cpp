// kernel_bench: times every op of the CUDA backend at GPT-2 training shapes, through the public
// Ops interface (make_cuda_ops), and judges each against the ceilings measured in the same run.
//
// What it measures:
//  - ceilings: the memory bandwidth of a device-to-device copy (Ops::copy, 2 x 1 GiB moved)
//    and the FLOP rate of a large bf16 matmul (Ops::matmul_forward, 8192^3), next to the
//    datasheet dense bf16 peak that picotrain's MFU uses (core/metrics/flops.cpp);
//  - every op of one GPT-2 training step (124M by default, 1.5B with --model 1.5b): embeddings,
//    LayerNorm, the five matmul shapes (qkv, attention projection, fc, fc projection, LM head)
//    forward and backward, attention, GELU (alone, and fused into the fc matmuls next to the
//    unfused pair), residual adds, the memsets backward does, the fused softmax + cross-entropy,
//    the loss sum, the gradient norm, AdamW (one call over all parameters, and one call per
//    parameter tensor as the trainer does), dtype casts; beside them (0 calls per step) the FP8
//    casts and products at the block's four matmul shapes next to bf16's (kernel_bench_fp8.cpp);
//  - with the model table, the memory-bound ops a Llama block adds (RMSNorm with and without its
//    residual add, RoPE, SwiGLU; forward and backward) at Llama 3.2 1B's shapes, B*T = 8 x 2048
//    (kernel_bench_llama.cpp), and a small Mixtral's routing and expert up product, grouped over the
//    device's offsets and per expert (kernel_bench_moe.cpp);
//  - attention forward, backward and both, causal, at the shapes bench/attention_sdpa.py gives
//    PyTorch's flash and cuDNN SDPA: head dim 64 and 128, T 1k/2k/4k/8k/16k, hidden 2048 (NH =
//    2048/hd), B*T = 16384 tokens (FlashAttention's benchmarks), multi-head and grouped-query 8:1
//    (NKV = NH/8); fewer reps than the ops (--attention-warmup/--attention-reps): a call at T 16k
//    takes tens of milliseconds; beside them ring attention's blocks and decoding against a KV
//    cache (Tk 2k and 8k).
//
// How (kernel_bench_harness.cpp): each op runs `--warmup` times, then `--reps` times, each rep
// timed by a pair of CUDA events and preceded (outside the events) by a memset of twice the L2
// cache, so every rep reads its inputs from DRAM, as llm.c's dev/cuda benchmarks do. The median
// rep is reported. CudaOps runs on its own blocking stream, which orders with the legacy default
// stream (cuda/cuda_ops.cpp), so events recorded on cudaStreamLegacy bracket exactly the op's
// work; a self-check compares that against host time around a synchronised copy and warns when
// they disagree.
//
// Work per call is computed from the shapes with the formula printed next to it: the bytes an
// op must move at least (its "floor": each input read once, each output written once; "+="
// outputs are read and written) for memory-bound ops, the model FLOPs for matmuls and attention
// (attention: FlashAttention's convention, causal counts half the T^2 pairs, backward = 2.5 x
// forward). Achieved GB/s or TFLOP/s and the fraction of the measured ceiling follow; a
// memory-bound op under 70% of the copy bandwidth is flagged (issue #9's floor).
//
// The "step" columns multiply each op's median time by its calls per optimizer step (micro-batch
// B, grad accumulation --accum, zero_stage 0, no recompute, as core/model/decoder_stage.cpp calls
// them) and sum them: where the GPU time of a training step goes, to hold against the measured
// step time of `picotrain train` (the difference is launch gaps, host syncs and anything not here).
//
//   build-bench/bench/kernel_bench                      # GPT-2 124M (B 64) + attention table
//   build-bench/bench/kernel_bench --model none         # the ceilings and the attention table only
//   build-bench/bench/kernel_bench --model 1.5b --json out.json --md out.md
//   build-bench/bench/kernel_bench --smoke          # no GPU: the same calls on the CPU backend, tiny shapes
//
// Exits 77 (skip) when there is no GPU (unless --smoke), 1 on a failure or when an attention shape
// was not timed (after writing --json and --md).
//
// The files: kernel_bench.h (the pieces they share), kernel_bench_harness.cpp (the timing, the
// buffers, the ceilings), kernel_bench_model.cpp (the training step's ops),
// kernel_bench_fp8.cpp (the FP8 rows), kernel_bench_llama.cpp and kernel_bench_moe.cpp (the
// Llama and mixture-of-experts rows), kernel_bench_attention.cpp (the attention table),
// kernel_bench_report.cpp (markdown and JSON),
// and this one: the command line and the order of the tables.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "core/metrics/flops.h"
#include "cuda/cuda_backend.h"

namespace pt::kernel_bench {
namespace {

int main_impl(int argc, char** argv) {
  CLI::App app{"Times every CUDA op of a GPT-2 training step and attention against measured ceilings"};
  std::vector<std::string> model_names = {"124m"};
  int b124 = 64, b15 = 8, T = 1024, accum124 = 8, accum15 = 16, warmup = 3, reps = 20, att_tokens = 16384,
      att_hidden = 2048, att_warmup = 2, att_reps = 10;
  std::vector<int> att_seq_lens = {1024, 2048, 4096, 8192, 16384}, att_groups = {1, 8};
  bool no_attention = false, smoke = false;
  std::string json_path, md_path;
  app.add_option("--model", model_names, "Model shapes to time: 124m, 1.5b (repeatable; 'none' for attention only)");
  app.add_option("--b124", b124, "Micro-batch of GPT-2 124M (configs/gpt2-124m.json: 64)");
  app.add_option("--b15", b15, "Micro-batch of GPT-2 1.5B (configs/gpt2-1.5b.json: 8)");
  app.add_option("--accum124", accum124, "Micro-batches per optimizer step, 124M (524288 tokens at B 64: 8)");
  app.add_option("--accum15", accum15, "Micro-batches per optimizer step, 1.5B");
  app.add_option("-T,--seq-len", T, "Sequence length of the model shapes");
  app.add_option("--warmup", warmup, "Untimed calls before timing");
  app.add_option("--reps", reps, "Timed calls; the median is reported")->check(CLI::PositiveNumber);
  app.add_flag("--no-attention", no_attention, "Skip the attention table (hd 64/128, --attention-seq-lens)");
  app.add_option("--attention-tokens", att_tokens, "B*T of the attention table (FlashAttention's benchmarks: 16384)");
  app.add_option("--attention-hidden", att_hidden, "NH*hd of the attention table (FlashAttention's benchmarks: 2048)");
  app.add_option("--attention-seq-lens", att_seq_lens, "Sequence lengths of the attention table");
  app.add_option("--attention-groups", att_groups,
                 "Query heads per key/value head of the attention table (1: multi-head; 8: grouped-query 8:1)");
  // One fwd+bwd at T 16k takes tens of milliseconds: the attention table runs fewer reps than the ops.
  app.add_option("--attention-warmup", att_warmup, "Untimed calls before timing, attention table");
  app.add_option("--attention-reps", att_reps, "Timed calls, attention table")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "Write the rows as JSON here");
  app.add_option("--md", md_path, "Write the markdown report here");
  app.add_flag("--smoke", smoke,
               "Check the program without a GPU: every op on the CPU backend (f32) at tiny shapes, host-timed");
  CLI11_PARSE(app, argc, argv);

  std::vector<ModelShape> models;
  for (const auto& n : model_names) {
    if (n == "124m")
      models.push_back({"gpt2-124m", 12, 768, 12, b124, T, 50257, 50304, accum124});
    else if (n == "1.5b")
      models.push_back({"gpt2-1.5b", 48, 1600, 25, b15, T, 50257, 50304, accum15});
    else if (n != "none")
      throw ConfigError("--model " + n + " must be 124m, 1.5b or none");
  }
  size_t copy_bytes = size_t(1) << 30;
  int matmul_n = 8192;
  std::unique_ptr<Ops> ops;
  if (smoke) {
    // The same code path at shapes a CPU finishes in seconds: it checks every call's arguments.
    for (auto& m : models) m = {m.name + " (smoke: 2 layers, C 128)", 2, 128, 2, 2, 64, 50257, 50304, 2};
    copy_bytes = size_t(16) << 20;
    matmul_n = 256;
    att_tokens = 256;
    att_hidden = 1024;  // NH 16 / 8 at hd 64 / 128: grouped-query 8:1 still has whole key/value heads
    att_seq_lens = {64, 128};
    warmup = att_warmup = 1;
    reps = att_reps = 2;
    ops = make_ops(Device::cpu);
  } else {
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "kernel_bench: no GPU (%s); nothing to measure\n", cuda_status_message().c_str());
      return 77;
    }
    ops = make_cuda_ops(DType::bf16);
  }
  const std::string device = ops->device_description();
  const double peak = gpu_peak_tflops(device);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(stderr, "kernel_bench on %s, %d warm-up + %d timed reps per op\n", device.c_str(), warmup, reps);

  Bench b(*ops, warmup, reps);
  bench_ceilings(b, *ops, copy_bytes, matmul_n);
  for (const ModelShape& m : models) {
    bench_model(b, *ops, m);
    bench_fp8(b, *ops, m);
  }
  if (!models.empty()) bench_llama_ops(b, *ops, smoke ? 128 : 8 * 2048, smoke ? 64 : 2048);
  if (!models.empty()) {
    if (smoke) bench_moe_ops(b, *ops, 64, 128, 96, 8, 2);
    else bench_moe_ops(b, *ops, 8192, 2048, 4096, 8, 2);
  }
  if (!no_attention) {
    std::fprintf(stderr, "attention: %d warm-up + %d timed reps per op\n", att_warmup, att_reps);
    b.set_repetitions(att_warmup, att_reps);
    bench_attention(b, *ops, att_tokens, att_hidden, att_seq_lens, att_groups);
  }
  ops->synchronize();

  RunInfo run;
  run.device = device;
  run.date = date;
  run.peak = peak;
  run.cuda = !smoke;
  run.warmup = warmup;
  run.reps = reps;
  run.attention = !no_attention;
  run.attention_warmup = att_warmup;
  run.attention_reps = att_reps;
  const std::string md = markdown(b, run, models);
  std::printf("%s", md.c_str());
  if (!md_path.empty()) std::ofstream(md_path) << md;
  if (!json_path.empty()) std::ofstream(json_path) << json_report(b, run, models) << "\n";
  // The results are written; a refused shape still fails the run, so that nobody misses it.
  if (!b.failures.empty()) {
    std::fprintf(stderr, "error: %zu shape(s) not timed (see \"Not timed\")\n", b.failures.size());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pt::kernel_bench

int main(int argc, char** argv) {
  try {
    return pt::kernel_bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
