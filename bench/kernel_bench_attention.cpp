// kernel_bench's attention table: causal attention forward, backward and both at the shapes
// bench/attention_sdpa.py gives PyTorch's flash and cuDNN SDPA (head dim 64 and 128, a fixed hidden
// size and B*T tokens over a list of T), multi-head and grouped-query, plus the Hopper (sm_90)
// kernels beside the default ones where the GPU has them, ring attention's blocks, decoding against
// a KV cache, head sizes the flash kernels run zero-padded, and FP8 attention
// (Ops::attention_fp8_*: the casts and the FP8 flash forward; the backward on the dequantised
// inputs) where the backend runs it.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "bench/kernel_bench.h"
#include "cuda/attention.h"

namespace pt::kernel_bench {

namespace {

// One pass over the table's shapes (head sizes 64 and 128 for each group size, then each T):
// calls `fn(shape, B, T, NH, NKV, hd)`. A shape the backend refuses (an exception) is noted in
// b.failures and the pass goes on.
template <class Fn>
void for_each_shape(Bench& b, int tokens, int hidden, const std::vector<int>& seq_lens, const std::vector<int>& groups,
                    Fn fn) {
  for (int group : groups)
    for (int hd : {64, 128}) {
      const int NH = hidden / hd;
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
        try {
          fn(shape, B, T, NH, NKV, hd);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "  attention %s: not timed: %s\n", shape.c_str(), e.what());
          b.failures.push_back({"attention", shape, e.what()});
        }
      }
    }
}

// The causal attention rows over every shape: runs `rows(shape, fl, fwd, bwd, fwd8, bwd8)` for
// each, with fresh inputs (fwd8, bwd8: the FP8 attention ops on the same tensors).
template <class Rows>
void each_shape(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                const std::vector<int>& groups, Rows rows) {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  for_each_shape(b, tokens, hidden, seq_lens, groups,
                 [&](const std::string& shape, int B, int T, int NH, int NKV, int hd) {
                   buf.clear();  // the previous shape's tensors (a refused shape's too)
                   // qkv and dqkv: [B, T, (NH + 2 NKV) hd], q | k | v as the model's projection writes them.
                   const size_t BT = size_t(B) * T, W = size_t(NH + 2 * NKV) * hd;
                   const int C = hidden;
                   Tensor qkv = buf.rand(BT * W, act, 1), out = buf.zeros(BT * C, act);
                   Tensor lse = buf.zeros(size_t(B) * NH * T, DType::f32);
                   Tensor dout = buf.rand(BT * C, act, 1), dqkv = buf.zeros(BT * W, act);
                   const double fl = 4.0 * B * NH * double(T) * T * hd / 2;
                   // Forward first: backward's timing reads the out and lse it left.
                   auto fwd = [&] { ops.attention_forward(out, lse, qkv, B, T, C, NH, NKV); };
                   auto bwd = [&] { ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV); };
                   auto fwd8 = [&] { ops.attention_fp8_forward(out, lse, qkv, B, T, C, NH, NKV); };
                   auto bwd8 = [&] { ops.attention_fp8_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV); };
                   rows(shape, fl, fwd, bwd, fwd8, bwd8);
                 });
}

// Ring attention's blocks at the same shapes (Ops::attention_block_*, as RingAttention calls them):
// a past block, the T/2 queries of a sequence's second half against the T/2 keys of its first
// (every key visible: the pairs ring attention over two ranks computes beside the two causal
// diagonal blocks), in separate q, k, v tensors; the forward, and the forward with the backward
// (which adds into dq, dk, dv). `suffix` ends the rows' op names (the Hopper kernels' pass: "_sm90").
void block_rows(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                const std::vector<int>& groups, const std::string& suffix = "") {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  for_each_shape(b, tokens, hidden, seq_lens, groups,
                 [&](const std::string& shape, int B, int T, int NH, int NKV, int hd) {
                   buf.clear();  // the previous shape's tensors (a refused shape's too)
                   const int Tc = T / 2, C = hidden;
                   const size_t nq = size_t(B) * Tc * C, nk = size_t(B) * Tc * NKV * hd;
                   Tensor q = buf.rand(nq, act, 1), k = buf.rand(nk, act, 1), v = buf.rand(nk, act, 1);
                   Tensor out = buf.zeros(nq, act), lse = buf.zeros(size_t(B) * NH * Tc, DType::f32);
                   Tensor dout = buf.rand(nq, act, 1), dq = buf.zeros(nq, act), dk = buf.zeros(nk, act),
                          dv = buf.zeros(nk, act);
                   const double fl = 4.0 * B * NH * double(Tc) * Tc * hd;
                   auto fwd = [&] { ops.attention_block_forward(out, lse, q, k, v, B, Tc, Tc, C, NH, NKV, Tc, 0, true); };
                   auto bwd = [&] {
                     ops.attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, B, Tc, Tc, C, NH, NKV, Tc, 0,
                                                  true);
                   };
                   b.run({"attention", "attention_block_forward" + suffix, shape, true, fl, "4*B*NH*(T/2)^2*hd"},
                         fwd);
                   b.run({"attention", "attention_block_fwd+bwd" + suffix, shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                     fwd();
                     bwd();
                   });
                 });
}

