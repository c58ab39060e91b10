// The Ops interface: one forward and one backward per layer kind, plus the memory, optimizer
// and reduction primitives the trainer needs. The model code calls only this interface and
// never branches on the backend. CpuOps (core/cpu) is the fp32 reference and the oracle for
// every CUDA kernel (cuda/).
//
// Conventions, the same for every op:
//  - Shapes are passed explicitly. N = number of rows (B*T tokens), C = channels.
//    Matrices are row-major; a weight of a linear layer is [OC, IC] (out, in), as in llm.c
//    and PyTorch, so out = inp @ W^T + b.
//  - Forward ops overwrite their outputs.
//  - Backward ops ACCUMULATE (+=) into every gradient they write: parameter gradients (so
//    gradient accumulation over micro-batches needs no extra pass) and input gradients (so
//    the residual stream's gradient is the plain sum of both branches). The caller zeroes
//    gradient buffers when a fresh sum starts. A null gradient pointer means "not needed".
//    Exceptions, on the model's hot path: matmul_backward, matmul_backward_input_dgelu,
//    gelu_backward and swiglu_backward OVERWRITE their input gradient (dinp, dpre, dgate_up).
//    Inside a block each such gradient has one producer, so a "+=" would only cost a memset of
//    the buffer and a read of the zeros back (cuBLASLt's beta = 1): about a tenth of a GPT-2
//    124M training step.
//  - Tensors hold the backend's dtypes: activations and weights in the compute dtype,
//    LayerNorm statistics, log-sum-exps, losses, master weights and optimizer moments in f32,
//    token ids in i32.
//  - Interfaces are header-only (no key function in a .cpp) so the CUDA library can
//    implement them without linking core.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/common/fp8.h"
#include "core/ops/matmul_algos.h"
#include "core/tensor/tensor.h"

namespace pt {

enum class Device { cpu, cuda };

inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

// Bytes allocated through Ops::alloc, and the device's memory (see Ops::memory_use).
struct MemoryUse {
  size_t live = 0;          // held now
  size_t peak = 0;          // the most held at once
  size_t device_used = 0;   // the whole device: total - free (0: unknown)
  size_t device_total = 0;  // 0: unknown
};

// Device work recorded once (Ops::record) and replayed: each replay issues the same ops on the same
// buffers, with the same arguments, after everything issued before it.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual void replay() = 0;
};

// The scalars of one AdamW step that change from step to step: the learning rate, the bias
// corrections 1 - beta^t (in double, rounded once: 1 - b2^t is tiny for small t and b2 near 1) and
// the gradient's scale (clipping). Both backends compute them here.
struct AdamwStepScalars {
  float lr, correction1, correction2, grad_scale;
};
inline AdamwStepScalars adamw_step_scalars(float lr, float beta1, float beta2, int t, float grad_scale) {
  return {lr, static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t)),
          static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t)), grad_scale};
}

class Ops {
 public:
  virtual ~Ops() = default;

  virtual Device device() const = 0;
  // Human-readable name of the device, e.g. "cpu (2 threads)" or "NVIDIA H100 80GB HBM3".
  virtual std::string device_description() const = 0;
  // The dtype activations and weights use in compute (f32 on the CPU).
  virtual DType compute_dtype() const = 0;

