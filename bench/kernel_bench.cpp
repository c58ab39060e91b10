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
//    parameter tensor as the trainer does), dtype casts;
//  - attention forward, backward and both, causal, at the shapes bench/attention_sdpa.py gives
//    PyTorch's flash and cuDNN SDPA: head dim 64 and 128, T 1k/2k/4k/8k/16k, hidden 2048 (NH =
//    2048/hd), B*T = 16384 tokens (FlashAttention's benchmarks), multi-head and grouped-query 8:1
//    (NKV = NH/8); fewer reps than the ops (--attention-warmup/--attention-reps): a call at T 16k
//    takes tens of milliseconds.
//
// How: each op runs `--warmup` times, then `--reps` times, each rep timed by a pair of CUDA events
// and preceded (outside the events) by a memset of twice the L2 cache, so every rep reads its
// inputs from DRAM, as llm.c's dev/cuda benchmarks do. The median rep is reported. CudaOps runs
// on its own blocking stream, which orders with the legacy default stream (cuda/cuda_ops.cpp),
// so events recorded on cudaStreamLegacy bracket exactly the op's work; a self-check compares
// that against host time around a synchronised copy and warns when they disagree.
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
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/common/build_info.h"
#include "core/metrics/flops.h"
#include "core/ops/ops.h"
#include "cuda/attention.h"
#include "cuda/cuda_backend.h"

