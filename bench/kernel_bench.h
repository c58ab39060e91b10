// kernel_bench's pieces, shared by its files: the row a measurement makes, the timing harness
// (Bench) and the device buffers it times over (Buffers), the model shapes, the tables that fill
// the rows (the ceilings, one GPT-2 training step's ops, attention) and the reports written from
// them (markdown, JSON). The program, what it measures and how, is described in kernel_bench.cpp.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/ops.h"

namespace pt::kernel_bench {

void cuda_ok(cudaError_t e, const char* what);
double median(std::vector<double> v);
std::string fmt(const char* f, double a);  // snprintf of one number

// One measured op: what it is, the work of one call and how often a training step calls it.
struct Row {
  std::string section;  // "ceiling", "gpt2-124m", "attention", ...
  std::string op;
  std::string shape;
  bool flops = false;   // work is FLOPs (else bytes)
  double work = 0;      // per call
  std::string formula;  // how `work` follows from the shape
  double per_step = 0;  // calls per optimizer step; 0: not part of the step model
  double median_ms = 0, min_ms = 0;
  double rate = 0;      // GB/s or TFLOP/s at the median
  double fraction = 0;  // of the measured ceiling
};

// The timing harness (kernel_bench_harness.cpp): runs an op `warmup` times untimed, then `reps`
// times, each rep between CUDA events after an L2 flush (the host clock on the CPU backend), and
// appends its row with the median, the rate and the fraction of the ceilings measured so far.
class Bench {
 public:
  Bench(Ops& ops, int warmup, int reps);
  ~Bench();

  // Untimed and timed calls per op, for the ops run from now on: the attention table's calls take
  // up to tens of milliseconds each, so it runs fewer of them than the model's sub-millisecond ops.
  void set_repetitions(int warmup, int reps);

  // Median and minimum milliseconds of fn over the reps.
  std::pair<double, double> time(const std::function<void()>& fn);

  // Times fn, fills in row's measured fields, appends it to `rows`, prints it; the stored row.
  Row& run(Row row, const std::function<void()>& fn);

  double bw_ceiling = 0;    // GB/s, device-to-device copy
  double flop_ceiling = 0;  // TFLOP/s, large bf16 matmul
  std::vector<Row> rows;
  // Shapes an op refused (an exception, e.g. a size it does not support): section, shape, why.
  struct Failure {
    std::string section, shape, error;
  };
  std::vector<Failure> failures;

 private:
  Ops& ops_;
  const bool cuda_;
  int warmup_ = 0, reps_ = 0;
  Tensor flush_;
  std::vector<cudaEvent_t> events_;
};

// Device tensors filled with values uniform in [-scale, scale]: a 1 Mi-element random block
// uploaded once, then doubled by device copies (a host array the size of the logits would take
// seconds to upload). Periodic data is as good as any for timing.
class Buffers {
 public:
  explicit Buffers(Ops& ops) : ops_(ops) {}
  ~Buffers() { clear(); }
  Tensor rand(size_t n, DType dt, float scale);
  Tensor zeros(size_t n, DType dt);
  Tensor ints(const std::vector<int32_t>& v);
  void clear();  // synchronises, then releases every tensor made so far

 private:
  Ops& ops_;
  std::vector<Tensor> owned_;
};

struct ModelShape {
  std::string name;
  int L, C, NH, B, T, V = 50257, Vp = 50304, accum = 1;
};

// The tables; each appends its rows to b.rows (and refused shapes to b.failures).
// kernel_bench_harness.cpp: the copy bandwidth and large-matmul FLOP rate every row is judged against.
void bench_ceilings(Bench& b, Ops& ops, size_t copy_bytes, int matmul_n);
// kernel_bench_model.cpp: every op of a GPT-2 training step at micro-batch B.
void bench_model(Bench& b, Ops& ops, const ModelShape& m);
// kernel_bench_fp8.cpp: the FP8 casts and products at the model's block shapes (comparison rows).
void bench_fp8(Bench& b, Ops& ops, const ModelShape& m);
// kernel_bench_llama.cpp: the memory-bound ops a Llama block adds (RMSNorm, RoPE, SwiGLU) at Llama
// 3.2 1B's shapes, `rows` = B*T tokens of T.
void bench_llama_ops(Bench& b, Ops& ops, int rows, int T);
// The mixture-of-experts rows (kernel_bench_moe.cpp): routing and the experts' up product, grouped
// and per expert, for `tokens` tokens, d_model C, E experts of width H, top-k.
void bench_moe_ops(Bench& b, Ops& ops, int tokens, int C, int H, int E, int k);
// kernel_bench_attention.cpp: attention at bench/attention_sdpa.py's shapes.
void bench_attention(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                     const std::vector<int>& groups);

// What the reports say about the run besides the rows (kernel_bench_report.cpp).
struct RunInfo {
  std::string device, date;
  double peak = 0;   // datasheet dense bf16 TFLOP/s (0: unknown)
  bool cuda = true;  // timed by CUDA events (false: the CPU backend, --smoke)
  int warmup = 0, reps = 0;
  bool attention = true;  // the attention table ran
  int attention_warmup = 0, attention_reps = 0;
};
std::string markdown(const Bench& b, const RunInfo& run, const std::vector<ModelShape>& models);
std::string json_report(const Bench& b, const RunInfo& run, const std::vector<ModelShape>& models);

}  // namespace pt::kernel_bench
