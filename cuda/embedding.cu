// Token and position embeddings (GPT-2's wte and wpe), forward and deterministic backward.
//
// Computes
//   embedding_forward:  out[n, :] = wte[tokens[n] - vocab_start, :]  (0 outside this vocab shard)
//   position_forward:   out[b, t, :] += wpe[pos[t], :]
//   embedding_backward: dwte[tokens[n] - vocab_start, :] += dout[n, :]
//   position_backward:  dwpe[pos[t], :] += sum_b dout[b, t, :]
//
// Algorithm.
//  - Forwards: a grid-stride copy (add) over 16-byte chunks of the rows (scalar when C is not
//    a multiple of the chunk or a pointer is misaligned).
//  - embedding_backward is a scatter-add in which a token that repeats hits the same table
//    row; instead of float atomics (whose order, and so whose rounding, changes from run to
//    run) the (row, n) pairs are sorted by row with CUB's radix sort, which is stable: equal
//    rows keep n ascending. One block per sorted position then checks whether it starts a run
//    of equal rows, and if so sums the run's dout rows in that order (fp32 registers, one
//    channel per thread, the channels split over gridDim.y) and adds the sum to the table row
//    once. Tokens outside the shard get a sentinel key that sorts last and is skipped. The sort
//    runs over only the bits the row index needs. Bitwise deterministic.
//    Cost: the sort (~5 passes over 8N bytes) is small next to reading dout (N*C*s) and the
//    read-modify-write of the touched rows (<= 2*N*C*g); a token repeated k times is summed by
//    one block column, so a heavily repeated token serialises k row reads (fine for text).
//  - position_backward: one block per (t, channel slice); the block of the first t holding a
//    position sums every t' holding it (ascending) and every b, then adds once. Positions are
//    distinct in practice (0..T-1, or a zigzag permutation under context parallelism), so the
//    duplicate scan is O(T) cached reads per block.
//
// Memory traffic (s = activation bytes, g = gradient bytes):
//   embedding_forward N*C*2s, position_forward B*T*C*3s (+ wpe, L2-resident),
//   embedding_backward N*C*(s + 2g) at most, position_backward B*T*C*s + 2*T*C*g.
// GPT-2 124M, B*T = 8192, C = 768, bf16 activations / fp32 gradients: embedding_backward
// ~62 MB (~19 us at 3.35 TB/s) plus the sort.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_common.h"
#include "cuda/embedding.h"

namespace pt::gpu {

namespace {

constexpr int kBlock = 256;

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

// key[n] = the local table row of token n, or `sentinel` (= vocab_local, sorts last) outside the shard.
__global__ void __launch_bounds__(kBlock) make_sort_pairs_kernel(uint32_t* keys, int32_t* values,
                                                                 const int32_t* tokens, int N, int vocab_start,
                                                                 int vocab_local) {
  const int n = blockIdx.x * kBlock + threadIdx.x;
  if (n >= N) return;
  const long long row = static_cast<long long>(tokens[n]) - vocab_start;
  keys[n] = row >= 0 && row < vocab_local ? static_cast<uint32_t>(row) : static_cast<uint32_t>(vocab_local);
  values[n] = n;
}

// Block (p, y): if sorted position p starts a run of equal keys, adds the run's dout rows (in
// sorted order, which is n ascending) to the table row, for channels [y*kBlock, (y+1)*kBlock).
template <typename T, typename G>
__global__ void __launch_bounds__(kBlock) embedding_backward_kernel(G* dwte, const T* dout, const uint32_t* keys,
                                                                    const int32_t* rows, int N, int C,
                                                                    uint32_t sentinel) {
  const int p = blockIdx.x;
  const uint32_t key = keys[p];
  if (key == sentinel || (p > 0 && keys[p - 1] == key)) return;  // out of shard, or not a run start
  const int c = blockIdx.y * kBlock + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int q = p; q < N && keys[q] == key; ++q) acc += to_float(dout[static_cast<size_t>(rows[q]) * C + c]);
  G* dst = dwte + static_cast<size_t>(key) * C + c;
  *dst = from_float<G>(to_float(*dst) + acc);
}

template <typename T, typename G>
__global__ void __launch_bounds__(kBlock) position_backward_kernel(G* dwpe, const T* dout, const int32_t* pos, int B,
                                                                   int T_, int C, int wpe_rows) {
  const int t0 = blockIdx.x;
  const int p = pos[t0];
  if (p < 0 || p >= wpe_rows) return;
  for (int t = 0; t < t0; ++t)
    if (pos[t] == p) return;  // an earlier t owns this table row
  const int c = blockIdx.y * kBlock + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int t = t0; t < T_; ++t) {
    if (pos[t] != p) continue;
    for (int b = 0; b < B; ++b) acc += to_float(dout[(static_cast<size_t>(b) * T_ + t) * C + c]);
  }
  G* dst = dwpe + static_cast<size_t>(p) * C + c;
  *dst = from_float<G>(to_float(*dst) + acc);
}

