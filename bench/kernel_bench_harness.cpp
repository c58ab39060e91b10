// kernel_bench's timing harness: Bench times one op (warm-up calls, then timed reps, each between
// a pair of CUDA events on the legacy default stream after a memset of twice the L2 cache, so every
// rep reads its inputs from DRAM; the host clock on the CPU backend) and makes its row; Buffers
// fills the device tensors the ops run on; bench_ceilings measures the copy bandwidth and matmul
// FLOP rate every later row is judged against, and checks the event timing against the host clock.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "bench/kernel_bench.h"

namespace pt::kernel_bench {

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

Bench::Bench(Ops& ops, int warmup, int reps) : ops_(ops), cuda_(ops.device() == Device::cuda) {
  if (cuda_) {  // the CPU backend (--smoke) has no L2 to flush and uses the host clock
    int dev = 0, l2 = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
    // Twice the L2 (at least 64 MiB), so a memset of it evicts every line the op could reuse.
    flush_ = ops_.alloc(std::max<size_t>(size_t(2) * l2, size_t(64) << 20) / sizeof(float), DType::f32);
  }
  set_repetitions(warmup, reps);
}

Bench::~Bench() {
  for (auto& e : events_) cudaEventDestroy(e);
  if (flush_) ops_.release(flush_);
}

void Bench::set_repetitions(int warmup, int reps) {
  warmup_ = warmup;
  reps_ = reps;
  while (cuda_ && events_.size() < 2 * size_t(reps_)) {
    cudaEvent_t e;
    cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
}

std::pair<double, double> Bench::time(const std::function<void()>& fn) {
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

Row& Bench::run(Row row, const std::function<void()>& fn) {
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

Tensor Buffers::rand(size_t n, DType dt, float scale) {
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

Tensor Buffers::zeros(size_t n, DType dt) {
  Tensor t = ops_.alloc(n, dt);
  owned_.push_back(t);
  return t;
}

Tensor Buffers::ints(const std::vector<int32_t>& v) {
  Tensor t = zeros(v.size(), DType::i32);
  ops_.upload(t, v.data(), DType::i32, v.size());
  return t;
}

void Buffers::clear() {
  ops_.synchronize();
  for (auto& t : owned_) ops_.release(t);
  owned_.clear();
}

// The ceilings: a device-to-device copy of copy_bytes and a matmul_forward of matmul_n^3, each
// row's fraction set to 1; every later row's fraction is of these.
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

}  // namespace pt::kernel_bench