// Head sizes the flash kernels run zero-padded (32 on the HS 64 kernels, 80 and 96 on the HS 128
// ones: attention_pad.cu) and 256 (the Hopper kernels where their backward is chosen, else the
// CUDA-core kernels) at T 2048, NH 16, B*T = tokens, forward and backward together. Their own op
// name keeps them out of bench_summary's comparison with SDPA (which times 64 and 128 only).
void padded_rows(Bench& b, Ops& ops, int tokens, const std::string& suffix = "") {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  const int T = 2048, NH = 16, B = std::max(1, tokens / T);
  for (int hd : {32, 80, 96, 256}) {
    buf.clear();
    const int C = NH * hd;
    const size_t BT = size_t(B) * T, W = size_t(3 * NH) * hd;
    const std::string shape = "B=" + std::to_string(B) + " NH=" + std::to_string(NH) + " T=" + std::to_string(T) +
                              " hd=" + std::to_string(hd);
    Tensor qkv = buf.rand(BT * W, act, 1), out = buf.zeros(BT * C, act);
    Tensor lse = buf.zeros(size_t(B) * NH * T, DType::f32);
    Tensor dout = buf.rand(BT * C, act, 1), dqkv = buf.zeros(BT * W, act);
    const double fl = 4.0 * B * NH * double(T) * T * hd / 2;
    const auto fwd_bwd = [&] {
      ops.attention_forward(out, lse, qkv, B, T, C, NH, NH);
      ops.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH);
    };
    try {
      b.run({"attention", "attention_padded_fwd+bwd" + suffix, shape, true, 3.5 * fl, "3.5 x fwd, the head's own size"},
            fwd_bwd);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  attention_padded %s: not timed: %s\n", shape.c_str(), e.what());
      b.failures.push_back({"attention", shape, e.what()});
    }
  }
}

// Decoding against a KV cache (Ops::attention_block_forward with one new query per sequence, as
// sampling calls it, the query at the cache's last position): GPT-2 124M's heads and Llama 3.2 1B's
// (GQA 4:1), at one and eight sequences. Reading K and V bounds it: the work is their bytes.
void decode_rows(Bench& b, Ops& ops) {
  Buffers buf(ops);
  const DType act = ops.compute_dtype();
  struct Shape {
    int B, NH, NKV, hd;
  };
  for (const Shape s : {Shape{1, 12, 12, 64}, Shape{1, 32, 8, 64}, Shape{8, 32, 8, 64}})
    for (int Tk : {2048, 8192}) {
      buf.clear();
      const int C = s.NH * s.hd;
      const size_t nk = size_t(s.B) * Tk * s.NKV * s.hd;
      const std::string shape = "B=" + std::to_string(s.B) + " NH=" + std::to_string(s.NH) +
                                " NKV=" + std::to_string(s.NKV) + " Tk=" + std::to_string(Tk) +
                                " hd=" + std::to_string(s.hd);
      Tensor q = buf.rand(size_t(s.B) * C, act, 1), k = buf.rand(nk, act, 1), v = buf.rand(nk, act, 1);
      Tensor out = buf.zeros(size_t(s.B) * C, act), lse = buf.zeros(size_t(s.B) * s.NH, DType::f32);
      try {
        b.run({"attention", "attention_decode", shape, false, 2.0 * nk * dtype_size(act), "K + V: 2*B*Tk*NKV*hd*2"},
              [&] { ops.attention_block_forward(out, lse, q, k, v, s.B, 1, Tk, C, s.NH, s.NKV, Tk - 1, 0, true); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "  attention_decode %s: not timed: %s\n", shape.c_str(), e.what());
        b.failures.push_back({"attention", shape, e.what()});
      }
    }
}

}  // namespace

