// Attention of Tq queries (q, out: [B, Tq, NH*HS]) against Tk keys/values held in separate
// [B, Tk, NKV*HS] tensors (a KV cache, another context-parallel rank's block), on CUDA cores
// with fp32 math for f32 or bf16 tensors and any head size, and the log-sum-exp merge of
// partial results. The oracle is CpuOps (core/cpu/cpu_attention_block.cpp); see
// Ops::attention_block_forward for the contract. In bf16 at head sizes 64 and 128, where every
// query sees the block's first key (ring attention's blocks, a KV cache's queries), the flash
// kernels take these calls instead (flash_attention_block_supported); these serve the rest: f32
// (the fp32 backend), other head sizes, and blocks some of whose queries see no key.
//
// Computes, per (b, h), with k, v those of key/value head h / G (grouped-query attention:
// G = NH / NKV query heads share a key/value head, never repeated in memory), query i at
// position q_pos0 + i and key j at k_pos0 + j (causal: query i sees key j iff
// k_pos0 + j <= q_pos0 + i, i.e. the keys j < n_i, a prefix):
//   forward:  lse_i = log sum_{j<n_i} exp(scale q_i.k_j),  out_i = sum_j exp(scale q_i.k_j - lse_i) v_j
//             (n_i = 0: out_i = 0, lse_i = -inf)
//   backward: from the FINAL out and lse of each row (D_i = dO_i.O_i from attention_row_dot):
//             P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dO_i.v_j - D_i),
//             dq_i += scale sum_j dS_ij k_j, dk_j += scale sum_i dS_ij q_i, dv_j += sum_i P_ij dO_i,
//             dk/dv summed over the G query heads of the group.
//   merge:    lse = logaddexp(lse_acc, lse_part), out_acc = out_acc e^(lse_acc - lse) + out_part e^(lse_part - lse).
//
// Algorithm: the tiling of attention_tiled.cu (kTile = 32 rows per block, one thread per row,
// fp32 tiles in shared memory, online softmax), generalised to position offsets and optional
// causality. Because a block of keys may be fully masked for some rows (or for all of them),
// the online softmax skips a tile while a row's running max is still -inf, instead of relying on
// key 0 of every tile being visible as the packed kernel does. Each block walks only the tiles
// some of its rows can see: keys [0, n_last) forward and in dq, queries [i_min(first key), Tq) in
// dkdv. Backward is two kernels (dkdv owning 32 keys of one key/value head and looping over
// the group's G query heads in order, dq owning 32 queries) so every gradient element has one
// owner: no atomics (not even across the heads of a group), bitwise deterministic run to run.
// Shared memory as the tiled kernels: ~0.5 KB * HS forward, ~0.75 KB * HS backward.
// The merges (two results, or a split's S parts: merge_attention_splits_gpu) are one warp per
// (b, t, h) row: lanes over the head's channels.
//
// Cost: forward 4*HS FLOPs per visible (query, key) pair and query head, backward ~14*HS (q.k and
// dO.v in both passes); bytes: q, out, lse once, K/V tiles once per query tile (from L2), K/V
// (and dK/dV) B*Tk*NKV*HS each from DRAM: NH/NKV less than multi-head attention. Decoding
// (Tq = 1) uses one thread per (b, h) row and is latency-bound; fine for sampling a small model.
// The merge moves 3*B*T*C activations + 3*B*NH*T floats: memory-bound.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/attention_rows.cuh"
#include "cuda/cuda_common.h"

