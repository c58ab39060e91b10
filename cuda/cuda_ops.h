// CudaOps: the Ops interface on one NVIDIA GPU. Host code that checks each call's tensors
// (dtype, size, null) and launches the kernels of cuda/*.cu on the backend's own stream, in
// order, so consecutive ops need no synchronisation; only download, sum, sum_squares and
// synchronize wait for the GPU. record() captures a piece of work as a CUDA graph to replay.
//
// Dtypes: the compute dtype (f32 or bf16, chosen at construction) is what the model allocates
// for weights and activations. Each op takes its activation dtype from its input tensors, so an
// op also runs on f32 tensors in a bf16 backend (tests use that); parameter gradients may be
// f32 or the activation dtype (the model keeps them f32), statistics, lse, losses, master
// weights and moments are f32, token ids i32.
//
// Determinism: every kernel is bitwise reproducible run to run on one GPU (no float atomics;
// see each kernel file's header). cuBLASLt is deterministic for a fixed algorithm; its
// heuristic may pick differently on another GPU model or library version.
//
// Memory: alloc is cudaMalloc + zero fill (stream-ordered); running out of memory throws a
// RuntimeError naming the size, what is free, and the config knobs that reduce memory. Kernels
// that need temporary space (deterministic reductions, the embedding sort, dtype staging for
// transfers) share one scratch buffer that grows on demand and is reused, which is safe because
// every op runs on the one stream in order.
//
// No CUDA headers here: g++-compiled code can include it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/ops/ops.h"

namespace pt {

namespace gpu {
struct MatmulContext;
}

class CudaOps final : public Ops {
 public:
  // Uses the current CUDA device. compute_dtype must be f32 or bf16.
  explicit CudaOps(DType compute_dtype);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::cuda; }
  std::string device_description() const override { return description_; }
  DType compute_dtype() const override { return compute_; }
  // The stream every op runs on (a cudaStream_t): communication (NcclComm, the staged MpiComm)
  // orders itself against it with events instead of waiting on the host.
  void* stream() const { return stream_; }