namespace pt {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(std::string(what) + ": " + cudaGetErrorString(e));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

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

class Bench {
 public:
  Bench(Ops& ops, int warmup, int reps) : ops_(ops), cuda_(ops.device() == Device::cuda) {
    if (cuda_) {  // the CPU backend (--smoke) has no L2 to flush and uses the host clock
      int dev = 0, l2 = 0;
      cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
      cuda_ok(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
      // Twice the L2 (at least 64 MiB), so a memset of it evicts every line the op could reuse.
      flush_ = ops_.alloc(std::max<size_t>(size_t(2) * l2, size_t(64) << 20) / sizeof(float), DType::f32);
    }
    set_repetitions(warmup, reps);
  }
  ~Bench() {
    for (auto& e : events_) cudaEventDestroy(e);
    if (flush_) ops_.release(flush_);
  }

  // Untimed and timed calls per op, for the ops run from now on: the attention table's calls take
  // up to tens of milliseconds each, so it runs fewer of them than the model's sub-millisecond ops.
  void set_repetitions(int warmup, int reps) {
    warmup_ = warmup;
    reps_ = reps;
    while (cuda_ && events_.size() < 2 * size_t(reps_)) {
      cudaEvent_t e;
      cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
  }

  // Median and minimum milliseconds of fn over the reps.
  std::pair<double, double> time(const std::function<void()>& fn) {
    for (int i = 0; i < warmup_; i++) fn();
    if (!cuda_) {  // the CPU backend: its ops return when done
      std::vector<double> ms(reps_);
      for (auto& t : ms) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      return {median(ms), *std::min_element(ms.begin(), ms.end())};
    }
    for (int r = 0; r < reps_; r++) {
      ops_.zero(flush_);
      cuda_ok(cudaEventRecord(events_[2 * r], cudaStreamLegacy), "cudaEventRecord");
      fn();
      cuda_ok(cudaEventRecord(events_[2 * r + 1], cudaStreamLegacy), "cudaEventRecord");
    }
    cuda_ok(cudaEventSynchronize(events_[2 * size_t(reps_) - 1]), "cudaEventSynchronize");
    std::vector<double> ms(reps_);
    for (int r = 0; r < reps_; r++) {
      float t = 0;
      cuda_ok(cudaEventElapsedTime(&t, events_[2 * r], events_[2 * r + 1]), "cudaEventElapsedTime");
      ms[r] = t;
    }
    return {median(ms), *std::min_element(ms.begin(), ms.end())};
  }

  Row& run(Row row, const std::function<void()>& fn) {
    auto [med, mn] = time(fn);
    row.median_ms = med;
    row.min_ms = mn;
    row.rate = row.work / (med * 1e-3) / (row.flops ? 1e12 : 1e9);
    if (row.flops && flop_ceiling > 0) row.fraction = row.rate / flop_ceiling;
    if (!row.flops && bw_ceiling > 0) row.fraction = row.rate / bw_ceiling;
    rows.push_back(row);
    const Row& r = rows.back();
    std::fprintf(stderr, "  %-34s %-28s %10.1f us  %8.1f %s  %5.1f%%\n", r.op.c_str(), r.shape.c_str(),
                 r.median_ms * 1e3, r.rate, r.flops ? "TFLOP/s" : "GB/s", 100 * r.fraction);
    return rows.back();
  }

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
  Tensor rand(size_t n, DType dt, float scale) {
    Tensor t = ops_.alloc(n, dt);
    owned_.push_back(t);
    const size_t block = std::min<size_t>(n, size_t(1) << 20);
    std::vector<float> host(block);
    std::mt19937 rng(static_cast<unsigned>(owned_.size()));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (auto& x : host) x = u(rng);
    ops_.upload(t, host.data(), DType::f32, block);
    for (size_t have = block; have < n; have *= 2) {
      const size_t len = std::min(have, n - have);
      ops_.copy(t.slice(have, len), t.slice(0, len), len);
    }
    return t;
  }
  Tensor zeros(size_t n, DType dt) {
    Tensor t = ops_.alloc(n, dt);
    owned_.push_back(t);
    return t;
  }
  Tensor ints(const std::vector<int32_t>& v) {
    Tensor t = zeros(v.size(), DType::i32);
    ops_.upload(t, v.data(), DType::i32, v.size());
    return t;
  }
  void clear() {
    ops_.synchronize();
    for (auto& t : owned_) ops_.release(t);
    owned_.clear();
  }

 private:
  Ops& ops_;
  std::vector<Tensor> owned_;
};

struct ModelShape {
  std::string name;
  int L, C, NH, B, T, V = 50257, Vp = 50304, accum = 1;
};

// Parameter tensor sizes in GPT-2's order (llm.c's), for AdamW per tensor and the totals.
std::vector<size_t> param_sizes(const ModelShape& m) {
  const size_t C = m.C;
  std::vector<size_t> s = {size_t(m.Vp) * C, size_t(1024) * C};  // wte, wpe (max_seq_len 1024)
  for (int l = 0; l < m.L; l++) {
    const size_t layer[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    s.insert(s.end(), std::begin(layer), std::end(layer));
  }
  s.push_back(C);  // ln_f
  s.push_back(C);
  return s;
}

void bench_ceilings(Bench& b, Ops& ops, size_t copy_bytes, int matmul_n) {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  {
    const size_t n = copy_bytes / dtype_size(act);
    Tensor src = buf.rand(n, act, 1), dst = buf.zeros(n, act);
    Row r{"ceiling", "copy (device to device)", fmt("%.0f MiB ", copy_bytes / 1048576.0) + dtype_name(act), false,
          2.0 * copy_bytes, "2*n*s (read + write)"};
    b.bw_ceiling = b.run(r, [&] { ops.copy(dst, src, n); }).rate;
    b.rows.back().fraction = 1;
    // Self-check of the event timing: host time around a synchronised batch of the same copy.
    ops.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; i++) ops.copy(dst, src, n);
    ops.synchronize();
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
    if (b.rows.back().median_ms < 0.8 * host_ms)
      std::fprintf(stderr,
                   "warning: CUDA events measured the copy at %.3f ms but the host at %.3f ms: the events may not "
                   "see the backend's stream, so every time below may be too short\n",
                   b.rows.back().median_ms, host_ms);
  }
  buf.clear();
  {
    const int n = matmul_n;
    Tensor a = buf.rand(size_t(n) * n, act, 1), w = buf.rand(size_t(n) * n, act, 0.02f);
    Tensor out = buf.zeros(size_t(n) * n, act);
    Row r{"ceiling", "matmul_forward (large)", "N=IC=OC=" + std::to_string(n), true, 2.0 * n * n * n, "2*N*IC*OC"};
    b.flop_ceiling = b.run(r, [&] { ops.matmul_forward(out, a, w, Tensor{}, n, n, n); }).rate;
    b.rows.back().fraction = 1;
  }
}

// Every op of a GPT-2 training step at micro-batch B, as core/model/decoder_stage.cpp calls them.
void bench_model(Bench& b, Ops& ops, const ModelShape& m) {
  const std::string sec = m.name;
  const int B = m.B, T = m.T, C = m.C, L = m.L, NH = m.NH, Vp = m.Vp, V = m.V;
  const int N = B * T, F = 4 * C;
  const size_t NC = size_t(N) * C;
  const DType bf = ops.compute_dtype(), f32 = DType::f32;  // activations (bf16; f32 in --smoke), gradients
  const double s = static_cast<double>(dtype_size(bf)), g = 4;
  const double A = m.accum;   // micro-batches per optimizer step
  const std::string nshape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
  Buffers buf(ops);
  std::mt19937 rng(1);
  std::vector<int32_t> tok(N), pos_rows(N), pos(T);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % V);
  for (int i = 0; i < N; i++) pos_rows[i] = i % T;
  for (int t = 0; t < T; t++) pos[t] = t;
  std::vector<int32_t> sorted = tok;
  std::sort(sorted.begin(), sorted.end());
  const double U = static_cast<double>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());