// Attention at the shapes bench/attention_sdpa.py gives PyTorch's SDPA back ends: head sizes 64 and
// 128, NH = hidden / hd query heads, B = tokens / T, causal, for each entry of `groups` (query heads
// per key/value head: 1 is multi-head, 8 grouped-query 8:1 with NKV = NH / 8). The FLOPs do not
// depend on NKV: every query head still scores and mixes all its visible keys. Multi-head rows keep
// the shape string of earlier runs ("B= NH= T= hd="), grouped-query rows add "NKV=", which is how
// bench_summary.py tells them apart. The Hopper kernels' rows (where the GPU has them) come in a
// second pass after every default row: a kernel that faults leaves the process's CUDA context
// unusable, and must not cost the rows of the kernels the trainer runs. The FP8 rows come last, in
// a third pass, for the same reason (where the backend runs FP8 attention at both head sizes):
// attention_fp8_forward (the cast and the FP8 kernel, as the trainer calls it) beside the bf16
// forward's rows, and the FP8 forward and backward together. Ring attention's block rows
// (block_rows) and decoding's (decode_rows) follow the default rows.
void bench_attention(Bench& b, Ops& ops, int tokens, int hidden, const std::vector<int>& seq_lens,
                     const std::vector<int>& groups) {
  // The default rows are the sm_80 kernels' (the trainer's forward default, auto, takes the Hopper
  // kernel where there is one: the Hopper kernels' own rows below).
  const gpu::FlashPath trainer_forward = gpu::flash_forward_path(), trainer_backward = gpu::flash_backward_path();
  gpu::set_flash_forward_path(gpu::FlashPath::mma);
  gpu::set_flash_backward_path(gpu::FlashPath::mma);
  each_shape(b, ops, tokens, hidden, seq_lens, groups,
             [&](const std::string& shape, double fl, const auto& fwd, const auto& bwd, const auto&, const auto&) {
               b.run({"attention", "attention_forward", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
               b.run({"attention", "attention_backward", shape, true, 2.5 * fl, "2.5 x fwd"}, bwd);
               b.run({"attention", "attention_fwd+bwd", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                 fwd();
                 bwd();
               });
             });
  gpu::set_flash_forward_path(trainer_forward);
  gpu::set_flash_backward_path(trainer_backward);
  block_rows(b, ops, tokens, hidden, seq_lens, groups);
  decode_rows(b, ops);
  padded_rows(b, ops, tokens);
  if (ops.compute_dtype() == DType::bf16 && ops.device() == Device::cuda && gpu::flash_sm90_available()) {
    const gpu::FlashPath saved_forward = gpu::flash_forward_path(), saved_backward = gpu::flash_backward_path();
    gpu::set_flash_forward_path(gpu::FlashPath::wgmma);
    gpu::set_flash_backward_path(gpu::FlashPath::wgmma);
    each_shape(b, ops, tokens, hidden, seq_lens, groups,
               [&](const std::string& shape, double fl, const auto& fwd, const auto& bwd, const auto&, const auto&) {
                 b.run({"attention", "attention_forward_sm90", shape, true, fl, "4*B*NH*T^2*hd/2"}, fwd);
                 b.run({"attention", "attention_backward_sm90", shape, true, 2.5 * fl, "2.5 x fwd"}, bwd);
                 b.run({"attention", "attention_fwd+bwd_sm90", shape, true, 3.5 * fl, "3.5 x fwd"}, [&] {
                   fwd();
                   bwd();
                 });
               });
    block_rows(b, ops, tokens, hidden, seq_lens, groups, "_sm90");
    padded_rows(b, ops, tokens, "_sm90");
    gpu::set_flash_forward_path(saved_forward);
    gpu::set_flash_backward_path(saved_backward);
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