// Bits the sort must look at: enough for keys 0..vocab_local (the sentinel included).
int key_bits(int vocab_local) {
  int bits = 1;
  while (bits < 32 && (static_cast<uint32_t>(vocab_local) >> bits) != 0) ++bits;
  return bits;
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// CUB's temporary storage for sorting N pairs (a host-side query; nothing is launched).
size_t cub_temp_bytes(int N, int vocab_local) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), N, 0, key_bits(vocab_local)));
  return bytes;
}

template <typename T>
bool vec_ok(int C, std::initializer_list<const void*> ptrs) {
  if (C % (16 / sizeof(T)) != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned(p, 16)) return false;
  return true;
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
    if (vec_ok<T>(C, {out, wte}))
      embedding_forward_kernel<T, V><<<grid_stride_blocks(size_t(N) * C / V, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, tokens, w, N, C, vocab_start, vocab_local);
    else
      embedding_forward_kernel<T, 1><<<grid_stride_blocks(size_t(N) * C, kBlock), kBlock, 0, as_stream(stream)>>>(
          o, tokens, w, N, C, vocab_start, vocab_local);
    CUDA_CHECK_LAUNCH();
  });
}

size_t embedding_backward_scratch_bytes(int N, int vocab_local) {
  if (N <= 0) return 0;
  return 4 * align_up(size_t(N) * 4) + align_up(cub_temp_bytes(N, vocab_local));
}

void embedding_backward(DType dtype, DType grad_dtype, void* dwte, const void* dout, const int32_t* tokens, int N,
                        int C, int vocab_start, int vocab_local, void* scratch, size_t scratch_bytes, void* stream) {
  if (N <= 0 || C <= 0 || vocab_local <= 0) return;
  check(scratch_bytes >= embedding_backward_scratch_bytes(N, vocab_local), "embedding_backward: scratch too small");
  cudaStream_t s = as_stream(stream);
  char* base = static_cast<char*>(scratch);
  const size_t slot = align_up(size_t(N) * 4);
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(base);
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(base + slot);
  int32_t* vals_in = reinterpret_cast<int32_t*>(base + 2 * slot);
  int32_t* vals_out = reinterpret_cast<int32_t*>(base + 3 * slot);
  void* temp = base + 4 * slot;
  size_t temp_bytes = cub_temp_bytes(N, vocab_local);

  make_sort_pairs_kernel<<<ceil_div(N, kBlock), kBlock, 0, s>>>(keys_in, vals_in, tokens, N, vocab_start, vocab_local);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, N, 0,
                                             key_bits(vocab_local), s));
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(ceil_div(C, kBlock)));
  dispatch_act_grad("embedding_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using T = decltype(act);
    using G = decltype(grad);
    embedding_backward_kernel<T, G><<<grid, kBlock, 0, s>>>(static_cast<G*>(dwte), static_cast<const T*>(dout),
                                                            keys_out, vals_out, N, C,
                                                            static_cast<uint32_t>(vocab_local));
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
    if (vec_ok<E>(C, {out, wpe}))
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
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(ceil_div(C, kBlock)));
  dispatch_act_grad("position_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using E = decltype(act);
    using G = decltype(grad);
    position_backward_kernel<E, G><<<grid, kBlock, 0, as_stream(stream)>>>(
        static_cast<G*>(dwpe), static_cast<const E*>(dout), pos, B, T, C, wpe_rows);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