  // ---- embeddings
  {
    Tensor tokens = buf.ints(tok), prow = buf.ints(pos_rows), p = buf.ints(pos);
    Tensor wte = buf.rand(size_t(Vp) * C, bf, 0.02f), wpe = buf.rand(size_t(T) * C, bf, 0.02f);
    Tensor x = buf.zeros(NC, bf), dx = buf.rand(NC, bf, 1);
    Tensor dwte = buf.zeros(size_t(Vp) * C, f32), dwpe = buf.zeros(size_t(T) * C, f32);
    b.run({sec, "embedding_forward", nshape, false, NC * 2 * s + 4.0 * N, "N*C*2s + 4N", A},
          [&] { ops.embedding_forward(x, tokens, wte, N, C, 0, Vp); });
    b.run({sec, "position_forward", nshape, false, NC * 2 * s + double(T) * C * s, "N*C*2s + T*C*s", A},
          [&] { ops.position_forward(x, wpe, prow, 1, N, C); });
    b.run({sec, "embedding_backward", nshape + " U=" + std::to_string(int(U)), false,
           NC * s + 2 * U * C * g + 4.0 * N, "N*C*s + 2*U*C*4 + 4N (U distinct tokens)", A},
          [&] { ops.embedding_backward(dwte, dx, tokens, N, C, 0, Vp); });
    b.run({sec, "position_backward", nshape, false, NC * s + 2.0 * T * C * g, "N*C*s + 2*T*C*4", A},
          [&] { ops.position_backward(dwpe, dx, p, B, T, C); });
  }
  buf.clear();

  // ---- LayerNorm, residual add, the memsets of backward
  {
    Tensor x = buf.rand(NC, bf, 1), out = buf.zeros(NC, bf), dout = buf.rand(NC, bf, 1), dx = buf.zeros(NC, bf);
    Tensor w = buf.rand(C, bf, 1), bias = buf.rand(C, bf, 0.1f), dw = buf.zeros(C, f32), db = buf.zeros(C, f32);
    Tensor mean = buf.zeros(N, f32), rstd = buf.zeros(N, f32);
    // Forward: every LayerNorm but the first block's ln_1 runs fused with the residual add before
    // it (DecoderStage), so the plain add is no longer a step op: its row stays for comparison.
    const double ln_calls = A * (2 * L + 1);
    b.run({sec, "layernorm_forward", nshape, false, NC * 2 * s + 8.0 * N + 2.0 * C * s, "N*C*2s + 8N + 2Cs", A},
          [&] { ops.layernorm_forward(out, mean, rstd, x, w, bias, N, C); });
    b.run({sec, "residual_layernorm_forward", nshape, false, NC * 4 * s + 8.0 * N + 2.0 * C * s,
           "N*C*4s (a, b, residual, out) + 8N + 2Cs", A * 2 * L},
          [&] { ops.residual_layernorm_forward(dx, out, mean, rstd, x, dout, w, bias, N, C); });
    b.run({sec, "layernorm_backward", nshape, false, NC * 4 * s + 8.0 * N + 4.0 * C * g,
           "N*C*4s (x, dout, dinp +=) + 8N + 4*C*4", ln_calls},
          [&] { ops.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C); });
    b.run({sec, "add (residual)", nshape, false, NC * 3 * s, "N*C*3s", 0},
          [&] { ops.add(out, x, dout, NC); });
    // Backward zeroes only the residual stream's gradient (once per micro-batch, at the head): the
    // matmuls', GELU's and attention's input gradients are overwritten, not accumulated (Ops).
    b.run({sec, "zero (memset)", nshape, false, NC * s, "N*C*s", A}, [&] { ops.zero(out); });
  }
  buf.clear();