namespace pt::gpu {

namespace {

constexpr int kTile = 32;  // rows per tile = threads per block

struct BlockLayout {
  int B, Tq, Tk, NH, NKV, HS;
  int C;   // q, out, dout row stride: NH * HS
  int CK;  // k, v, dk, dv row stride: NKV * HS
  int q_pos0, k_pos0;
  bool causal;
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  // Keys query i sees: a prefix [0, n) of the block.
  __device__ int visible(int i) const {
    if (!causal) return Tk;
    const long long n = static_cast<long long>(q_pos0) + i - k_pos0 + 1;
    return static_cast<int>(n < 0 ? 0 : (n > Tk ? Tk : n));
  }
  // The first query that sees key j (Tq when none does).
  __device__ int first_query(int j) const {
    if (!causal) return 0;
    const long long i = static_cast<long long>(k_pos0) + j - q_pos0;
    return static_cast<int>(i < 0 ? 0 : (i > Tq ? Tq : i));
  }
  // Head h of token (b, t) in a query-side tensor, key/value head g in a key-side one.
  __device__ size_t row(int b, int t, int T_, int h) const {
    return (static_cast<size_t>(b) * T_ + t) * C + static_cast<size_t>(h) * HS;
  }
  __device__ size_t krow(int b, int t, int g) const {
    return (static_cast<size_t>(b) * Tk + t) * CK + static_cast<size_t>(g) * HS;
  }
  __device__ size_t l(int b, int h, int i) const { return (static_cast<size_t>(b) * NH + h) * Tq + i; }
};

// dst[r * ld + c] = src row (row0 + r) at channel c (0 past T), cooperative over the block.
template <typename T>
__device__ void load_tile(float* dst, int ld, const T* src, int row0, int T_, int C, int HS) {
  for (int e = threadIdx.x; e < kTile * HS; e += kTile) {
    const int r = e / HS, c = e % HS, t = row0 + r;
    dst[r * ld + c] = t < T_ ? to_float(src[static_cast<size_t>(t) * C + c]) : 0.0f;
  }
}

// dst row (row0 + r) (+)= src[r * ld + c] for rows < T, cooperative.
template <typename T>
__device__ void store_tile(T* dst, const float* src, int ld, int row0, int T_, int C, int HS, bool accumulate) {
  for (int e = threadIdx.x; e < kTile * HS; e += kTile) {
    const int r = e / HS, c = e % HS, t = row0 + r;
    if (t >= T_) continue;
    T* p = dst + static_cast<size_t>(t) * C + c;
    *p = from_float<T>((accumulate ? to_float(*p) : 0.0f) + src[r * ld + c]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    block_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, BlockLayout L, float scale) {
  extern __shared__ float smem[];
  const int HS = L.HS, ld = HS | 1;
  float* q_s = smem;              // [kTile][ld], row i is thread i's
  float* o_s = q_s + kTile * ld;  // [kTile][ld]
  float* k_s = o_s + kTile * ld;  // [kTile][HS], read by all threads at once
  float* v_s = k_s + kTile * HS;  // [kTile][HS]
  const int qt = blockIdx.x;
  const int b = blockIdx.y / L.NH, h = blockIdx.y % L.NH;
  const int i = threadIdx.x, qi = qt * kTile + i;
  const int n_i = qi < L.Tq ? L.visible(qi) : 0;
  const int last = min(qt * kTile + kTile, L.Tq) - 1;
  const int n_block = L.visible(last);  // the most keys any row of this block sees

  const size_t k_head = L.krow(b, 0, L.kv_head(h));

  load_tile(q_s, ld, q + L.row(b, 0, L.Tq, h), qt * kTile, L.Tq, L.C, HS);
  for (int c = 0; c < HS; ++c) o_s[i * ld + c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt * kTile < n_block; ++kt) {
    __syncthreads();  // everyone is done with the previous K/V tile
    load_tile(k_s, HS, k + k_head, kt * kTile, L.Tk, L.CK, HS);
    load_tile(v_s, HS, v + k_head, kt * kTile, L.Tk, L.CK, HS);
    __syncthreads();
    if (kt * kTile >= n_i) continue;  // this row sees none of this tile (nor later ones)
    float s[kTile];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const int kj = kt * kTile + j;
      float dot = 0.0f;
      for (int c = 0; c < HS; ++c) dot += q_s[i * ld + c] * k_s[j * HS + c];
      s[j] = kj < n_i ? dot * scale : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    const float m_new = fmaxf(m, mx);     // finite: key kt*kTile < n_i is visible
    const float alpha = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
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
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: out 0
  for (int c = 0; c < HS; ++c) o_s[i * ld + c] *= inv;
  if (qi < L.Tq) lse[L.l(b, h, qi)] = l > 0.0f ? m + logf(l) : -INFINITY;
  __syncthreads();
  store_tile(out + L.row(b, 0, L.Tq, h), o_s, ld, qt * kTile, L.Tq, L.C, HS, false);
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    block_backward_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                               const float* Dv, BlockLayout L, float scale) {
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
  const int kt = blockIdx.x;
  const int b = blockIdx.y / L.NKV, g = blockIdx.y % L.NKV;  // one key/value head
  const int G = L.NH / L.NKV;
  const int j = threadIdx.x, kj = kt * kTile + j;
  const int q_first = L.first_query(kt * kTile);  // no query before it sees any key of this tile
  if (q_first >= L.Tq) return;                    // the whole block: no barrier is skipped by some threads only
  const size_t k_head = L.krow(b, 0, g);

  load_tile(k_s, ld, k + k_head, kt * kTile, L.Tk, L.CK, HS);
  load_tile(v_s, ld, v + k_head, kt * kTile, L.Tk, L.CK, HS);
  for (int c = 0; c < HS; ++c) dk_s[j * ld + c] = dv_s[j * ld + c] = 0.0f;
  for (int h = g * G; h < (g + 1) * G; ++h) {  // the group's query heads, in order
    const size_t q_head = L.row(b, 0, L.Tq, h);
    for (int qt = q_first / kTile; qt * kTile < L.Tq; ++qt) {
      __syncthreads();
      load_tile(q_s, HS, q + q_head, qt * kTile, L.Tq, L.C, HS);
      load_tile(do_s, HS, dout + q_head, qt * kTile, L.Tq, L.C, HS);
      const int t = qt * kTile + threadIdx.x;
      lse_s[threadIdx.x] = t < L.Tq ? lse[L.l(b, h, t)] : -INFINITY;
      d_s[threadIdx.x] = t < L.Tq ? Dv[L.l(b, h, t)] : 0.0f;
      __syncthreads();
      if (kj >= L.Tk) continue;  // padding key: nothing to accumulate (still joins the barriers)
      for (int i = 0; i < kTile; ++i) {
        const int qi = qt * kTile + i;
        if (qi >= L.Tq || kj >= L.visible(qi) || lse_s[i] == -INFINITY) continue;
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
  if (dk) store_tile(dk + k_head, dk_s, ld, kt * kTile, L.Tk, L.CK, HS, true);
  if (dv) store_tile(dv + k_head, dv_s, ld, kt * kTile, L.Tk, L.CK, HS, true);
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    block_backward_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                             const float* Dv, BlockLayout L, float scale) {
  extern __shared__ float smem[];
  const int HS = L.HS, ld = HS | 1;
  float* q_s = smem;                // [kTile][ld], row i is thread i's query
  float* do_s = q_s + kTile * ld;   // [kTile][ld]
  float* dq_s = do_s + kTile * ld;  // [kTile][ld]
  float* k_s = dq_s + kTile * ld;   // [kTile][HS], broadcast reads
  float* v_s = k_s + kTile * HS;    // [kTile][HS]
  const int qt = blockIdx.x;
  const int b = blockIdx.y / L.NH, h = blockIdx.y % L.NH;
  const int i = threadIdx.x, qi = qt * kTile + i;
  const size_t q_head = L.row(b, 0, L.Tq, h), k_head = L.krow(b, 0, L.kv_head(h));
  const int n_block = L.visible(min(qt * kTile + kTile, L.Tq) - 1);

  load_tile(q_s, ld, q + q_head, qt * kTile, L.Tq, L.C, HS);
  load_tile(do_s, ld, dout + q_head, qt * kTile, L.Tq, L.C, HS);
  for (int c = 0; c < HS; ++c) dq_s[i * ld + c] = 0.0f;
  const float lse_i = qi < L.Tq ? lse[L.l(b, h, qi)] : -INFINITY;
  const float d_i = qi < L.Tq ? Dv[L.l(b, h, qi)] : 0.0f;
  const int n_i = (qi < L.Tq && lse_i != -INFINITY) ? L.visible(qi) : 0;
  for (int kt = 0; kt * kTile < n_block; ++kt) {
    __syncthreads();
    load_tile(k_s, HS, k + k_head, kt * kTile, L.Tk, L.CK, HS);
    load_tile(v_s, HS, v + k_head, kt * kTile, L.Tk, L.CK, HS);
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const int kj = kt * kTile + j;
      if (kj >= n_i) break;  // masked, past Tk, or a row with no gradient
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
  store_tile(dq + q_head, dq_s, ld, qt * kTile, L.Tq, L.C, HS, true);
}

// One warp per (b, t, h) row of out; lanes over the head's channels.
template <typename T>
__global__ void __launch_bounds__(256)
    merge_kernel(T* out_acc, float* lse_acc, const T* out_part, const float* lse_part, int B, int T_, int NH, int HS) {
  for_each_head_row(B, T_, NH, HS, [&](size_t off, size_t li, int lane) {
    const float a = lse_acc[li], p = lse_part[li];
    __syncwarp();  // every lane has read lse_acc before lane 0 overwrites it
    const float m = fmaxf(a, p);
    if (m == -INFINITY) return;  // neither side saw a key
    const float wa = expf(a - m), wp = expf(p - m);
    const float s = wa + wp;
    const float ca = wa / s, cp = wp / s;
    for (int c = lane; c < HS; c += kWarpSize)
      out_acc[off + c] = from_float<T>(to_float(out_acc[off + c]) * ca + to_float(out_part[off + c]) * cp);
    if (lane == 0) lse_acc[li] = m + logf(s);
  });
}

// One warp per (b, t, h) row of out: the parts' weights from their lse, then lanes over the head's
// channels, each summing its channel over the parts in order (deterministic).
template <typename T>
__global__ void __launch_bounds__(256) merge_splits_kernel(T* out, float* lse, const T* parts, const float* lse_parts,
                                                           int S, int B, int T_, int NH, int HS) {
  const size_t rows = static_cast<size_t>(B) * T_ * NH, part_out = rows * HS;
  for_each_head_row(B, T_, NH, HS, [&](size_t off, size_t li, int lane) {
    float m = -INFINITY;
    for (int s = 0; s < S; ++s) m = fmaxf(m, lse_parts[s * rows + li]);
    if (m == -INFINITY) {  // no part saw a key
      for (int c = lane; c < HS; c += kWarpSize) out[off + c] = from_float<T>(0.0f);
      if (lane == 0) lse[li] = -INFINITY;
      return;
    }
    float sum = 0.0f;
    for (int s = 0; s < S; ++s) sum += expf(lse_parts[s * rows + li] - m);
    const float inv = 1.0f / sum;
    for (int c = lane; c < HS; c += kWarpSize) {
      float acc = 0.0f;
      for (int s = 0; s < S; ++s) acc += expf(lse_parts[s * rows + li] - m) * to_float(parts[s * part_out + off + c]);
      out[off + c] = from_float<T>(acc * inv);
    }
    if (lane == 0) lse[li] = m + logf(sum);
  });
}

template <typename K>
void set_shared(K kernel, size_t bytes, int HS) {
  use_dynamic_shared(kernel, bytes,
                     [&] { return "attention_block: head size " + std::to_string(HS) + " in the CUDA-core kernels"; });
}

dim3 block_grid(int B, int T, int NH) {
  const long long bh = static_cast<long long>(B) * NH;
  check(bh <= 65535, "attention_block: B * n_heads = " + std::to_string(bh) + " exceeds the grid's y limit 65535");
  return dim3(static_cast<unsigned>(ceil_div(T, kTile)), static_cast<unsigned>(bh));
}

BlockLayout make_block_layout(int B, int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal) {
  check(NKV > 0 && NH % NKV == 0, "attention_block: n_kv_heads must divide n_heads");
  return BlockLayout{B, Tq, Tk, NH, NKV, HS, NH * HS, NKV * HS, q_pos0, k_pos0, causal};
}

}  // namespace

void attention_block_forward_tiled(DType dtype, void* out, float* lse, const void* q, const void* k, const void* v,
                                   int B, int Tq, int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                   void* stream) {
  if (B <= 0 || Tq <= 0) return;
  const BlockLayout L = make_block_layout(B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal);
  const size_t ld = HS | 1;
  const size_t smem = (2 * kTile * ld + 2 * size_t(kTile) * HS) * sizeof(float);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  dispatch_act("attention_block_forward", dtype, [&](auto tag) {
    using E = decltype(tag);
    set_shared(block_forward_kernel<E>, smem, HS);
    block_forward_kernel<E><<<block_grid(B, Tq, NH), kTile, smem, as_stream(stream)>>>(
        static_cast<E*>(out), lse, static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v), L,
        scale);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_block_backward_tiled(DType dtype, void* dq, void* dk, void* dv, const void* dout, const void* q,
                                    const void* k, const void* v, const float* lse, const float* D, int B, int Tq,
                                    int Tk, int NH, int NKV, int HS, int q_pos0, int k_pos0, bool causal,
                                    void* stream) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return;
  const BlockLayout L = make_block_layout(B, Tq, Tk, NH, NKV, HS, q_pos0, k_pos0, causal);
  const size_t ld = HS | 1;
  const size_t smem_kv = (4 * kTile * ld + 2 * size_t(kTile) * HS + 2 * kTile) * sizeof(float);
  const size_t smem_q = (3 * kTile * ld + 2 * size_t(kTile) * HS) * sizeof(float);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  dispatch_act("attention_block_backward", dtype, [&](auto tag) {
    using E = decltype(tag);
    const E* dy = static_cast<const E*>(dout);
    const E* qp = static_cast<const E*>(q);
    const E* kp = static_cast<const E*>(k);
    const E* vp = static_cast<const E*>(v);
    if (dk || dv) {
      set_shared(block_backward_dkdv_kernel<E>, smem_kv, HS);
      block_backward_dkdv_kernel<E><<<block_grid(B, Tk, NKV), kTile, smem_kv, as_stream(stream)>>>(
          static_cast<E*>(dk), static_cast<E*>(dv), dy, qp, kp, vp, lse, D, L, scale);
      CUDA_CHECK_LAUNCH();
    }
    if (dq) {
      set_shared(block_backward_dq_kernel<E>, smem_q, HS);
      block_backward_dq_kernel<E><<<block_grid(B, Tq, NH), kTile, smem_q, as_stream(stream)>>>(
          static_cast<E*>(dq), dy, qp, kp, vp, lse, D, L, scale);
      CUDA_CHECK_LAUNCH();
    }
  });
}

void merge_attention_partials_gpu(DType dtype, void* out_acc, float* lse_acc, const void* out_part,
                                  const float* lse_part, int B, int T, int NH, int HS, void* stream) {
  if (B <= 0 || T <= 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  dispatch_act("merge_attention_partials", dtype, [&](auto tag) {
    using E = decltype(tag);
    merge_kernel<E><<<grid_stride_blocks(rows, 256 / kWarpSize), 256, 0, as_stream(stream)>>>(
        static_cast<E*>(out_acc), lse_acc, static_cast<const E*>(out_part), lse_part, B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
  });
}

void merge_attention_splits_gpu(DType dtype, void* out, float* lse, const void* parts, const float* lse_parts, int S,
                                int B, int T, int NH, int HS, void* stream) {
  if (B <= 0 || T <= 0) return;
  const size_t rows = static_cast<size_t>(B) * T * NH;
  dispatch_act("merge_attention_splits", dtype, [&](auto tag) {
    using E = decltype(tag);
    merge_splits_kernel<E><<<grid_stride_blocks(rows, 256 / kWarpSize), 256, 0, as_stream(stream)>>>(
        static_cast<E*>(out), lse, static_cast<const E*>(parts), lse_parts, S, B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
