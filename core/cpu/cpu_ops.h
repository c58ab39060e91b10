// CpuOps: the fp32 reference backend. Every op is a straightforward loop nest in float
// (accumulating in float as the GPU does, except reductions that say otherwise), parallel
// over independent outputs with OpenMP so results do not depend on the thread count.
// It is the oracle for every CUDA kernel and what makes every layout testable without a GPU.
#pragma once
#include <chrono>
#include <vector>

#include "core/ops/ops.h"

namespace pt {

// Not final: tests derive from it to stand in for a GPU backend's optional hooks (test_matmul_algos.cpp).
class CpuOps : public Ops {
 public:
  Device device() const override;
  std::string device_description() const override;
  DType compute_dtype() const override;
  Tensor alloc(size_t n, DType dtype) override;
  void release(Tensor& t) override;
  MemoryUse memory_use() const override;
  void reset_peak_memory() override;
  void zero(Tensor t) override;
  void upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) override;
  void download(void* host_dst, DType host_dtype, Tensor src, size_t n) override;
  void copy(Tensor dst, Tensor src, size_t n) override;
  void copy_2d(Tensor dst, size_t dst_ld, Tensor src, size_t src_ld, size_t rows, size_t cols) override;
  void synchronize() override;
  int record_time_mark() override;
  double ms_between_marks(int a, int b) override;
  void clear_time_marks() override;
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start, int vocab_local) override;
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start, int vocab_local) override;
  void position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) override;
  void position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) override;
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N, int C) override;
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean, Tensor rstd, int N, int C) override;
  void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w, Tensor bias, int N, int C) override;
  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) override;
  void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC, int OC) override;
  void matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) override;
  void matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC, int OC) override;
  void fp8_amax(Tensor amax, Tensor x, int rows, int cols, Fp8Amax over) override;
  void fp8_quantize(Tensor q, Tensor scale_inv, Tensor x, Tensor amaxes, int n_amax, int rows, int cols, bool transpose, bool per_row, Tensor record_amax) override;
  void fp8_dequantize(Tensor out, Tensor q, Tensor scale_inv, size_t n) override;
  bool supports_fp8_rowwise() const override { return true; }
  void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor bias, int M, int N, int K, bool accumulate, bool per_row) override;
  bool supports_fp8() const override;
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C, int NH, int NKV) override;
  void attention_fp8_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) override;
  void attention_fp8_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C, int NH, int NKV) override;
  bool supports_fp8_attention(int head_size) const override;
  void attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk, int C, int NH, int NKV, int q_pos0, int k_pos0, bool causal) override;
  void attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV, int q_pos0, int k_pos0, bool causal) override;
  void merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B, int T, int C, int NH) override;
  void gelu_forward(Tensor out, Tensor inp, size_t n) override;
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) override;
  void add(Tensor out, Tensor a, Tensor b, size_t n) override;
  void scale(Tensor x, float s, size_t n) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) override;
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N, int C) override;
  void residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w, int N, int C, float eps) override;
  void rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) override;
  void rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) override;
  void swiglu_forward(Tensor out, Tensor gate_up, int N, int H) override;
  void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout, int N, int H) override;
  void moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E, int k) override;
  void moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor dtopk_weight, Tensor dprobs_all, int N, int E, int k) override;
  void moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) override;
  void moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) override;
  void moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) override;
  void moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) override;
  void moe_route(Tensor slot_of, Tensor offsets, Tensor topk_expert, int N, int k, int E) override;
  void moe_balance_sums(Tensor sums, Tensor probs, Tensor offsets, int N, int E) override;
  void moe_balance_loss(Tensor dprobs_all, Tensor stats, Tensor sums, int E, int k, float aux_weight) override;
  void grouped_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC, int OC) override;
  void grouped_matmul_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC, int OC) override;
  void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp, float dloss) override;
  void cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V, int vocab_start) override;
  void cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards, int N, int Vl, int V, int vocab_start, float dloss) override;
  void adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int t, float grad_scale, Tensor step = {}) override;
  double sum_squares(Tensor x, size_t n) override;
  double sum(Tensor x, size_t n) override;
  void sum_to(Tensor out, Tensor x, size_t n) override;

 private:
  size_t live_bytes_ = 0, peak_bytes_ = 0;  // memory_use()
  std::vector<std::chrono::steady_clock::time_point> marks_;  // record_time_mark()
};

}  // namespace pt
