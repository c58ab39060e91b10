// Mixture of experts around the expert matmuls, fp32 and bf16: the router (softmax over the E
// experts, top-k, renormalised weights) and its backward, the permutation of the N tokens into
// N k expert rows and back, and the weighted combine of the experts' outputs and its backward.
// The contracts are Ops' (core/ops/ops.h); CpuOps (core/cpu/cpu_moe.cpp) is the reference.
//
// Computes, for token n, its choices j < k and r = slot_of[n k + j] (its row in the permuted
// buffer), with activations stored in the dtype and all math in fp32 (one rounding, at the store):
//   router:       probs[n] = softmax(logits[n]) (f32); topk_expert[n, j] = the j-th most probable
//                 expert (a tie to the lower index); topk_weight[n, j] = its prob / S, S = the
//                 sum of the k chosen probs.
//   router bwd:   dp[e] = dprobs_all[e] (+ (dw_j - sum_j' w_j' dw_j') / S when e = topk_expert[n, j]),
//                 dlogits[n, e] = probs[e] (dp[e] - sum_e' probs[e'] dp[e']), overwritten.
//   permute:      out[r] = x[n];            its backward:  dx[n] += sum_j dout[r]  (j in order)
//   combine:      y[n] = sum_j w_j expert_out[r]  (j in order, overwritten)
//   combine bwd:  dexpert_out[r] = w_j dy[n],  dtopk_weight[n, j] = dot(dy[n], expert_out[r]).
//
// Algorithm: one warp per row, 8 rows per 256-thread block, so every sum over j or over a row
// has one fixed order and no atomics are needed (bitwise deterministic run to run).
//  - Router, a warp per token: lane l owns experts l, l+32, ... The softmax is three passes
//    over the logits row (max, sum of exp, store), the row max and sum by warp butterflies. The
//    top-k is k arg-max passes: the j-th choice is the greatest expert in the order (prob
//    descending, index ascending) strictly after the (j-1)-th, so no "taken" list is kept; each
//    lane scans its own experts of the probs row it just wrote (its own stores: no barrier) and a
//    butterfly of (prob, index) pairs picks the winner, ties to the lower index, exactly the
//    CPU's repeated arg-max. S and the renormalisation run in j order as on the CPU.
//  - Router backward, a warp per token: every lane sums S and sum_j w_j dw_j itself in j order
//    (k broadcast loads); dp[e] looks e up among the k choices (O(k) compares per expert: k is a
//    handful, and E a few hundred at most); sum_e probs dp is a warp butterfly.
//  - permute, permute backward and combine, a warp per token: lane l moves chunks l, l+32, ...
//    of the token's row and loops over its k choices (slot_of and the weights are broadcast
//    loads), accumulating in fp32 registers in j order.
//  - combine backward, a warp per (token, choice) pair: the pair's own dot product (a butterfly)
//    and its scaled copy of dy; the k warps of a token read dy[n] from L1/L2 after the first.
// Rows move in 16-byte chunks (128-bit loads/stores) when C is a multiple of the chunk and every
// row pointer is 16-byte aligned, otherwise a VEC=1 instantiation moves single elements.
// slot_of is trusted to be a permutation of [0, N k) (see moe.h): a slot out of range is skipped,
// never dereferenced. Under --use_fast_math expf and the divisions are a few ulp from the CPU's:
// within the 1e-5 fp32 agreement.
//
// Memory traffic (s = 2 for bf16, 4 for fp32; the floor the kernels should approach):
//   router fwd:   read N E s (logits; passes 2-3 from L1/L2) + write 4 N E (probs; the k
//                 arg-max passes re-read it from L1/L2) + write 8 N k           = N E (s + 4) + 8 N k
//   router bwd:   read 4 N E (probs) + 12 N k + 4 E, write N E s (dlogits)      = N E (4 + s) + 12 N k
//   permute:      read N C s + write N k C s                                    = N C s (1 + k)
//   permute bwd:  read N k C s (dout) + read and write N C s (dx)               = N C s (k + 2)
//   combine:      read N k C s + 8 N k + write N C s                            = N C s (k + 1)
//   combine bwd:  read N C s (dy) + N k C s (expert_out) + write N k C s        = N C s (2k + 1)
// e.g. N = B*T = 8192 tokens, C = 4096, k = 2, bf16 (67.1 MB per [N, C] tensor): permute and
// combine 201 MB (~60 us at 3.35 TB/s, H100 SXM), permute bwd 268 MB (~80 us), combine bwd
// 336 MB (~100 us); the router at E = 64 moves ~3 MB (a few us, latency-bound). A few flops
// per byte: memory-bound.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "cuda/cuda_common.h"
#include "cuda/moe.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

