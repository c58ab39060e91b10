// kernel_bench's attention table: causal attention forward, backward and both at the shapes
// bench/attention_sdpa.py gives PyTorch's flash and cuDNN SDPA (head dim 64 and 128, a fixed hidden
// size and B*T tokens over a list of T), multi-head and grouped-query, plus the Hopper (sm_90)
// forward beside the default one where the GPU has it, and FP8 attention (Ops::attention_fp8_*:
// the casts and the FP8 flash forward; the backward on the dequantised inputs) where the backend
// runs it.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "bench/kernel_bench.h"
#include "cuda/attention.h"

namespace pt::kernel_bench {

namespace {

// One pass over the table's shapes: runs `rows(shape, fl, fwd, bwd, fwd8, bwd8)` for each, with
// fresh inputs (fwd8, bwd8: the FP8 attention ops on the same tensors).
// A shape the backend refuses (an exception) is noted in b.failures and the pass goes on.
template <class Rows>
void each_shape(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                const std::vector<int>& groups, Rows rows) {
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
        auto fwd8 = [&] { ops.attention_fp8_forward(out, lse, qkv, B, T, C, NH, NKV); };
        auto bwd8 = [&] { ops.attention_fp8_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV); };
        try {
          rows(shape, fl, fwd, bwd, fwd8, bwd8);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "  attention %s: not timed: %s\n", shape.c_str(), e.what());
          b.failures.push_back({"attention", shape, e.what()});
        }
        buf.clear();
      }
    }
}

}  // namespace

// Attention at the shapes bench/attention_sdpa.py gives PyTorch's SDPA back ends: head sizes 64 and
// 128, NH = hidden / hd query heads, B = tokens / T, causal, for each entry of `groups` (query heads
// per key/value head: 1 is multi-head, 8 grouped-query 8:1 with NKV = NH / 8). The FLOPs do not
// depend on NKV: every query head still scores and mixes all its visible keys. Multi-head rows keep
// the shape string of earlier runs ("B= NH= T= hd="), grouped-query rows add "NKV=", which is how
// bench_summary.py tells them apart. The Hopper forward's rows (where the GPU has it) come in a
// second pass after every default row: a kernel that faults leaves the process's CUDA context
// unusable, and must not cost the rows of the kernels the trainer runs. The FP8 rows come last, in
// a third pass, for the same reason (where the backend runs FP8 attention at both head sizes):
// attention_fp8_forward (the cast and the FP8 kernel, as the trainer calls it) beside the bf16
// forward's rows, and the FP8 forward and backward together.
void bench_attention(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                     const std::vector<int>& groups) {
  // The default rows are the sm_80 forward's (the trainer's default, auto, takes the Hopper kernel
  // where there is one: its own rows below).
  const gpu::FlashForwardPath trainer_path = gpu::flash_forward_path();
  gpu::set_flash_forward_path(gpu::FlashForwardPath::mma);
  each_shape(b, ops, tokens, hidden, seq_lens, groups,
             [&](const std::string& shape, double fl, const auto& fwd, const auto& bwd, const auto&, const auto&) {
               b.run({"attention", "attention_forward", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
               b.run({"attention", "attention_backward", shape, true, 2.5 * fl, "2.5 x fwd"}, bwd);
               b.run({"attention", "attention_fwd+bwd", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                 fwd();
                 bwd();
               });
             });
  gpu::set_flash_forward_path(trainer_path);
  if (ops.compute_dtype() == DType::bf16 && ops.device() == Device::cuda && gpu::flash_forward_sm90_available()) {
    const gpu::FlashForwardPath saved = gpu::flash_forward_path();
    gpu::set_flash_forward_path(gpu::FlashForwardPath::wgmma);
    each_shape(b, ops, tokens, hidden, seq_lens, groups,
               [&](const std::string& shape, double fl, const auto& fwd, const auto& bwd, const auto&, const auto&) {
                 b.run({"attention", "attention_forward_sm90", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
                 b.run({"attention", "attention_fwd+bwd_sm90", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                   fwd();
                   bwd();
                 });
               });
    gpu::set_flash_forward_path(saved);
  }
  if (!ops.supports_fp8_attention(64) || !ops.supports_fp8_attention(128)) return;
  each_shape(b, ops, tokens, hidden, seq_lens, groups,
             [&](const std::string& shape, double fl, const auto&, const auto&, const auto& fwd8, const auto& bwd8) {
               b.run({"attention", "attention_fp8_forward", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd8);
               b.run({"attention", "attention_fp8_fwd+bwd", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                 fwd8();
                 bwd8();
               });
             });
}

}  // namespace pt::kernel_bench
