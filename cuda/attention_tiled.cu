// Causal self-attention on CUDA cores, fp32 math for f32 or bf16 tensors and ANY head size:
// the kernel of the fp32 backend (it exists to match CpuOps tightly) and the bf16 fallback for
// head sizes the tensor-core kernels (flash_attention_*.cu) do not cover. Simple, not fast.
//
// Computes (scale = 1/sqrt(HS), query i attends to keys j <= i), per (b, h), with k and v those
// of key/value head h / G (grouped-query attention, G = NH / NKV query heads per key/value head;
// qkv rows are q: NH heads | k: NKV heads | v: NKV heads, never with a K/V head repeated):
//   forward:  lse_i = log sum_j exp(scale q_i.k_j),  out_i = sum_j exp(scale q_i.k_j - lse_i) v_j
//   backward: P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dO_i.v_j, dS_ij = P_ij (dP_ij - D_i)
//             with D_i = dO_i.O_i (attention_row_dot);  dq_i = scale sum_j dS_ij k_j,
//             dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dO_i, dk/dv summed over the G
//             query heads of the group  (dqkv overwritten).
//
// Algorithm: flash-attention tiling with kTile = 32 rows per block and one thread per row, tiles
// in fp32 shared memory; nothing T x T is ever stored.
//  - forward: a block owns 32 queries (thread i: query i) and walks the key tiles 0..its own
//    with an online softmax (running max m and sum l; a new max rescales the accumulator by
//    exp(m_old - m_new)). The diagonal tile is masked; every row keeps at least key 0 of each
//    tile unmasked, so the running max is finite from the first tile on.
//  - backward, two kernels so that every gradient element has one owner (no atomics,
//    deterministic): dkdv — a block owns 32 keys of one key/value head (thread j: key j) and,
//    for each of the group's G query heads in order, walks the query tiles from its own to the
//    last, recomputing P from q, k and lse (the group sum stays in the block's accumulators: no
//    atomics across heads); dq — a block owns 32 queries and walks the key tiles 0..its own. The price is recomputing
//    q.k and dO.v in both (7 T^2-sized products per head instead of the 5 of a single pass with atomic dq).
// Rows a thread owns are stored with an odd stride (HS | 1) so the 32 threads hit 32 different
// banks; tiles every thread reads at the same address (broadcast) are unpadded. Loads and the
// final stores go through shared memory so global accesses are coalesced.
// Shared memory grows with HS (fp32 tiles): ~0.5 KB * HS forward, ~0.75 KB * HS backward; a head
// size beyond the device's per-block limit throws.
//
// Cost (causal, T^2/2 pairs per (b, h)): forward 2*B*NH*T^2*HS FLOPs, backward 7*B*NH*T^2*HS
// (plus 2*B*NH*T^2*HS for q.k in the dkdv pass's logits), independent of NKV; bytes: qkv, out,
// dout, lse once each per tile pass (K/V tiles re-read per query tile from L2; the K/V part of
// qkv and dqkv is NKV/NH of multi-head attention's). CUDA-core fp32 at one warp per block:
// an order of magnitude below the tensor-core kernels; fine for tests and small models.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/attention_rows.cuh"
#include "cuda/cuda_common.h"

