// Token and position embeddings (GPT-2's wte and wpe): the forwards and the position backward.
//
// Computes
//   embedding_forward:  out[n, :] = wte[tokens[n] - vocab_start, :]  (0 outside this vocab shard)
//   position_forward:   out[b, t, :] += wpe[pos[t], :]
//   position_backward:  dwpe[pos[t], :] += sum_b dout[b, t, :]
//
// Forwards: a grid-stride copy (add) over 16-byte chunks of the rows (scalar when C is not a
// multiple of the chunk or a pointer is misaligned).
//
// position_backward is a scatter-add in which many rows hit one table row (the B rows of the
// batch share a position, which may itself repeat in pos). Float atomics would make the order of
// the adds, and so the rounding, change from run to run; instead each table row's sum is formed in
// an order fixed by the shapes and the position values alone, then added to the table once. No
// float atomics: bitwise deterministic.
//
// position_backward: dout is B contiguous [T*C] slabs, so element e of the flat T*C range sums
// dout[b*T*C + e] over b. A block takes a tile of consecutive elements; its 256 threads are
// `lanes` x 256/lanes, lanes = the largest power of two <= 8 that leaves each lane >= 8 b's (a
// function of B alone). Thread (lane, col) sums b = lane, lane + lanes, ... of the tile's 16-byte
// chunk col, 4 independent 16-byte loads in flight; the lane sums meet in shared memory, are added
// in lane order and then to dwpe[pos[t]] (coalesced, all old values in flight before the stores).
// Grid: T*C / tile blocks (GPT-2 124M at B = 64, T = 1024: lanes = 8, 3072 tiles of 256 elements;
// 1.5B at B = 8: lanes = 1, 800 tiles of 2048). Each block also checks whether a position of its
// tile occurs at another t (pos is a few KB, L1-resident); only then (never in training: positions
// are 0..T-1, or a zigzag permutation under context parallelism) the first t holding a position
// also adds the later t's holding it (t ascending, b ascending), and the others skip it.
//
// embedding_backward, the token table's scatter-add, is cuda/embedding_backward.cu.
//
// Memory traffic, the floor (s = activation bytes, g = gradient bytes):
//   embedding_forward N*C*2s, position_forward B*T*C*3s (+ wpe, L2-resident),
//   position_backward B*T*C*s + 2*T*C*g.
// GPT-2 124M at B*T = 65536, C = 768, bf16 activations / fp32 gradients: position_backward
// 107 MB (25 us at 4.2 TB/s). GPT-2 1.5B at B*T = 8192, C = 1600: 39 MB (9 us).
#include <algorithm>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/embedding.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;