// The warp's row and the thread's lane: warp w of block b takes row b * kRowsPerBlock + w.
__device__ __forceinline__ size_t warp_row() {
  return static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
}
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % kWarpSize); }

unsigned row_blocks(size_t rows) { return static_cast<unsigned>(ceil_div(rows, size_t(kRowsPerBlock))); }

// The greater of the lanes' (prob, expert) pairs in the order (prob descending, expert ascending);
// every lane gets it. The order is total on non-NaN probs, so the butterfly gives every lane the
// same winner.
__device__ __forceinline__ void warp_arg_max(float& p, int& e) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float op = __shfl_xor_sync(0xffffffffu, p, offset);
    const int oe = __shfl_xor_sync(0xffffffffu, e, offset);
    if (op > p || (op == p && oe < e)) {
      p = op;
      e = oe;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock) moe_router_forward_kernel(float* probs, int32_t* topk_expert,
                                                                    float* topk_weight, const T* logits, int N, int E,
                                                                    int k) {
  const size_t row = warp_row();
  const int lane = lane_id();
  if (row >= static_cast<size_t>(N)) return;  // the whole warp leaves together: full-warp shuffles below
  const T* x = logits + row * E;
  float* p = probs + row * E;

  float mx = -INFINITY;
  for (int e = lane; e < E; e += kWarpSize) mx = fmaxf(mx, to_float(x[e]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += kWarpSize) sum += expf(to_float(x[e]) - mx);
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += kWarpSize) p[e] = expf(to_float(x[e]) - mx) / sum;

  // Choice j is the greatest expert strictly after choice j-1 in the order; "none" (-1, E) loses
  // to every prob >= 0 and is left only when the probs are NaN (a diverged run): then the expert
  // is written as -1, which the host's routing plan rejects with a message.
  int32_t* choice = topk_expert + row * k;
  float* weight = topk_weight + row * k;
  float prev_p = INFINITY, chosen_sum = 0.0f;
  int prev_e = -1;
  for (int j = 0; j < k; ++j) {
    float best_p = -1.0f;
    int best_e = E;
    for (int e = lane; e < E; e += kWarpSize) {
      const float v = p[e];
      const bool after_prev = v < prev_p || (v == prev_p && e > prev_e);
      if (after_prev && v > best_p) {  // '>': within the lane, a tie keeps the lower expert
        best_p = v;
        best_e = e;
      }
    }
    warp_arg_max(best_p, best_e);
    if (lane == 0) {
      choice[j] = best_e < E ? best_e : -1;
      weight[j] = best_p;
    }
    chosen_sum += best_p;
    prev_p = best_p;
    prev_e = best_e;
  }
  if (lane == 0)
    for (int j = 0; j < k; ++j) weight[j] /= chosen_sum;  // lane 0's own stores
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    moe_router_backward_kernel(T* dlogits, const float* probs, const int32_t* topk_expert, const float* topk_weight,
                               const float* dtopk_weight, const float* dprobs_all, int N, int E, int k) {
  const size_t row = warp_row();
  const int lane = lane_id();
  if (row >= static_cast<size_t>(N)) return;
  const float* p = probs + row * E;
  const int32_t* choice = topk_expert + row * k;
  const float* w = topk_weight + row * k;
  const float* dw = dtopk_weight + row * k;

  float S = 0.0f, wdw = 0.0f;  // in j order, as the CPU sums them
  for (int j = 0; j < k; ++j) {
    const int e = choice[j];
    if (e >= 0 && e < E) S += p[e];
    wdw += w[j] * dw[j];
  }
  auto dp = [&](int e) {
    float d = dprobs_all[e];
    for (int j = 0; j < k; ++j)
      if (choice[j] == e) d += (dw[j] - wdw) / S;
    return d;
  };
  float pdp = 0.0f;
  for (int e = lane; e < E; e += kWarpSize) pdp += p[e] * dp(e);
  pdp = warp_sum(pdp);
  T* out = dlogits + row * E;
  for (int e = lane; e < E; e += kWarpSize) out[e] = from_float<T>(p[e] * (dp(e) - pdp));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) moe_permute_kernel(T* out, const T* x, const int32_t* slot_of, int N, int C,
                                                             int k) {
  const size_t n = warp_row();
  if (n >= static_cast<size_t>(N)) return;
  const size_t NK = static_cast<size_t>(N) * k;
  const int32_t* slot = slot_of + n * k;
  for (int c = lane_id() * VEC; c < C; c += kWarpSize * VEC) {
    const Packed<T, VEC> v = load_packed<T, VEC>(x + n * C + c);
    for (int j = 0; j < k; ++j) {
      const size_t r = static_cast<uint32_t>(slot[j]);  // a negative slot becomes >= NK
      if (r < NK) store_packed<T, VEC>(out + r * C + c, v);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock)
    moe_permute_backward_kernel(T* dx, const T* dout, const int32_t* slot_of, int N, int C, int k) {
  const size_t n = warp_row();
  if (n >= static_cast<size_t>(N)) return;
  const size_t NK = static_cast<size_t>(N) * k;
  const int32_t* slot = slot_of + n * k;
  for (int c = lane_id() * VEC; c < C; c += kWarpSize * VEC) {
    Packed<T, VEC> d = load_packed<T, VEC>(dx + n * C + c);
    float acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = to_float(d.v[i]);
    for (int j = 0; j < k; ++j) {
      const size_t r = static_cast<uint32_t>(slot[j]);
      if (r >= NK) continue;
      const Packed<T, VEC> g = load_packed<T, VEC>(dout + r * C + c);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += to_float(g.v[i]);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) d.v[i] = from_float<T>(acc[i]);
    store_packed<T, VEC>(dx + n * C + c, d);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) moe_combine_kernel(T* y, const T* expert_out, const float* topk_weight,
                                                             const int32_t* slot_of, int N, int C, int k) {
  const size_t n = warp_row();
  if (n >= static_cast<size_t>(N)) return;
  const size_t NK = static_cast<size_t>(N) * k;
  const int32_t* slot = slot_of + n * k;
  const float* w = topk_weight + n * k;
  for (int c = lane_id() * VEC; c < C; c += kWarpSize * VEC) {
    float acc[VEC] = {};
    for (int j = 0; j < k; ++j) {
      const size_t r = static_cast<uint32_t>(slot[j]);
      if (r >= NK) continue;
      const float wj = w[j];
      const Packed<T, VEC> v = load_packed<T, VEC>(expert_out + r * C + c);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += wj * to_float(v.v[i]);
    }
    Packed<T, VEC> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.v[i] = from_float<T>(acc[i]);
    store_packed<T, VEC>(y + n * C + c, o);
  }
}

// One warp per (token, choice) pair i = n k + j. dexpert_out or dtopk_weight may be null.
template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock)
    moe_combine_backward_kernel(T* dexpert_out, float* dtopk_weight, const T* dy, const T* expert_out,
                                const float* topk_weight, const int32_t* slot_of, int N, int C, int k) {
  const size_t i = warp_row();
  const size_t NK = static_cast<size_t>(N) * k;
  if (i >= NK) return;
  const int lane = lane_id();
  const size_t n = i / k;
  const size_t r = static_cast<uint32_t>(slot_of[i]);
  const bool valid = r < NK;
  const float wj = dexpert_out ? topk_weight[i] : 0.0f;
  float dot = 0.0f;
  if (valid) {
    for (int c = lane * VEC; c < C; c += kWarpSize * VEC) {
      const Packed<T, VEC> g = load_packed<T, VEC>(dy + n * C + c);
      if (dtopk_weight) {
        const Packed<T, VEC> e = load_packed<T, VEC>(expert_out + r * C + c);
#pragma unroll
        for (int v = 0; v < VEC; ++v) dot += to_float(g.v[v]) * to_float(e.v[v]);
      }
      if (dexpert_out) {
        Packed<T, VEC> d;
#pragma unroll
        for (int v = 0; v < VEC; ++v) d.v[v] = from_float<T>(wj * to_float(g.v[v]));
        store_packed<T, VEC>(dexpert_out + r * C + c, d);
      }
    }
  }
  dot = warp_sum(dot);  // every lane of the warp gets here (valid is the same for the warp)
  if (dtopk_weight && lane == 0) dtopk_weight[i] = dot;
}

// width_name: "C" for the token rows, "E" for the router's.
void check_shape(const char* op, int N, int width, int k, const char* width_name = "C") {
  check(N >= 0 && width >= 0 && k >= 0, std::string(op) + ": negative dimension (N=" + std::to_string(N) + ", " +
                                            width_name + "=" + std::to_string(width) + ", k=" + std::to_string(k) + ")");
}

// Calls launch(std::integral_constant<int, VEC>{}) with VEC = 16 / sizeof(T) (128-bit chunks)
// when C is a multiple of it and every row pointer is 16-byte aligned (a null one counts as
// aligned), else with VEC = 1.
template <typename T, typename F>
void with_chunk(int C, std::initializer_list<const void*> rows, F&& launch) {
  constexpr int V = 16 / sizeof(T);
  bool vec = C % V == 0;
  for (const void* p : rows) vec = vec && is_aligned(p, 16);
  if (vec)
    launch(std::integral_constant<int, V>{});
  else
    launch(std::integral_constant<int, 1>{});
}

}  // namespace

void moe_router_forward(DType dtype, float* probs, int32_t* topk_expert, float* topk_weight, const void* logits, int N,
                        int E, int k, void* stream) {
  check(N >= 0 && k >= 1 && k <= E, "moe_router_forward: need N >= 0 and 1 <= k <= E (N=" + std::to_string(N) +
                                        ", E=" + std::to_string(E) + ", k=" + std::to_string(k) + ")");
  if (N == 0) return;  // a zero-block grid is a launch error
  dispatch_act("moe_router_forward", dtype, [&](auto tag) {
    using T = decltype(tag);
    moe_router_forward_kernel<T><<<row_blocks(N), kBlock, 0, as_stream(stream)>>>(
        probs, topk_expert, topk_weight, static_cast<const T*>(logits), N, E, k);
    CUDA_CHECK_LAUNCH();
  });
}

void moe_router_backward(DType dtype, void* dlogits, const float* probs, const int32_t* topk_expert,
                         const float* topk_weight, const float* dtopk_weight, const float* dprobs_all, int N, int E,
                         int k, void* stream) {
  check_shape("moe_router_backward", N, E, k, "E");
  if (size_t(N) * E == 0) return;
  dispatch_act("moe_router_backward", dtype, [&](auto tag) {
    using T = decltype(tag);
    moe_router_backward_kernel<T><<<row_blocks(N), kBlock, 0, as_stream(stream)>>>(
        static_cast<T*>(dlogits), probs, topk_expert, topk_weight, dtopk_weight, dprobs_all, N, E, k);
    CUDA_CHECK_LAUNCH();
  });
}

void moe_permute(DType dtype, void* out, const void* x, const int32_t* slot_of, int N, int C, int k, void* stream) {
  check_shape("moe_permute", N, C, k);
  if (size_t(N) * C * k == 0) return;
  dispatch_act("moe_permute", dtype, [&](auto tag) {
    using T = decltype(tag);
    with_chunk<T>(C, {out, x}, [&](auto vec) {
      moe_permute_kernel<T, decltype(vec)::value><<<row_blocks(N), kBlock, 0, as_stream(stream)>>>(
          static_cast<T*>(out), static_cast<const T*>(x), slot_of, N, C, k);
    });
    CUDA_CHECK_LAUNCH();
  });
}

void moe_permute_backward(DType dtype, void* dx, const void* dout, const int32_t* slot_of, int N, int C, int k,
                          void* stream) {
  check_shape("moe_permute_backward", N, C, k);
  if (size_t(N) * C * k == 0) return;  // nothing to add
  dispatch_act("moe_permute_backward", dtype, [&](auto tag) {
    using T = decltype(tag);
    with_chunk<T>(C, {dx, dout}, [&](auto vec) {
      moe_permute_backward_kernel<T, decltype(vec)::value><<<row_blocks(N), kBlock, 0, as_stream(stream)>>>(
          static_cast<T*>(dx), static_cast<const T*>(dout), slot_of, N, C, k);
    });
    CUDA_CHECK_LAUNCH();
  });
}

void moe_combine(DType dtype, void* y, const void* expert_out, const float* topk_weight, const int32_t* slot_of, int N,
                 int C, int k, void* stream) {
  check_shape("moe_combine", N, C, k);
  if (size_t(N) * C == 0) return;  // (k = 0 still runs: y is overwritten with zeros)
  dispatch_act("moe_combine", dtype, [&](auto tag) {
    using T = decltype(tag);
    with_chunk<T>(C, {y, expert_out}, [&](auto vec) {
      moe_combine_kernel<T, decltype(vec)::value><<<row_blocks(N), kBlock, 0, as_stream(stream)>>>(
          static_cast<T*>(y), static_cast<const T*>(expert_out), topk_weight, slot_of, N, C, k);
    });
    CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_backward(DType dtype, void* dexpert_out, float* dtopk_weight, const void* dy, const void* expert_out,
                          const float* topk_weight, const int32_t* slot_of, int N, int C, int k, void* stream) {
  check_shape("moe_combine_backward", N, C, k);
  const size_t NK = size_t(N) * k;
  if (NK == 0 || (!dexpert_out && !dtopk_weight)) return;  // (C = 0 still runs: dtopk_weight = 0)
  dispatch_act("moe_combine_backward", dtype, [&](auto tag) {
    using T = decltype(tag);
    with_chunk<T>(C, {dexpert_out, dy, expert_out}, [&](auto vec) {
      moe_combine_backward_kernel<T, decltype(vec)::value><<<row_blocks(NK), kBlock, 0, as_stream(stream)>>>(
          static_cast<T*>(dexpert_out), dtopk_weight, static_cast<const T*>(dy), static_cast<const T*>(expert_out),
          topk_weight, slot_of, N, C, k);
    });
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