namespace pt::gpu {

namespace {

constexpr int kTile = 32;  // rows per tile = threads per block

struct Layout {
  int T, NH, NKV, HS, C;
  size_t row;  // qkv row stride: (NH + 2 NKV) HS
  // Query head h, key/value head g of token (b, t) in qkv (or dqkv).
  __device__ size_t q(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * row + size_t(h) * HS; }
  __device__ size_t k(int b, int t, int g) const { return q(b, t, NH + g); }
  __device__ size_t v(int b, int t, int g) const { return q(b, t, NH + NKV + g); }
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  __device__ size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * C + size_t(h) * HS; }
  __device__ size_t l(int b, int h, int t) const { return (static_cast<size_t>(b) * NH + h) * T + t; }
};

// dst[r * ld + c] = src row (row0 + r) at channel c (0 past T), cooperative over the block.
template <typename T>
__device__ void load_rows(float* dst, int ld, const T* src, size_t src_stride, int row0, int T_, int HS) {
  for (int e = threadIdx.x; e < kTile * HS; e += kTile) {
    const int r = e / HS, c = e % HS, t = row0 + r;
    dst[r * ld + c] = t < T_ ? to_float(src[static_cast<size_t>(t) * src_stride + c]) : 0.0f;
  }
}

// dst row (row0 + r) = src[r * ld + c] for rows < T, cooperative.
template <typename T>
__device__ void store_rows(T* dst, size_t dst_stride, const float* src, int ld, int row0, int T_, int HS) {
  for (int e = threadIdx.x; e < kTile * HS; e += kTile) {
    const int r = e / HS, c = e % HS, t = row0 + r;
    if (t < T_) dst[static_cast<size_t>(t) * dst_stride + c] = from_float<T>(src[r * ld + c]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    forward_kernel(T* out, float* lse, const T* qkv, Layout L, float scale) {
  extern __shared__ float smem[];
  const int HS = L.HS, ld = HS | 1;
  float* q_s = smem;              // [kTile][ld], row i is thread i's
  float* o_s = q_s + kTile * ld;  // [kTile][ld]
  float* k_s = o_s + kTile * ld;  // [kTile][HS], read by all threads at once
  float* v_s = k_s + kTile * HS;  // [kTile][HS]
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / L.NH, h = blockIdx.y % L.NH;
  const int i = threadIdx.x, qi = qt * kTile + i;
  const T* head = qkv + L.q(b, 0, h);
  const T* khead = qkv + L.k(b, 0, L.kv_head(h));
  const T* vhead = qkv + L.v(b, 0, L.kv_head(h));

  load_rows(q_s, ld, head, L.row, qt * kTile, L.T, HS);
  for (int c = 0; c < HS; ++c) o_s[i * ld + c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // everyone is done with the previous K/V tile
    load_rows(k_s, HS, khead, L.row, kt * kTile, L.T, HS);
    load_rows(v_s, HS, vhead, L.row, kt * kTile, L.T, HS);
    __syncthreads();
    float s[kTile];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const int kj = kt * kTile + j;
      float dot = 0.0f;
      for (int c = 0; c < HS; ++c) dot += q_s[i * ld + c] * k_s[j * HS + c];
      s[j] = (kj <= qi && kj < L.T) ? dot * scale : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    const float m_new = fmaxf(m, mx);  // finite: key kt*kTile <= qi is never masked
    const float alpha = expf(m - m_new);
    float psum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      s[j] = expf(s[j] - m_new);
      psum += s[j];
    }
    l = l * alpha + psum;
    m = m_new;
    for (int c = 0; c < HS; ++c) {
      float acc = o_s[i * ld + c] * alpha;
#pragma unroll
      for (int j = 0; j < kTile; ++j) acc += s[j] * v_s[j * HS + c];
      o_s[i * ld + c] = acc;
    }
  }
  const float inv = 1.0f / l;
  for (int c = 0; c < HS; ++c) o_s[i * ld + c] *= inv;
  if (qi < L.T) lse[L.l(b, h, qi)] = m + logf(l);
  __syncthreads();
  store_rows(out + L.o(b, 0, h), L.C, o_s, ld, qt * kTile, L.T, HS);
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    backward_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dv, Layout L,
                         float scale) {
  extern __shared__ float smem[];
  const int HS = L.HS, ld = HS | 1;
  float* k_s = smem;                // [kTile][ld], row j is thread j's key
  float* v_s = k_s + kTile * ld;    // [kTile][ld]
  float* dk_s = v_s + kTile * ld;   // [kTile][ld]
  float* dv_s = dk_s + kTile * ld;  // [kTile][ld]
  float* q_s = dv_s + kTile * ld;   // [kTile][HS], broadcast reads
  float* do_s = q_s + kTile * HS;   // [kTile][HS]
  float* lse_s = do_s + kTile * HS;
  float* d_s = lse_s + kTile;
  const int kt = blockIdx.x;  // key tile 0 has the most query tiles: launched first
  const int nq = gridDim.x;
  const int b = blockIdx.y / L.NKV, g = blockIdx.y % L.NKV;  // one key/value head
  const int G = L.NH / L.NKV;
  const int j = threadIdx.x, kj = kt * kTile + j;

  load_rows(k_s, ld, qkv + L.k(b, 0, g), L.row, kt * kTile, L.T, HS);
  load_rows(v_s, ld, qkv + L.v(b, 0, g), L.row, kt * kTile, L.T, HS);
  for (int c = 0; c < HS; ++c) dk_s[j * ld + c] = dv_s[j * ld + c] = 0.0f;
  for (int h = g * G; h < (g + 1) * G; ++h) {  // the group's query heads, in order
    const T* head = qkv + L.q(b, 0, h);
    const T* dhead = dout + L.o(b, 0, h);
    for (int qt = kt; qt < nq; ++qt) {
      __syncthreads();
      load_rows(q_s, HS, head, L.row, qt * kTile, L.T, HS);
      load_rows(do_s, HS, dhead, L.C, qt * kTile, L.T, HS);
      const int t = qt * kTile + threadIdx.x;
      lse_s[threadIdx.x] = t < L.T ? lse[L.l(b, h, t)] : 0.0f;
      d_s[threadIdx.x] = t < L.T ? Dv[L.l(b, h, t)] : 0.0f;
      __syncthreads();
      if (kj >= L.T) continue;  // padding key: nothing to accumulate (still joins the barriers)
      for (int i = 0; i < kTile; ++i) {
        const int qi = qt * kTile + i;
        if (qi < kj || qi >= L.T) continue;
        float qk = 0.0f, dp = 0.0f;
        for (int c = 0; c < HS; ++c) {
          qk += q_s[i * HS + c] * k_s[j * ld + c];
          dp += do_s[i * HS + c] * v_s[j * ld + c];
        }
        const float p = expf(qk * scale - lse_s[i]);
        const float ds = p * (dp - d_s[i]);
        for (int c = 0; c < HS; ++c) {
          dv_s[j * ld + c] += p * do_s[i * HS + c];
          dk_s[j * ld + c] += ds * q_s[i * HS + c];
        }
      }
    }
  }
  for (int c = 0; c < HS; ++c) dk_s[j * ld + c] *= scale;
  __syncthreads();
  store_rows(dqkv + L.k(b, 0, g), L.row, dk_s, ld, kt * kTile, L.T, HS);
  store_rows(dqkv + L.v(b, 0, g), L.row, dv_s, ld, kt * kTile, L.T, HS);
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dv, Layout L,
                       float scale) {
  extern __shared__ float smem[];
  const int HS = L.HS, ld = HS | 1;
  float* q_s = smem;               // [kTile][ld], row i is thread i's query
  float* do_s = q_s + kTile * ld;  // [kTile][ld]
  float* dq_s = do_s + kTile * ld; // [kTile][ld]
  float* k_s = dq_s + kTile * ld;  // [kTile][HS], broadcast reads
  float* v_s = k_s + kTile * HS;   // [kTile][HS]
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / L.NH, h = blockIdx.y % L.NH;
  const int i = threadIdx.x, qi = qt * kTile + i;
  const T* head = qkv + L.q(b, 0, h);
  const T* khead = qkv + L.k(b, 0, L.kv_head(h));
  const T* vhead = qkv + L.v(b, 0, L.kv_head(h));

  load_rows(q_s, ld, head, L.row, qt * kTile, L.T, HS);
  load_rows(do_s, ld, dout + L.o(b, 0, h), L.C, qt * kTile, L.T, HS);
  for (int c = 0; c < HS; ++c) dq_s[i * ld + c] = 0.0f;
  const bool valid = qi < L.T;
  const float lse_i = valid ? lse[L.l(b, h, qi)] : 0.0f;
  const float d_i = valid ? Dv[L.l(b, h, qi)] : 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();
    load_rows(k_s, HS, khead, L.row, kt * kTile, L.T, HS);
    load_rows(v_s, HS, vhead, L.row, kt * kTile, L.T, HS);
    __syncthreads();
    if (!valid) continue;
    for (int j = 0; j < kTile; ++j) {
      const int kj = kt * kTile + j;
      if (kj > qi) break;  // keys past the query (and past T, since qi < T) are masked
      float qk = 0.0f, dp = 0.0f;
      for (int c = 0; c < HS; ++c) {
        qk += q_s[i * ld + c] * k_s[j * HS + c];
        dp += do_s[i * ld + c] * v_s[j * HS + c];
      }
      const float ds = expf(qk * scale - lse_i) * (dp - d_i);
      for (int c = 0; c < HS; ++c) dq_s[i * ld + c] += ds * k_s[j * HS + c];
    }
  }
  for (int c = 0; c < HS; ++c) dq_s[i * ld + c] *= scale;
  __syncthreads();
  store_rows(dqkv + L.q(b, 0, h), L.row, dq_s, ld, qt * kTile, L.T, HS);
}

// One warp per (b, t, h) row: D = dout . out over the head's channels.
template <typename T>
__global__ void __launch_bounds__(256) row_dot_kernel(float* D, const T* dout, const T* out, int B, int T_, int NH,
                                                      int HS) {
  for_each_head_row(B, T_, NH, HS, [&](size_t off, size_t li, int lane) {
    float acc = 0.0f;
    for (int c = lane; c < HS; c += kWarpSize) acc += to_float(dout[off + c]) * to_float(out[off + c]);
    acc = warp_sum(acc);
    if (lane == 0) D[li] = acc;
  });
}

// Opts the kernel in to `bytes` of dynamic shared memory, or throws naming the head size.
template <typename K>
void set_shared(K kernel, size_t bytes, int HS) {
  use_dynamic_shared(kernel, bytes,
                     [&] { return "attention: head size " + std::to_string(HS) + " in the CUDA-core kernels"; });
}

Layout make_layout(int T, int NH, int NKV, int HS) {
  check(NKV > 0 && NH % NKV == 0, "attention: n_kv_heads must divide n_heads");
  return Layout{T, NH, NKV, HS, NH * HS, static_cast<size_t>(NH + 2 * NKV) * HS};
}

dim3 tile_grid(int B, int T, int NH) {
  const long long bh = static_cast<long long>(B) * NH;
  check(bh <= 65535, "attention: B * n_heads = " + std::to_string(bh) + " exceeds the grid's y limit 65535");
  return dim3(static_cast<unsigned>(ceil_div(T, kTile)), static_cast<unsigned>(bh));
}

}  // namespace

void attention_forward_tiled(DType dtype, void* out, float* lse, const void* qkv, int B, int T, int NH, int NKV, int HS,
                             void* stream) {
  if (B <= 0 || T <= 0) return;
  const Layout L = make_layout(T, NH, NKV, HS);
  const size_t ld = HS | 1;
  const size_t smem = (2 * kTile * ld + 2 * size_t(kTile) * HS) * sizeof(float);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  dispatch_act("attention_forward", dtype, [&](auto tag) {
    using E = decltype(tag);
    set_shared(forward_kernel<E>, smem, HS);
    forward_kernel<E><<<tile_grid(B, T, NH), kTile, smem, as_stream(stream)>>>(
        static_cast<E*>(out), lse, static_cast<const E*>(qkv), L, scale);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_tiled(DType dtype, void* dqkv, const void* dout, const void* qkv, const float* lse,
                              const float* D, int B, int T, int NH, int NKV, int HS, void* stream) {
  if (B <= 0 || T <= 0) return;
  const Layout L = make_layout(T, NH, NKV, HS);
  const size_t ld = HS | 1;
  const size_t smem_kv = (4 * kTile * ld + 2 * size_t(kTile) * HS + 2 * kTile) * sizeof(float);
  const size_t smem_q = (3 * kTile * ld + 2 * size_t(kTile) * HS) * sizeof(float);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  dispatch_act("attention_backward", dtype, [&](auto tag) {
    using E = decltype(tag);
    set_shared(backward_dkdv_kernel<E>, smem_kv, HS);
    set_shared(backward_dq_kernel<E>, smem_q, HS);
    E* dx = static_cast<E*>(dqkv);
    const E* dy = static_cast<const E*>(dout);
    const E* x = static_cast<const E*>(qkv);
    backward_dkdv_kernel<E><<<tile_grid(B, T, NKV), kTile, smem_kv, as_stream(stream)>>>(dx, dy, x, lse, D, L, scale);
    CUDA_CHECK_LAUNCH();
    backward_dq_kernel<E><<<tile_grid(B, T, NH), kTile, smem_q, as_stream(stream)>>>(dx, dy, x, lse, D, L, scale);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_row_dot(DType dtype, float* D, const void* dout, const void* out, int B, int T, int NH, int HS,
                       void* stream) {
  if (B <= 0 || T <= 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  dispatch_act("attention_backward", dtype, [&](auto tag) {
    using E = decltype(tag);
    row_dot_kernel<E><<<grid_stride_blocks(rows, 256 / kWarpSize), 256, 0, as_stream(stream)>>>(
        D, static_cast<const E*>(dout), static_cast<const E*>(out), B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