  // ---- memory ------------------------------------------------------------------------
  // Allocates n elements, zero-filled. Throws RuntimeError naming the size when out of memory.
  virtual Tensor alloc(size_t n, DType dtype) = 0;
  virtual void release(Tensor& t) = 0;  // frees and nulls t (the tensor alloc returned, not a slice)
  // What alloc holds: the bytes of the tensors allocated and not yet released (n * dtype size
  // each, as the memory plan counts them; not the backend's own scratch or alignment padding),
  // and the most there were at once since construction or the last reset_peak_memory(). The
  // device's own figures (CUDA: cudaMemGetInfo, so they include the CUDA context, library
  // workspaces and other processes) are 0 where the backend has none (the CPU).
  virtual MemoryUse memory_use() const = 0;
  virtual void reset_peak_memory() = 0;  // peak = live
  virtual void zero(Tensor t) = 0;
  // Host f32/i32 <-> device, converting to/from the tensor's dtype (f32 <-> bf16 rounds).
  virtual void upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) = 0;
  virtual void download(void* host_dst, DType host_dtype, Tensor src, size_t n) = 0;
  // dst[i] = src[i] for i < n, converting dtypes.
  virtual void copy(Tensor dst, Tensor src, size_t n) = 0;
  // A strided block copy, same dtype: dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows,
  // c < cols (non-overlapping). It splits and reassembles packed q | k | v rows and moves a
  // context-parallel rank's chunks and heads around (core/parallel) without a loop of small copies.
  virtual void copy_2d(Tensor dst, size_t dst_ld, Tensor src, size_t src_ld, size_t rows, size_t cols) = 0;
  // Waits for all queued work (a no-op on the CPU). Used before timing and host reads.
  virtual void synchronize() = 0;
  // Records the device work `work` issues, without running it, for replays that skip the host's
  // side (CUDA graphs: one launch instead of one per op). The host code in `work` runs once, now:
  // what it computes on the host is baked in, so the work must read every changing input from
  // device memory. Returns null and says why in *why where the backend cannot record (the CPU
  // runs each op as it is called) or the work did what a recording cannot hold (waited for the
  // device, allocated memory); nothing was run then either.
  virtual std::unique_ptr<RecordedWork> record(const std::function<void()>& work, std::string* why) {
    (void)work;
    if (why) *why = std::string("the ") + device_name(device()) + " backend runs each op as it is called";
    return nullptr;
  }

  // ---- time marks (the step's phase breakdown, core/metrics/step_timeline.h) ------------------
  // record_time_mark() puts a mark in the op stream and returns its number (0, 1, ... since the
  // last clear_time_marks()). A mark is reached when every op issued before it has finished: on
  // the GPU it is an event on the compute stream, so marks time the device's work and not the
  // host's launches; on the CPU it is the host clock (ops are synchronous). ms_between_marks(a, b)
  // needs both marks reached: call it after synchronize().
  virtual int record_time_mark() = 0;
  virtual double ms_between_marks(int a, int b) = 0;
  virtual void clear_time_marks() = 0;

  // ---- matmul algorithms (precision.matmul_algos; core/ops/matmul_algos.h) --------------------
  // The library and GPU whose algorithms the backend chooses among ("" where there is no choice:
  // the CPU, where the rest of this section does nothing).
  virtual std::string matmul_library() const { return {}; }
  // From now on, each product not seen before has the library's top candidates timed once, their
  // output in scratch memory (never the product's own); the products themselves keep running the
  // heuristic's first choice until use_matmul_algos.
  virtual void time_matmul_algos() {}
  // What the timing has found so far.
  virtual MatmulAlgos timed_matmul_algos() const { return {}; }
  // From now on each product listed runs its algorithm (one the library refuses runs the
  // heuristic's, with a warning) and every other product the heuristic's first, also one that ran
  // another before; timing stops. An empty list restores the heuristic's choices.
  virtual void use_matmul_algos(const MatmulAlgos& algos) { (void)algos; }

  // ---- embeddings --------------------------------------------------------------------
  // out[n, :] = wte[tokens[n] - vocab_start, :] when vocab_start <= tokens[n] < vocab_start + vocab_local,
  // else 0. The vocab range makes it usable as a vocab-parallel shard: wte holds rows
  // [vocab_start, vocab_start + vocab_local) of the full table.
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start,
                                 int vocab_local) = 0;
  // dwte[tokens[n] - vocab_start, :] += dout[n, :] for in-range tokens. Deterministic (no float atomics).
  virtual void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start,
                                  int vocab_local) = 0;
  // out[b, t, :] += wpe[pos[t], :]  (pos has T entries; it is not always 0..T-1 under context parallel).
  virtual void position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) = 0;
  // dwpe[pos[t], :] += sum_b dout[b, t, :]
  virtual void position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) = 0;

  // ---- LayerNorm (eps 1e-5, biased variance, as GPT-2) -------------------------------------
  // out = (inp - mean) * rstd * w + b per row; mean[N], rstd[N] saved (f32) for backward.
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N,
                                 int C) = 0;
  virtual void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                                  Tensor mean, Tensor rstd, int N, int C) = 0;
  // The residual add fused with the LayerNorm that follows it (GPT-2's residual + ln_2, and the
  // residual + the next block's ln_1 or ln_f):
  //   residual[N, C] = a + b   (stored rounded to the dtype: the residual stream)
  //   out, mean, rstd = layernorm(residual, w, bias)   exactly as layernorm_forward(out, mean,
  //                     rstd, residual, w, bias, N, C), bit for bit: it normalises the ROUNDED
  //                     residual that is stored, as backward (and recompute, which rebuilds out with
  //                     layernorm_forward) will see it
  // residual equals add(residual, a, b, N*C) bit for bit. a, b, residual, out: [N, C] in the
  // activation dtype; w, bias: [C]; mean, rstd: [N] f32, each may be null (eval). residual may
  // alias a or b; out must not overlap residual, a or b.
  virtual void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b,
                                          Tensor w, Tensor bias, int N, int C) = 0;

  // ---- linear layer --------------------------------------------------------------------
  // out[N, OC] = inp[N, IC] @ w[OC, IC]^T + bias[OC]  (bias may be null)
  virtual void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) = 0;
  // dinp = dout @ w (overwritten), dw += dout^T @ inp, dbias += sum_n dout. Any of dinp/dw/dbias
  // may be null.
  virtual void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N,
                               int IC, int OC) = 0;
  // The linear layer and GPT-2's GELU in one op, so that a backend can fuse the GELU into the
  // product (CudaOps: cuBLASLt's GELU epilogues, in bf16). Each equals the composition given:
  // exactly on CpuOps (it is that composition), within the dtype's rounding on CUDA. The fused
  // forward applies the GELU to the fp32 sum before rounding, so in bf16 `out` may differ from
  // gelu_forward(out_pre) by a rounding: code that rebuilds `out` from `out_pre` later (selective
  // recompute) and must get the same bits uses the two ops instead: the trainer does, in every
  // recompute mode (decoder_stage.h); kernel_bench times the fused forward against the pair.
  // Every tensor of both ops is in the activation dtype (no f32 output, unlike matmul_forward).
  //   out_pre[N, OC] = inp[N, IC] @ w[OC, IC]^T + bias[OC] (bias may be null), out[N, OC] =
  //   gelu(out_pre); both overwritten: matmul_forward(out_pre, ...) then gelu_forward(out, out_pre).
  virtual void matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                   int OC) = 0;
  // The input gradient of a linear layer whose input was gelu(pre), through the GELU:
  //   dpre[N, IC] = gelu'(pre[N, IC]) * (dout[N, OC] @ w[OC, IC])   (overwritten, like
  //   matmul_backward's dinp): matmul_backward(dpre, null, null, dout, null, w) then
  //   gelu_backward(dpre, pre, dpre). The layer's dw and dbias stay with matmul_backward.
  virtual void matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC,
                                           int OC) = 0;

  // ---- FP8 linear layers (precision.fp8; core/parallel/fp8_linear.h drives them) ----------------
  // A tensor in FP8 is its codes (dtype f8e4m3 or f8e5m2, core/common/fp8.h) and its scale_inv:
  // value = code value * scale_inv, with power-of-two scales s = 1 / scale_inv chosen from the
  // largest magnitudes (fp8_scale_exponent): one for the whole tensor ("tensorwise"), or one per
  // row of the K-major operand ("rowwise"). CpuOps rounds exactly as CudaOps does.
  //
  // The largest magnitudes of x [rows, cols] (the compute dtype) into amax (f32): over = tensor:
  // amax[0] of the whole; rows: amax[r] of each row; cols: amax[c] of each column (0 for an empty
  // set). A magnitude's order is its bit pattern's (an exact, order-free max): a NaN in x makes
  // its amax a NaN, and then its scale is 1 and the NaN carries on to the loss, where the run
  // guard sees it.
  virtual void fp8_amax(Tensor amax, Tensor x, int rows, int cols, Fp8Amax over) = 0;
  // q = code(x * s) for x [rows, cols] (compute dtype), stored as is ([rows, cols]) or, with
  // `transpose`, as [cols, rows] (the FP8 products take both operands K-major, so a backward
  // product quantises its operand transposed). Let R be q's rows (rows, or cols transposed).
  // Without per_row: one s = 2^fp8_scale_exponent(A, q's format), A = the largest of
  // amaxes[0 .. n_amax) (one f32 per rank holding a part of the tensor, gathered by the caller:
  // the scale is then the whole tensor's); scale_inv[0] = 1 / s. With per_row: row i of q has
  // its own s_i from the largest of amaxes[k * R + i], k < n_amax; scale_inv[i] = 1 / s_i.
  // record_amax (may be null; one f32 holding a magnitude, e.g. zeroed; without per_row only)
  // becomes the larger, in fp8_amax's order, of itself and x's largest magnitude, read in the
  // same pass: delayed scaling
  // (core/parallel/fp8_delayed.h) quantises with scales from earlier steps and records what it
  // quantised for the next ones. It may not overlap q, scale_inv, x or amaxes.
  virtual void fp8_quantize(Tensor q, Tensor scale_inv, Tensor x, Tensor amaxes, int n_amax, int rows, int cols,
                            bool transpose, bool per_row, Tensor record_amax) = 0;
  // out[i] = the value of code q[i] (f8e4m3 or f8e5m2) times scale_inv[0] (one f32), for n
  // elements, in out's dtype (the compute dtype): exact wherever the result is a normal number of
  // that dtype (always, unless the scale is near 2^-126). ZeRO-3's FP8 weight gather
  // (core/train/param_gather.h) decodes the gathered codes with it.
  virtual void fp8_dequantize(Tensor out, Tensor q, Tensor scale_inv, size_t n) = 0;
  // out[M, N] = (a[M, K] @ b[N, K]^T) * a_scale_inv * b_scale_inv (+ bias[N]; may be null), or
  // with `accumulate` out += that (no bias). a and b are FP8 codes, K-major (rows of K), not
  // both e5m2; the products and their sum are fp32; out (and bias) are the compute dtype or f32.
  // per_row: the scales are vectors, a_scale_inv [M] and b_scale_inv [N]: element (i, j) is
  // scaled by a_scale_inv[i] * b_scale_inv[j]; else one f32 each.
  virtual void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor bias, int M,
                          int N, int K, bool accumulate, bool per_row) = 0;
  // Whether this backend runs fp8_matmul (CudaOps: compute capability 8.9 and up), and with
  // per_row scales (CudaOps: 9.0 and up, with a cuBLASLt that has outer-vector scales).
  virtual bool supports_fp8() const = 0;
  virtual bool supports_fp8_rowwise() const = 0;

  // ---- causal self-attention -------------------------------------------------------------
  // Grouped-query attention (Llama): NH query heads of HS = C / NH channels share NKV key/value
  // heads (NKV divides NH); query head h reads key/value head h / (NH / NKV). NKV == NH is
  // GPT-2's multi-head attention. Repeated K/V heads are never materialised.
  // qkv[B, T, (NH + 2 NKV) HS] holds q [NH, HS] | k [NKV, HS] | v [NKV, HS] (NKV == NH: the
  // [B, T, 3C] of GPT-2). out[B, T, C] (heads concatenated), lse[B, NH, T] the log-sum-exp of
  // each row of scaled scores (f32), so backward can recompute probabilities without storing
  // the T x T matrix and context parallelism can merge partial results. Scale 1/sqrt(HS);
  // position j attends to i <= j.
  virtual void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) = 0;
  // dqkv (qkv's layout) = the gradient of out (given dout, forward's out and lse), overwritten
  // like matmul_backward's dinp: every element is written, whatever the buffer held. A key/value
  // head's dk, dv sum its group's query heads. May be null.
  virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T,
                                  int C, int NH, int NKV) = 0;

  // ---- FP8 attention (precision.fp8_layers names attention; core/common/fp8_attention.h) ------
  // attention_forward's contract, computed with q, k, v and the probabilities in e4m3: each
  // (sequence, head) of q, k and v scaled by its own power-of-two scale, P quantised per key
  // tile under the running max; out in the compute dtype, lse the log-sum-exp of the
  // dequantised scores. CpuOps emulates what CudaOps' kernel computes.
  virtual void attention_fp8_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) = 0;
  // Its backward: attention_backward on q, k, v dequantised (the values the forward multiplied)
  // with the forward's out and lse; dqkv overwritten, as attention_backward's.
  virtual void attention_fp8_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T,
                                      int C, int NH, int NKV) = 0;
  // Whether this backend runs FP8 attention at this head size (CudaOps: compute capability 8.9
  // and up, bf16, head size 64 or 128; CpuOps: always).
  virtual bool supports_fp8_attention(int head_size) const = 0;

  // ---- attention of queries against keys/values held apart (KV cache, context parallel) --------
  // Tq queries against Tk keys/values in separate tensors (a KV cache, or another context-
  // parallel rank's block). q, out: [B, Tq, C]; k, v: [B, Tk, NKV * HS] (contiguous rows);
  // lse: [B, NH, Tq] (f32); heads (grouped-query) and scale as attention_forward. Query i sits
  // at global position q_pos0 + i, key j at k_pos0 + j; with causal, a query sees the keys at
  // positions <= its own (always a prefix of the block). A query that sees no key gets out = 0
  // and lse = -inf (merge_attention_partials then gives it weight 0). attention_forward(qkv) is
  // the case Tq = Tk = T, offsets 0, causal.
  virtual void attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk,
                                       int C, int NH, int NKV, int q_pos0, int k_pos0, bool causal) = 0;
  // Backward of one block given the FINAL out and lse of the rows (after any merge across
  // blocks): accumulates (+=) into dq [B, Tq, C], dk and dv [B, Tk, NKV * HS] (each may be null;
  // a key/value head gets the sum over its group's query heads), the flash recurrence with
  // D = rowsum(dout * out), P = exp(scale q.k - lse), dS = P (dout.v - D).
  // Summed over all blocks of a row, this is exactly the gradient of the merged attention.
  // Rows with lse = -inf (no key anywhere) get no gradient.
  virtual void attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                        Tensor out, Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV,
                                        int q_pos0, int k_pos0, bool causal) = 0;
  // Merges a partial attention result into an accumulated one, per (b, h, t) row, weighting
  // each by its share of the softmax mass: lse = log(exp(lse_acc) + exp(lse_part)),
  // out_acc = out_acc * exp(lse_acc - lse) + out_part * exp(lse_part - lse). out_*: [B, T, C],
  // lse_*: [B, NH, T] (f32); out_acc, lse_acc are updated in place. Rows with lse = -inf on
  // both sides stay as they are (out 0, lse -inf). Attention over keys [0, Tk) equals the merge
  // of attention over [0, a) and over [a, Tk), so blocks of keys can be computed apart (ring
  // attention, chunked KV caches).
  virtual void merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B,
                                        int T, int C, int NH) = 0;

  // ---- elementwise -------------------------------------------------------------------
  // GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  virtual void gelu_forward(Tensor out, Tensor inp, size_t n) = 0;
  // dinp = gelu'(inp) * dout (overwritten; dinp may be dout itself: each element reads its own)
  virtual void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) = 0;
  // out = a + b (out may alias a)
  virtual void add(Tensor out, Tensor a, Tensor b, size_t n) = 0;
  // x *= s
  virtual void scale(Tensor x, float s, size_t n) = 0;

  // ---- Llama: RMSNorm, RoPE, SwiGLU ----------------------------------------------------------
  // Hugging Face's LlamaRMSNorm: per row, rstd = 1 / sqrt(mean_c(x^2) + eps) and
  // out = w * (x * rstd), the statistics in f32. No mean, no bias. rstd [N] (f32) is saved for
  // backward and may be null (eval).
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) = 0;
  // With xhat = x * rstd and g = w * dout, ACCUMULATING like layernorm_backward:
  //   dinp += rstd * (g - xhat * mean_c(g * xhat)),  dw += sum_n xhat * dout  (each may be null).
  virtual void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N,
                                int C) = 0;
  // The residual add fused with the RMSNorm that follows it, the contract of
  // residual_layernorm_forward: residual = a + b rounded to the dtype (bitwise add()), then out,
  // rstd = rmsnorm(residual) bit for bit as rmsnorm_forward on the stored residual. rstd may be
  // null; residual may alias a or b; out must not overlap residual, a or b.
  virtual void residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w,
                                        int N, int C, float eps) = 0;
  // Rotary position embedding, Hugging Face's rotate-half convention, IN PLACE on the packed
  // rows attention reads: qkv [B, T, row_width], row_width = (n_heads + 2 n_kv_heads) * HS. The
  // first rot_heads heads of a row (the q heads, then the k heads; v is untouched) are rotated:
  // for i < HS/2, inv_freq_i = 1.0f / powf(theta, float(2i) / HS) (PyTorch's float arithmetic,
  // core/ops/rope_frequencies.h), angle = float(pos[t]) * inv_freq_i, c = cos, s = sin,
  //   x[i] <- x[i] c - x[i + HS/2] s,   x[i + HS/2] <- x[i + HS/2] c + x[i] s.
  // pos [T] (i32) holds the global positions of the T rows (not always 0..T-1 under context
  // parallelism). Math in f32, one rounding to the dtype.
  virtual void rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                            float theta) = 0;
  // Its backward, in place on the gradient of the rotated rows: the transpose rotation (by -angle),
  //   d[i] <- d[i] c + d[i + HS/2] s,   d[i + HS/2] <- d[i + HS/2] c - d[i] s.
  // The rotation is orthogonal, so rope_backward(rope_forward(x)) = x up to rounding.
  virtual void rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                             float theta) = 0;
  // SwiGLU on the fused gate|up projection: gate_up [N, 2H], each row gate (H) | up (H);
  // out [N, H] = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
  virtual void swiglu_forward(Tensor out, Tensor gate_up, int N, int H) = 0;
  // dgate_up [N, 2H] OVERWRITTEN like gelu_backward's dinp (one producer inside a block):
  //   d_gate = dout * up * silu'(gate),  d_up = dout * silu(gate).  A null dgate_up is skipped.
  virtual void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout, int N, int H) = 0;

  // ---- mixture of experts (core/model/moe_layer.h) -------------------------------------------
  // N tokens each routed to k of E experts. Routing is Mixtral's: probs = softmax(logits) over
  // all E experts (f32), the k most probable experts are chosen (a tie goes to the lower expert
  // index), and their weights are their probabilities renormalised to sum to 1 (the softmax over
  // the chosen k). slot_of[n k + j] is the row of token n's j-th choice in the permuted buffer,
  // where rows are grouped by expert (expert 0's first) and, within an expert, in (n, j) order;
  // moe_route computes it on the backend's own memory (plan_moe_routing, core/ops/moe_routing.h,
  // is its host reference), so routing needs no host round trip.
  //
  // logits [N, E] (compute dtype, the router matmul's output) -> probs [N, E] (f32),
  // topk_expert [N, k] (i32, in descending probability), topk_weight [N, k] (f32).
  virtual void moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E,
                                  int k) = 0;
  // dlogits [N, E] (compute dtype) OVERWRITTEN with the gradient through the renormalised top-k
  // weights and the full softmax, given dtopk_weight [N, k] (f32) and dprobs_all [E] (f32), a
  // gradient every token's probs receive alike (the load-balancing loss's):
  //   S = sum_j probs[e_j];  dp[e_j] = (dw_j - sum_j' w_j' dw_j') / S;  dp[i] += dprobs_all[i]
  //   dlogits[i] = probs[i] (dp[i] - sum_i' probs[i'] dp[i'])
  virtual void moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight,
                                   Tensor dtopk_weight, Tensor dprobs_all, int N, int E, int k) = 0;
  // out[slot_of[n k + j], :] = x[n, :]: each token copied to its k rows of the permuted buffer
  // (x, out in the compute dtype; out [N k, C]).
  virtual void moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) = 0;
  // dx[n, :] += sum_j dout[slot_of[n k + j], :], the j in order (deterministic).
  virtual void moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) = 0;
  // y[n, :] = sum_j topk_weight[n, j] expert_out[slot_of[n k + j], :], overwritten; the sum in
  // f32, j in order, one rounding to the dtype.
  virtual void moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) = 0;
  // Its backward, both OVERWRITTEN: dexpert_out[slot_of[n k + j], :] = topk_weight[n, j] dy[n, :],
  // dtopk_weight[n, j] = dot(dy[n, :], expert_out[slot_of[n k + j], :]) (f32). Either output may
  // be null (not needed), and then what only it reads (topk_weight, expert_out) too.
  virtual void moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out,
                                    Tensor topk_weight, Tensor slot_of, int N, int C, int k) = 0;
  // The routing plan from topk_expert [N k] (i32): slot_of [N k] (as above) and offsets [E + 1]
  // (i32): expert e's rows of the permuted buffer are [offsets[e], offsets[e + 1]). Both
  // OVERWRITTEN. An expert id outside [0, E) is an error on the CPU; the GPU counts it nowhere
  // (its slot is -1, which the permutation kernels skip).
  virtual void moe_route(Tensor slot_of, Tensor offsets, Tensor topk_expert, int N, int k, int E) = 0;
  // The load-balancing loss's statistics of N routed tokens, sums [2 E + 1] (f32) OVERWRITTEN:
  // sums[e] = offsets[e + 1] - offsets[e] (expert e's rows), sums[E + e] = the sum over the rows of
  // probs [N, E] (f32) column e, sums[2 E] = N. Summed over ranks, they give the loss's terms.
  virtual void moe_balance_sums(Tensor sums, Tensor probs, Tensor offsets, int N, int E) = 0;
  // The loss from sums (tokens = sums[2 E], f_e = sums[e] / tokens, P_e = sums[E + e] / tokens):
  // aux = E sum_e f_e P_e and its gradient, every token's alike, dprobs_all [E] (f32) OVERWRITTEN
  // with aux_weight E f_e / tokens. With a non-null stats [2] (f32), stats[0] += aux and stats[1]
  // += the busiest expert's load over an even share, max_e f_e E / k.
  virtual void moe_balance_loss(Tensor dprobs_all, Tensor stats, Tensor sums, int E, int k, float aux_weight) = 0;

  // ---- grouped products (the routed experts) ---------------------------------------------------
  // G products over the row groups of offsets [G + 1] (i32, in the backend's memory; offsets[0] =
  // 0, non-decreasing, offsets[G] <= rows, the rows the tensors hold): for group g with rows
  // [r0, r1) = [offsets[g], offsets[g + 1]) and weight_g = weight[g] ([G, OC, IC]),
  //   out[r0:r1] = inp[r0:r1] @ weight_g^T                   (out [rows, OC] OVERWRITTEN there)
  // exactly as matmul_forward on those rows would (no bias); rows past offsets[G] are untouched.
  virtual void grouped_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC,
                                      int OC) = 0;
  // Its backward, as matmul_backward on each group: dinp[r0:r1] = dout[r0:r1] @ weight_g
  // (OVERWRITTEN there) and dweight[g] += dout[r0:r1]^T @ inp[r0:r1] (a group without rows adds
  // nothing). dweight may be the compute dtype or f32, like matmul_backward's dw; either output
  // may be null.
  virtual void grouped_matmul_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                                       Tensor offsets, int G, int rows, int IC, int OC) = 0;

  // ---- loss ----------------------------------------------------------------------------
  // Fused softmax + cross-entropy over the first V of Vp columns (padded columns are never
  // predicted). losses[n] = -log softmax(logits[n, :V])[targets[n]] (f32).
  // When dloss != 0, logits are overwritten IN PLACE with dlogits =
  // (softmax - onehot(target)) * dloss, and padded columns with 0; with dloss == 0 (eval)
  // logits are left untouched. targets[n] < 0 means "no target": loss 0 and no gradient.
  virtual void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp,
                                     float dloss) = 0;

  // Vocab-parallel cross-entropy, the two per-shard halves (core/parallel/vocab_parallel_ce.h
  // gathers the stats across the tensor-parallel group between them, so the full logits never
  // meet). logits [N, Vl] hold global vocabulary columns [vocab_start, vocab_start + Vl); columns
  // at or past V are padding, never predicted. targets [N] are global ids (< 0: no target).
  // stats [N, 3] (f32) <- per row: this shard's max m over its real columns, s = sum exp(x - m)
  // over them (m = -inf, s = 0 for a shard of padding only), and the target's logit when the
  // target is in this shard (else 0).
  virtual void cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V,
                                         int vocab_start) = 0;
  // From every shard's stats, all_stats [shards, N, 3] in shard order: M = max m_r,
  // S = sum s_r exp(m_r - M), losses[n] = log S + M - sum t_r (0 without a target). With
  // dloss != 0, logits are overwritten IN PLACE with (exp(x - M) / S - onehot(target)) * dloss,
  // padded columns and rows without a target with 0, as softmax_cross_entropy.
  virtual void cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards,
                                          int N, int Vl, int V, int vocab_start, float dloss) = 0;

  // ---- optimizer and reductions --------------------------------------------------------------
  // AdamW with decoupled weight decay on n elements, step t >= 1 (bias correction):
  //   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
  //   master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master)
  // then params = master (cast to the compute dtype). On the CPU params and master may be the
  // same buffer. `step` (optional): an AdamwStepScalars (f32 [4]) in the backend's memory, read
  // when the update runs instead of lr, t and grad_scale, so that a recorded update (record())
  // replays with each step's values.
  virtual void adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale,
                            Tensor step = {}) = 0;
  // sum of squares of n elements, accumulated in double, returned to the host.
  virtual double sum_squares(Tensor x, size_t n) = 0;
  // sum of n f32 elements, accumulated in double, returned to the host (losses).
  virtual double sum(Tensor x, size_t n) = 0;
  // out[0] = that sum rounded to f32, left on the device (f32 out): the host reads a step's
  // losses once, after the step, instead of waiting for each micro-batch's.
  virtual void sum_to(Tensor out, Tensor x, size_t n) = 0;
};