  Tensor alloc(size_t n, DType dtype) override;
  void release(Tensor& t) override;
  // live/peak: the tensors of alloc (not the scratch buffer, cuBLASLt's workspace or the CUDA
  // context); device_used/device_total: cudaMemGetInfo (0 when the query fails).
  MemoryUse memory_use() const override;
  void reset_peak_memory() override { peak_bytes_ = live_bytes_; }
  void zero(Tensor t) override;
  void upload(Tensor dst, const void* host_src, DType host_dtype, size_t n) override;
  void download(void* host_dst, DType host_dtype, Tensor src, size_t n) override;
  void copy(Tensor dst, Tensor src, size_t n) override;
  void copy_2d(Tensor dst, size_t dst_ld, Tensor src, size_t src_ld, size_t rows, size_t cols) override;
  void synchronize() override;
  // CUDA graphs (cuda_ops_graphs.cpp): a stream capture of the compute stream, and of the side
  // stream where the work forks to it. While a recording lives the scratch buffer is never freed
  // (a larger request retires it until the last recording goes): the graphs hold its address.
  std::unique_ptr<RecordedWork> record(const std::function<void()>& work, std::string* why) override;
  // Marks are CUDA events (timing enabled) recorded on the compute stream, made once and reused
  // after clear_time_marks(), so a step's dozen marks cost a record each and no allocation.
  int record_time_mark() override;
  double ms_between_marks(int a, int b) override;
  void clear_time_marks() override { marks_used_ = 0; }
  // precision.matmul_algos: cuda/matmul_algo_timing.cu, through the matmul context.
  std::string matmul_library() const override;
  void time_matmul_algos() override;
  MatmulAlgos timed_matmul_algos() const override;
  void use_matmul_algos(const MatmulAlgos& algos) override;

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int vocab_start,
                         int vocab_local) override;
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int vocab_start,
                          int vocab_local) override;
  void position_forward(Tensor out, Tensor wpe, Tensor pos, int B, int T, int C) override;
  void position_backward(Tensor dwpe, Tensor dout, Tensor pos, int B, int T, int C) override;
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, int N, int C) override;
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                          Tensor rstd, int N, int C) override;
  void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                                  Tensor bias, int N, int C) override;
  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC) override;
  void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, int N, int IC,
                       int OC) override;
  void matmul_gelu_forward(Tensor out, Tensor out_pre, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                           int OC) override;
  void matmul_backward_input_dgelu(Tensor dpre, Tensor dout, Tensor w, Tensor pre, int N, int IC, int OC) override;
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C, int NH,
                          int NKV) override;
  // FP8 attention (cuda_ops_attention.cpp; core/common/fp8_attention.h): the forward casts qkv
  // into scratch (attention_fp8_cast.cu) and runs the FP8 flash kernel (flash_attention_fp8.cu);
  // the backward runs attention_backward's kernels on qkv dequantised into scratch. Both need
  // supports_fp8_attention(HS): compute capability 8.9+ with a build that has code for it, bf16,
  // head size 64 or 128.
  void attention_fp8_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int C, int NH, int NKV) override;
  void attention_fp8_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int C,
                              int NH, int NKV) override;
  bool supports_fp8_attention(int head_size) const override;
  void attention_block_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, int B, int Tq, int Tk, int C,
                               int NH, int NKV, int q_pos0, int k_pos0, bool causal) override;
  void attention_block_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                Tensor lse, int B, int Tq, int Tk, int C, int NH, int NKV, int q_pos0, int k_pos0,
                                bool causal) override;
  void merge_attention_partials(Tensor out_acc, Tensor lse_acc, Tensor out_part, Tensor lse_part, int B, int T, int C,
                                int NH) override;
  void gelu_forward(Tensor out, Tensor inp, size_t n) override;
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, size_t n) override;
  void add(Tensor out, Tensor a, Tensor b, size_t n) override;
  void scale(Tensor x, float s, size_t n) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, int N, int C, float eps) override;
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd, int N,
                        int C) override;
  void residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor w, int N, int C,
                                float eps) override;
  void rope_forward(Tensor qkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS, float theta) override;
  void rope_backward(Tensor dqkv, Tensor pos, int B, int T, int row_width, int rot_heads, int HS,
                     float theta) override;
  void swiglu_forward(Tensor out, Tensor gate_up, int N, int H) override;
  void swiglu_backward(Tensor dgate_up, Tensor gate_up, Tensor dout, int N, int H) override;
  void moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E,
                          int k) override;
  void moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor dtopk_weight,
                           Tensor dprobs_all, int N, int E, int k) override;
  void moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) override;
  void moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) override;
  void moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) override;
  void moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out, Tensor topk_weight,
                            Tensor slot_of, int N, int C, int k) override;
  void moe_route(Tensor slot_of, Tensor offsets, Tensor topk_expert, int N, int k, int E) override;
  void moe_balance_sums(Tensor sums, Tensor probs, Tensor offsets, int N, int E) override;
  void moe_balance_loss(Tensor dprobs_all, Tensor stats, Tensor sums, int E, int k, float aux_weight) override;
  void grouped_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC,
                              int OC) override;
  void grouped_matmul_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets,
                               int G, int rows, int IC, int OC) override;
  void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int N, int V, int Vp,
                             float dloss) override;
  void cross_entropy_shard_stats(Tensor stats, Tensor logits, Tensor targets, int N, int Vl, int V,
                                 int vocab_start) override;
  void cross_entropy_shard_finish(Tensor losses, Tensor logits, Tensor targets, Tensor all_stats, int shards, int N,
                                  int Vl, int V, int vocab_start, float dloss) override;
  void adamw_update(Tensor params, Tensor master, Tensor grad, Tensor m, Tensor v, size_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int t, float grad_scale, Tensor step = {}) override;
  double sum_squares(Tensor x, size_t n) override;
  double sum(Tensor x, size_t n) override;
  void sum_to(Tensor out, Tensor x, size_t n) override;
  // FP8 (cuda_ops_fp8.cpp): the casts run on any GPU; fp8_matmul needs compute capability 8.9+.
  void fp8_amax(Tensor amax, Tensor x, int rows, int cols, Fp8Amax over) override;
  void fp8_quantize(Tensor q, Tensor scale_inv, Tensor x, Tensor amaxes, int n_amax, int rows, int cols,
                    bool transpose, bool per_row, Tensor record_amax) override;
  void fp8_dequantize(Tensor out, Tensor q, Tensor scale_inv, size_t n) override;
  // per_row (cuBLASLt's outer-vector scales) needs compute capability 9.0+ besides.
  void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor bias, int M, int N,
                  int K, bool accumulate, bool per_row) override;
  bool supports_fp8() const override { return fp8_; }
  bool supports_fp8_rowwise() const override { return fp8_rowwise_; }

 private:
  class Graph;
  // At least `bytes` of device memory for the current op's temporaries (valid until the next call).
  void* scratch(size_t bytes);
  // attention_backward's work, and attention_fp8_backward's on qkv dequantised (`fp8`) into the
  // same scratch request as the backward's own temporaries (a second request could move them).
  void attention_backward_impl(const char* op, Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B,
                               int T, int C, int NH, int NKV, bool fp8);
  // Throws, naming `op` and what is missing, unless FP8 attention runs here at head size HS.
  void require_fp8_attention(const char* op, int HS) const;
  double reduce(Tensor x, size_t n, bool square, const char* op);
  // A backward's two independent products: first() on stream_, second(stream, lane) beside it on
  // the side stream with cuBLASLt lane 1 when `beside` (and PICOTRAIN_MATMUL_STREAMS is not 1),
  // else after it on stream_ with lane 0; stream_'s next op waits for both.
  void run_beside(bool beside, const std::function<void()>& first,
                  const std::function<void(void* stream, int lane)>& second);
  // The matmul context, the reduction result, the streams and their events (what the constructor
  // made); no throw.
  void release_handles() noexcept;

  DType compute_;
  std::string description_;
  bool fp8_ = false;  // compute capability 8.9 or more: FP8 tensor cores (Ada, Hopper and later)
  bool fp8_rowwise_ = false;  // and rowwise products (gpu::fp8_rowwise_available)
  void* stream_ = nullptr;  // cudaStream_t
  // matmul_backward's dW runs here beside dinp (cuda_ops_layers.cpp): a second stream, and the
  // events that fork it from stream_ and join it back (cudaStream_t, cudaEvent_t). Off with
  // PICOTRAIN_MATMUL_STREAMS=1.
  void* side_stream_ = nullptr;
  void* fork_ = nullptr;
  void* join_ = nullptr;
  bool dw_beside_dinp_ = true;
  // The experts' grouped products on the tensor-core kernels where they apply (cuda_ops_moe.cpp);
  // PICOTRAIN_GROUPED_MATMUL=0 runs one matmul per group instead, for comparison.
  bool grouped_kernels_ = true;
  gpu::MatmulContext* matmul_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  int recordings_ = 0;                  // live RecordedWork (record())
  std::vector<void*> retired_scratch_;  // scratch buffers outgrown while recordings_ > 0
  double* result_ = nullptr;  // one device double for the reductions
  size_t live_bytes_ = 0, peak_bytes_ = 0;  // memory_use()
  std::vector<void*> mark_events_;  // cudaEvent_t, record_time_mark()
  int marks_used_ = 0;
};

}  // namespace pt