  // ---- the matmuls: forward and backward of each of the five shapes (bf16 in, f32 gradients).
  // The fc forward and the fc projection's backward are counted with their GELU (the "fc + gelu"
  // rows below), so their plain rows count 0 calls: they stay for comparison.
  struct Mm {
    const char* name;
    int IC, OC;
    bool bias;
    double fwd_calls, bwd_calls;
  };
  const Mm mms[] = {{"qkv", C, 3 * C, true, A * L, A * L},
                    {"attn proj", C, C, true, A * L, A * L},
                    {"fc", C, F, true, 0, A * L},
                    {"fc proj", F, C, true, A * L, 0},
                    {"lm head", C, Vp, false, A, A}};
  for (const Mm& mm : mms) {
    const std::string shape = "N=" + std::to_string(N) + " IC=" + std::to_string(mm.IC) + " OC=" + std::to_string(mm.OC);
    Tensor inp = buf.rand(size_t(N) * mm.IC, bf, 1), w = buf.rand(size_t(mm.OC) * mm.IC, bf, 0.02f);
    Tensor bias = mm.bias ? buf.rand(mm.OC, bf, 0.02f) : Tensor{};
    Tensor out = buf.zeros(size_t(N) * mm.OC, bf);
    Tensor dinp = buf.zeros(size_t(N) * mm.IC, bf), dw = buf.zeros(size_t(mm.OC) * mm.IC, f32);
    Tensor dbias = mm.bias ? buf.zeros(mm.OC, f32) : Tensor{};
    const double fl = 2.0 * N * mm.IC * mm.OC;
    b.run({sec, std::string("matmul_forward ") + mm.name, shape, true, fl, "2*N*IC*OC", mm.fwd_calls},
          [&] { ops.matmul_forward(out, inp, w, bias, N, mm.IC, mm.OC); });
    b.run({sec, std::string("matmul_backward ") + mm.name, shape, true, 2 * fl,
           mm.bias ? "4*N*IC*OC (dinp, dW; dbias not counted)" : "4*N*IC*OC (dinp, dW)", mm.bwd_calls},
          [&] { ops.matmul_backward(dinp, dw, dbias, out, inp, w, N, mm.IC, mm.OC); });
    buf.clear();
  }