// ---- forwards ---------------------------------------------------------------------------------------

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte,
                                                                   int N, int C, int vocab_start, int vocab_local) {
  const int chunks = C / VEC;  // VEC divides C
  const size_t total = static_cast<size_t>(N) * chunks;
  const size_t stride = static_cast<size_t>(gridDim.x) * kBlock;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * kBlock + threadIdx.x; idx < total; idx += stride) {
    const size_t n = idx / chunks;
    const int c = static_cast<int>(idx % chunks) * VEC;
    const long long row = static_cast<long long>(tokens[n]) - vocab_start;
    Packed<T, VEC> v;
    if (row >= 0 && row < vocab_local) {
      v = load_packed<T, VEC>(wte + row * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v.v[k] = from_float<T>(0.0f);
    }
    store_packed<T, VEC>(out + n * C + c, v);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kBlock) position_forward_kernel(T* out, const T* wpe, const int32_t* pos, int B,
                                                                  int T_, int C, int wpe_rows) {
  const int chunks = C / VEC;
  const size_t total = static_cast<size_t>(B) * T_ * chunks;
  const size_t stride = static_cast<size_t>(gridDim.x) * kBlock;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * kBlock + threadIdx.x; idx < total; idx += stride) {
    const size_t r = idx / chunks;  // row (b, t) in memory order
    const int c = static_cast<int>(idx % chunks) * VEC;
    const int p = pos[r % T_];
    Packed<T, VEC> o = load_packed<T, VEC>(out + r * C + c);
    if (p >= 0 && p < wpe_rows) {
      Packed<T, VEC> w = load_packed<T, VEC>(wpe + static_cast<size_t>(p) * C + c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(to_float(o.v[k]) + to_float(w.v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) o.v[k] = from_float<T>(NAN);
    }
    store_packed<T, VEC>(out + r * C + c, o);
  }
}

// ---- position_backward -------------------------------------------------------------------------------

constexpr int kBatch = 4;     // 16-byte loads of dout a thread has in flight (8 would spill at 64 registers)
constexpr int kLaneRows = 8;  // b's per lane at least, when B allows

// For a t whose position also occurs at another t: false when an earlier t holds it (that t adds
// this one's sums); otherwise adds to s the sums over b of the later t's holding it (t, then b
// ascending). Only tiles with repeated positions come here.
template <typename T>
__device__ __forceinline__ bool add_repeats(float& s, const T* dout, const int32_t* pos, int B, int T_, int C, int t,
                                            int c) {
  const int p = pos[t];
  for (int u = 0; u < t; ++u)
    if (pos[u] == p) return false;
  for (int u = t + 1; u < T_; ++u) {
    if (pos[u] != p) continue;
    for (int b = 0; b < B; ++b) s += to_float(dout[(static_cast<size_t>(b) * T_ + u) * C + c]);
  }
  return true;
}

// Block x: elements [x*tile, (x+1)*tile) of the flat T*C range, tile = (kBlock >> lane_bits) * VEC.
// At most 64 registers: 4 blocks per SM.
template <typename T, typename G, int VEC>
__global__ void __launch_bounds__(kBlock, 4)
    position_backward_kernel(G* __restrict__ dwpe, const T* __restrict__ dout, const int32_t* __restrict__ pos, int B,
                             int T_, int C, int wpe_rows, int lane_bits) {
  __shared__ float lane_sums[kBlock * VEC];  // [lane][tile element]
  const int lanes = 1 << lane_bits, cols = kBlock >> lane_bits, tile = cols * VEC;
  const size_t TC = static_cast<size_t>(T_) * C, e0 = static_cast<size_t>(blockIdx.x) * tile;
  const size_t e_end = e0 + tile < TC ? e0 + tile : TC;
  const int t_lo = static_cast<int>(e0 / C), t_hi = static_cast<int>((e_end - 1) / C);

  // Does a position of this tile occur at another t too?
  bool repeated = false;
  for (int u = threadIdx.x; u < T_; u += kBlock) {
    const int p = pos[u];
    for (int t = t_lo; t <= t_hi; ++t) repeated |= u != t && pos[t] == p;
  }

  // Thread (lane, col) sums b = lane, lane + lanes, ... of chunk col, kBatch loads at a time.
  const int lane = threadIdx.x / cols, col = threadIdx.x % cols;
  const size_t e = e0 + static_cast<size_t>(col) * VEC;
  float acc[VEC] = {};
  if (e < TC) {
    for (int b0 = lane; b0 < B; b0 += kBatch * lanes) {
      Packed<T, VEC> v[kBatch];  // raw, converted after all loads are issued: half the registers of floats
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (b0 + u * lanes < B) v[u] = load_packed<T, VEC>(dout + static_cast<size_t>(b0 + u * lanes) * TC + e);
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (b0 + u * lanes < B)
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += to_float(v[u].v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) lane_sums[lane * tile + col * VEC + k] = acc[k];
  repeated = __syncthreads_or(repeated);

  // Element j of the tile: its lane sums in lane order (s), and the table element they go to (null:
  // none); t and c are its place in dout.
  const auto element = [&](int j, float& s, int& t, int& c) -> G* {
    if (j >= tile || e0 + j >= TC) return nullptr;
    t = static_cast<int>((e0 + j) / C);
    c = static_cast<int>((e0 + j) % C);
    const int p = pos[t];
    if (p < 0 || p >= wpe_rows) return nullptr;
    s = 0.0f;
    for (int l = 0; l < lanes; ++l) s += lane_sums[l * tile + j];
    return dwpe + static_cast<size_t>(p) * C + c;
  };
  if (repeated) {  // rare: one element at a time
    for (int j = threadIdx.x; j < tile; j += kBlock) {
      float s;
      int t, c;
      G* dst = element(j, s, t, c);
      if (dst && add_repeats(s, dout, pos, B, T_, C, t, c)) *dst = from_float<G>(to_float(*dst) + s);
    }
    return;
  }
  // Elements threadIdx.x + k*kBlock: every old value is loaded before the first store, so the
  // loads are in flight together.
  float sum[VEC];
  G* dst[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    int t, c;
    dst[k] = element(threadIdx.x + k * kBlock, sum[k], t, c);
  }
  float old[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k)
    if (dst[k]) old[k] = to_float(*dst[k]);
#pragma unroll
  for (int k = 0; k < VEC; ++k)
    if (dst[k]) *dst[k] = from_float<G>(old[k] + sum[k]);
}

}  // namespace

void embedding_forward(DType dtype, void* out, const int32_t* tokens, const void* wte, int N, int C, int vocab_start,
                       int vocab_local, void* stream) {
  if (N <= 0 || C <= 0) return;
  dispatch_act("embedding_forward", dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    T* o = static_cast<T*>(out);
    const T* w = static_cast<const T*>(wte);
    if (vec16_ok<T>(C, {out, wte}))
      embedding_forward_kernel<T, V><<<grid_stride_blocks(size_t(N) * C / V, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, tokens, w, N, C, vocab_start, vocab_local);
    else
      embedding_forward_kernel<T, 1><<<grid_stride_blocks(size_t(N) * C, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, tokens, w, N, C, vocab_start, vocab_local);
    CUDA_CHECK_LAUNCH();
  });
}

void position_forward(DType dtype, void* out, const void* wpe, const int32_t* pos, int B, int T, int C, int wpe_rows,
                      void* stream) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  dispatch_act("position_forward", dtype, [&](auto tag) {
    using E = decltype(tag);
    constexpr int V = 16 / sizeof(E);
    E* o = static_cast<E*>(out);
    const E* w = static_cast<const E*>(wpe);
    const size_t n = size_t(B) * T * C;
    if (vec16_ok<E>(C, {out, wpe}))
      position_forward_kernel<E, V><<<grid_stride_blocks(n / V, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, w, pos, B, T, C, wpe_rows);
    else
      position_forward_kernel<E, 1><<<grid_stride_blocks(n, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, w, pos, B, T, C, wpe_rows);
    CUDA_CHECK_LAUNCH();
  });
}

void position_backward(DType dtype, DType grad_dtype, void* dwpe, const void* dout, const int32_t* pos, int B, int T,
                       int C, int wpe_rows, void* stream) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  // lanes = 2^lane_bits <= 8, each with at least kLaneRows b's when B allows: from B alone, so the
  // summation order is a function of the shape.
  int lane_bits = 0;
  while (lane_bits < 3 && (kLaneRows << (lane_bits + 1)) <= B) ++lane_bits;
  dispatch_act_grad("position_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using E = decltype(act);
    using G = decltype(grad);
    const auto launch = [&](auto kernel, int vec) {
      const size_t tile = static_cast<size_t>(kBlock >> lane_bits) * vec;
      const unsigned blocks = static_cast<unsigned>(ceil_div(size_t(T) * C, tile));
      kernel<<<blocks, kBlock, 0, as_stream(stream)>>>(static_cast<G*>(dwpe), static_cast<const E*>(dout), pos, B, T,
                                                       C, wpe_rows, lane_bits);
    };
    constexpr int V = 16 / sizeof(E);
    if (vec16_ok<E>(C, {dout}))
      launch(position_backward_kernel<E, G, V>, V);
    else
      launch(position_backward_kernel<E, G, 1>, 1);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