// Makes the backend for `device` computing in `compute_dtype` (f32 or bf16; the CPU backend is
// f32 only). Throws ConfigError when CUDA is asked for but was not built in or no GPU is
// present, or the dtype is not one the backend computes in.
std::unique_ptr<Ops> make_ops(Device device, DType compute_dtype);
// The same with the device's default compute dtype (precision.compute_dtype=auto): f32 on the
// CPU, bf16 on CUDA.
std::unique_ptr<Ops> make_ops(Device device);

// Whether this process can use a GPU. "absent" (a machine without a GPU or a driver: GPU tests
// skip) is kept apart from "broken" (a GPU machine whose CUDA fails: GPU tests must fail, never
// read as skipped).
struct CudaPresence {
  enum class State { present, absent, broken };
  State state;
  std::string detail;  // present: the device count; absent: why; broken: the CUDA error
};

// The cudaError_t values the rule below names (checked against the CUDA headers in CUDA builds).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;

// The rule, over cudaGetDeviceCount's result (`error`, its name and text, `device_count`) and
// whether the driver's library libcuda.so.1 loads. Absent: no error and 0 devices; no device
// (cudaErrorNoDevice, also what CUDA_VISIBLE_DEVICES= gives); "insufficient driver" with no
// libcuda.so.1, which is how the runtime reports that no driver is installed. Broken: anything
// else, "insufficient driver" from a driver that is installed (older than the runtime) included.
CudaPresence classify_cuda_presence(int error, const std::string& error_text, int device_count,
                                    bool driver_library_loads);
// The rule applied to this process (absent when CUDA is not built in).
CudaPresence cuda_presence();
// True when the CUDA backend is built in and a GPU is usable (cuda_presence() is present).
bool cuda_available();
// The backend a command runs on when --device is not given: cuda when a GPU is present, cpu when
// none is (or CUDA is not built in). A broken one is a ConfigError naming the CUDA error: a GPU
// machine set up wrong must not quietly train on its CPU, hundreds of times slower.
Device default_device(const CudaPresence& gpu);

}  // namespace pt