  // ---- attention at the model's shape (GPT-2: multi-head, n_kv_heads = n_heads)
  {
    const int hd = C / NH;
    Tensor qkv = buf.rand(NC * 3, bf, 1), out = buf.zeros(NC, bf), lse = buf.zeros(size_t(B) * NH * T, f32);
    Tensor dout = buf.rand(NC, bf, 1), dqkv = buf.zeros(NC * 3, bf);
    const double fl = 4.0 * B * NH * double(T) * T * hd / 2;
    const std::string shape = "B=" + std::to_string(B) + " NH=" + std::to_string(NH) + " T=" + std::to_string(T) +
                              " hd=" + std::to_string(hd);
    b.run({sec, "attention_forward", shape, true, fl, "4*B*NH*T^2*hd/2 (causal)", A * L},
          [&] { ops.attention_forward(out, lse, qkv, B, T, C, NH, NH); });
    b.run({sec, "attention_backward", shape, true, 2.5 * fl, "2.5 x forward", A * L},
          [&] { ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH); });
  }
  buf.clear();

  // ---- GELU, alone (comparison rows) and with the matmuls it can be fused into: the fc forward
  // (matmul_gelu_forward) and the fc projection's backward (matmul_backward_input_dgelu, then dW
  // and dbias), each next to the pair it replaces at the same shapes. The trainer runs the
  // forward apart (decoder_stage.h: selective recompute must rebuild fch_gelu bit for bit) and
  // the backward fused; the step model counts those two rows. CudaOps falls back to the pair
  // where cuBLASLt refuses the epilogue, and then both rows time the same work.
  {
    const size_t n = size_t(N) * F;
    Tensor x = buf.rand(n, bf, 2), y = buf.zeros(n, bf), dy = buf.rand(n, bf, 1), dx = buf.zeros(n, bf);
    const std::string shape = "n=N*4C=" + std::to_string(n);
    b.run({sec, "gelu_forward", shape, false, 2.0 * n * s, "2ns", 0}, [&] { ops.gelu_forward(y, x, n); });
    b.run({sec, "gelu_backward", shape, false, 3.0 * n * s, "3ns (inp, dout, dinp)", 0},
          [&] { ops.gelu_backward(dx, x, dy, n); });
    Tensor ln = buf.rand(NC, bf, 1), wfc = buf.rand(size_t(F) * C, bf, 0.02f), bfc = buf.rand(F, bf, 0.02f);
    Tensor wproj = buf.rand(size_t(C) * F, bf, 0.02f), dres = buf.rand(NC, bf, 1);
    Tensor dwproj = buf.zeros(size_t(C) * F, f32), dbproj = buf.zeros(C, f32);
    const double fl = 2.0 * N * C * F;
    const std::string mshape = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " 4C=" + std::to_string(F);
    b.run({sec, "fc + gelu forward, fused", mshape, true, fl, "2*N*C*4C", 0},
          [&] { ops.matmul_gelu_forward(y, x, ln, wfc, bfc, N, C, F); });
    b.run({sec, "fc + gelu forward, apart", mshape, true, fl, "2*N*C*4C", A * L}, [&] {
      ops.matmul_forward(x, ln, wfc, bfc, N, C, F);
      ops.gelu_forward(y, x, n);
    });
    b.run({sec, "fc proj + gelu backward, fused", mshape, true, 2 * fl, "4*N*4C*C (dinp, dW; dbias not counted)",
           A * L},
          [&] {
            ops.matmul_backward_input_dgelu(dx, dres, wproj, x, N, F, C);
            ops.matmul_backward(Tensor{}, dwproj, dbproj, dres, y, wproj, N, F, C);
          });
    b.run({sec, "fc proj + gelu backward, apart", mshape, true, 2 * fl, "4*N*4C*C (dinp, dW; dbias not counted)", 0},
          [&] {
            ops.matmul_backward(dy, dwproj, dbproj, dres, y, wproj, N, F, C);
            ops.gelu_backward(dx, x, dy, n);
          });
  }
  buf.clear();

  // ---- the loss
  {
    Tensor logits = buf.rand(size_t(N) * Vp, bf, 2), losses = buf.zeros(N, f32), targets = buf.ints(tok);
    const std::string shape = "N=" + std::to_string(N) + " Vp=" + std::to_string(Vp);
    // Training writes dlogits over the logits in place: one read and one write of the row, which
    // is all the kernel moves (it holds the row on chip between the two).
    b.run({sec, "softmax_cross_entropy (train)", shape, false, 2.0 * N * Vp * s + 8.0 * N, "N*Vp*2s + 8N", A},
          [&] { ops.softmax_cross_entropy(losses, logits, targets, N, V, Vp, 1.0f / N); });
    // sum and sum_squares return to the host: their time includes the copy and the round trip.
    b.run({sec, "sum (losses, to host)", "n=" + std::to_string(N), false, 4.0 * N, "4n", A},
          [&] { (void)ops.sum(losses, N); });
  }
  buf.clear();

  // ---- the optimizer step: gradient norm, AdamW, zeroing the gradients, casts
  {
    const std::vector<size_t> sizes = param_sizes(m);
    size_t P = 0;
    for (size_t n : sizes) P += n;
    const std::string shape = "P=" + std::to_string(P);
    Tensor params = buf.rand(P, bf, 0.02f), master = buf.rand(P, f32, 0.02f), grad = buf.rand(P, f32, 0.01f);
    Tensor mom = buf.zeros(P, f32), var = buf.zeros(P, f32);
    b.run({sec, "sum_squares (grad norm, to host)", shape, false, 4.0 * P, "4P (f32 gradients)", 1},
          [&] { (void)ops.sum_squares(grad, P); });
    int t = 1;
    b.run({sec, "adamw_update (one call)", shape, false, 30.0 * P, "30P (grad, master, m, v; master, m, v, bf16 param)",
           0},
          [&] { ops.adamw_update(params, master, grad, mom, var, P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t++, 1.0f); });
    b.run({sec, "adamw_update (per tensor, " + std::to_string(sizes.size()) + " calls)", shape, false, 30.0 * P,
           "30P", 1},
          [&] {
            size_t off = 0;
            for (size_t n : sizes) {
              ops.adamw_update(params.slice(off, n), master.slice(off, n), grad.slice(off, n), mom.slice(off, n),
                               var.slice(off, n), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f);
              off += n;
            }
            t++;
          });
    b.run({sec, "zero (f32 gradients)", shape, false, 4.0 * P, "4P", 1}, [&] { ops.zero(grad); });
    b.run({sec, "cast f32 -> bf16 (copy)", shape, false, 6.0 * P, "P*(4+2)", 0}, [&] { ops.copy(params, master, P); });
    b.run({sec, "cast bf16 -> f32 (copy)", shape, false, 6.0 * P, "P*(2+4)", 0}, [&] { ops.copy(master, params, P); });
    b.run({sec, "scale (f32)", shape, false, 8.0 * P, "2P*4", 0}, [&] { ops.scale(grad, 1.0f, P); });
  }
  buf.clear();
}

// Attention at the shapes bench/attention_sdpa.py gives PyTorch's SDPA back ends: head sizes 64 and
// 128, NH = hidden / hd query heads, B = tokens / T, causal, for each entry of `groups` (query heads
// per key/value head: 1 is multi-head, 8 grouped-query 8:1 with NKV = NH / 8). The FLOPs do not
// depend on NKV: every query head still scores and mixes all its visible keys. Multi-head rows keep
// the shape string of earlier runs ("B= NH= T= hd="), grouped-query rows add "NKV=", which is how
// bench_summary.py tells them apart. A shape the backend refuses (an exception) is noted in
// b.failures and the table goes on, so one unsupported size does not lose the others.
void bench_attention(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                     const std::vector<int>& groups) {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  for (int group : groups)
    for (int hd : {64, 128}) {
      const int NH = hidden / hd, C = hidden;
      if (group < 1 || NH % group != 0) {
        b.failures.push_back({"attention", "NH=" + std::to_string(NH) + " hd=" + std::to_string(hd),
                              std::to_string(group) + " query heads per key/value head do not divide NH"});
        continue;
      }
      const int NKV = NH / group;
      for (int T : seq_lens) {
        const int B = std::max(1, tokens / T);
        std::string shape = "B=" + std::to_string(B) + " NH=" + std::to_string(NH);
        if (NKV != NH) shape += " NKV=" + std::to_string(NKV);
        shape += " T=" + std::to_string(T) + " hd=" + std::to_string(hd);
        // qkv and dqkv: [B, T, (NH + 2 NKV) hd], q | k | v as the model's projection writes them.
        const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * hd;
        Tensor qkv = buf.rand(BT * W, act, 1), out = buf.zeros(BT * C, act);
        Tensor lse = buf.zeros(size_t(B) * NH * T, DType::f32);
        Tensor dout = buf.rand(BT * C, act, 1), dqkv = buf.zeros(BT * W, act);
        const double fl = 4.0 * B * NH * double(T) * T * hd / 2;
        // Forward first: backward's timing reads the out and lse it left.
        auto fwd = [&] { ops.attention_forward(out, lse, qkv, B, T, C, NH, NKV); };
        auto bwd = [&] { ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV); };
        try {
          b.run({"attention", "attention_forward", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
          b.run({"attention", "attention_backward", shape, true, 2.5 * fl, "2.5 x fwd"}, bwd);
          b.run({"attention", "attention_fwd+bwd", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
            fwd();
            bwd();
          });
          // The Hopper forward beside whichever forward the rows above ran (PICOTRAIN_FLASH_FORWARD).
          if (act == DType::bf16 && ops.device() == Device::cuda && gpu::flash_forward_sm90_available()) {
            const gpu::FlashForwardPath saved = gpu::flash_forward_path();
            gpu::set_flash_forward_path(gpu::FlashForwardPath::wgmma);
            try {
              b.run({"attention", "attention_forward_sm90", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
              b.run({"attention", "attention_fwd+bwd_sm90", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                fwd();
                bwd();
              });
            } catch (...) {
              gpu::set_flash_forward_path(saved);
              throw;
            }
            gpu::set_flash_forward_path(saved);
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "  attention %s: not timed: %s\n", shape.c_str(), e.what());
          b.failures.push_back({"attention", shape, e.what()});
        }
        buf.clear();
      }
    }
}

std::string human_work(const Row& r) {
  if (r.flops) return fmt("%.1f GFLOP", r.work / 1e9);
  if (r.work >= 1e9) return fmt("%.2f GB", r.work / 1e9);
  if (r.work >= 1e6) return fmt("%.1f MB", r.work / 1e6);
  return fmt("%.1f KB", r.work / 1e3);
}

std::string markdown(const Bench& b, const std::string& device, const std::string& date, double peak,
                     const std::vector<ModelShape>& models, bool cuda) {
  std::string md;
  md += "# picotrain kernel benchmark\n\n";
  md += "- device: " + device + "\n- date: " + date + "\n- build: " + build_description() + "\n";
  md += "- bandwidth ceiling (device-to-device copy, measured): " + fmt("%.0f GB/s", b.bw_ceiling) + "\n";
  std::string matmul_shape;
  for (const Row& r : b.rows)
    if (r.section == "ceiling" && r.flops) matmul_shape = r.shape;
  md += "- FLOP ceiling (matmul_forward " + matmul_shape + ", measured): " + fmt("%.1f TFLOP/s", b.flop_ceiling);
  if (peak > 0) md += fmt(" = %.1f%% of the datasheet dense bf16 peak", 100 * b.flop_ceiling / peak) + fmt(" (%.1f TFLOP/s)", peak);
  md += cuda ? "\n- timing: CUDA events, median of the reps, L2 flushed before each rep. "
              : "\n- timing: host clock, median of the reps (--smoke: the CPU backend at tiny shapes; not a benchmark). ";
  md += "Work is the floor an op must "
        "move (bytes) or the model FLOPs; attention FLOPs count causal as half (FlashAttention's convention), "
        "backward = 2.5 x forward. `% ceil`: of the measured copy bandwidth (bytes rows) or matmul rate (FLOP rows); "
        "LOW: a memory-bound op under 70% of the bandwidth.\n\n";
  auto table = [&](const std::string& section, bool step) {
    md += "| op | shape | median us | work | formula | achieved | % ceil |";
    md += step ? " calls/step | ms/step | % of step |\n|---|---|---|---|---|---|---|---|---|---|\n"
               : "\n|---|---|---|---|---|---|---|\n";
    double total = 0;
    for (const Row& r : b.rows)
      if (r.section == section) total += r.per_step * r.median_ms;
    for (const Row& r : b.rows) {
      if (r.section != section) continue;
      const bool low = !r.flops && r.section != "ceiling" && r.fraction < 0.7 && r.work > 1e6;
      md += "| " + r.op + " | " + r.shape + " | " + fmt("%.1f", r.median_ms * 1e3) + " | " + human_work(r) + " | " +
            r.formula + " | " + fmt(r.flops ? "%.1f TFLOP/s" : "%.0f GB/s", r.rate) + " | " +
            fmt("%.1f%%", 100 * r.fraction) + (low ? " LOW" : "") + " |";
      if (step)
        md += " " + fmt("%g", r.per_step) + " | " + fmt("%.2f", r.per_step * r.median_ms) + " | " +
              (r.per_step > 0 && total > 0 ? fmt("%.1f%%", 100 * r.per_step * r.median_ms / total) : "") + " |";
      md += "\n";
    }
    return total;
  };
  md += "## Ceilings\n\n";
  table("ceiling", false);
  for (const ModelShape& m : models) {
    md += "\n## " + m.name + ": L=" + std::to_string(m.L) + " C=" + std::to_string(m.C) + " NH=" +
          std::to_string(m.NH) + " B=" + std::to_string(m.B) + " T=" + std::to_string(m.T) +
          " accum=" + std::to_string(m.accum) + "\n\n";
    const double total = table(m.name, true);
    const double tokens = double(m.B) * m.T * m.accum;
    md += "\nSum of kernel time per optimizer step (" + fmt("%.0f", tokens) + " tokens): " + fmt("%.1f ms", total) +
          fmt(", i.e. at most %.0f tokens/s", tokens / (total * 1e-3)) +
          " if nothing else took time. Compare with the measured step time of `picotrain train`; the difference is "
          "launch gaps, host synchronisation and work not listed here.\n";
    // The biggest items first: where the step's GPU time goes.
    std::vector<const Row*> top;
    for (const Row& r : b.rows)
      if (r.section == m.name && r.per_step > 0) top.push_back(&r);
    std::sort(top.begin(), top.end(),
              [](const Row* a, const Row* c) { return a->per_step * a->median_ms > c->per_step * c->median_ms; });
    md += "\nLargest shares: ";
    for (size_t i = 0; i < top.size() && i < 8; i++)
      md += (i ? ", " : "") + top[i]->op + fmt(" %.1f%%", 100 * top[i]->per_step * top[i]->median_ms / total);
    md += "\n";
  }
  bool any_attention = false;
  for (const Row& r : b.rows) any_attention |= r.section == "attention";
  if (any_attention) {
    md += "\n## Attention (compare with bench/attention_sdpa.py at the same shapes)\n\n";
    md += "Causal; NKV= in the shape: grouped-query (NKV key/value heads), else multi-head. The FLOPs do not "
          "depend on NKV.\n\n";
    table("attention", false);
  }
  if (!b.failures.empty()) {
    md += "\n## Not timed\n\n| section | shape | why |\n|---|---|---|\n";
    for (const auto& f : b.failures) md += "| " + f.section + " | " + f.shape + " | " + f.error + " |\n";
  }
  return md;
}

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
  for (const ModelShape& m : models) bench_model(b, *ops, m);
  if (!no_attention) {
    std::fprintf(stderr, "attention: %d warm-up + %d timed reps per op\n", att_warmup, att_reps);
    b.set_repetitions(att_warmup, att_reps);
    bench_attention(b, *ops, att_tokens, att_hidden, att_seq_lens, att_groups);
  }
  ops->synchronize();

  const std::string md = markdown(b, device, date, peak, models, !smoke);
  std::printf("%s", md.c_str());
  if (!md_path.empty()) std::ofstream(md_path) << md;
  if (!json_path.empty()) {
    nlohmann::json j;
    j["device"] = device;
    j["date"] = date;
    j["build"] = {{"commit", build_info().commit}, {"tree", build_info().tree}};
    j["datasheet_peak_tflops"] = peak;
    j["bandwidth_ceiling_gbps"] = b.bw_ceiling;
    j["flop_ceiling_tflops"] = b.flop_ceiling;
    j["warmup"] = warmup;
    j["reps"] = reps;
    if (!no_attention) {
      j["attention_warmup"] = att_warmup;
      j["attention_reps"] = att_reps;
    }
    for (const ModelShape& m : models) {
      double total = 0;
      for (const Row& r : b.rows)
        if (r.section == m.name) total += r.per_step * r.median_ms;
      j["step_model"][m.name] = {{"L", m.L},     {"C", m.C},         {"NH", m.NH},
                                 {"B", m.B},     {"T", m.T},         {"accum", m.accum},
                                 {"kernel_ms_per_step", total},
                                 {"tokens_per_step", double(m.B) * m.T * m.accum}};
    }
    for (const Row& r : b.rows)
      j["rows"].push_back({{"section", r.section},   {"op", r.op},           {"shape", r.shape},
                           {"unit", r.flops ? "FLOP" : "byte"}, {"work", r.work}, {"formula", r.formula},
                           {"calls_per_step", r.per_step}, {"median_ms", r.median_ms}, {"min_ms", r.min_ms},
                           {"rate", r.rate}, {"rate_unit", r.flops ? "TFLOP/s" : "GB/s"}, {"fraction", r.fraction}});
    for (const auto& f : b.failures)
      j["failures"].push_back({{"section", f.section}, {"shape", f.shape}, {"error", f.error}});
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  // The results are written; a refused shape still fails the run, so that nobody misses it.
  if (!b.failures.empty()) {
    std::fprintf(stderr, "error: %zu shape(s) not timed (see \"Not timed\")\n", b.failures.size());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  try {
    return pt::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
