// The token embedding's backward (GPT-2's wte, Llama's embed_tokens): a deterministic scatter-add.
//
// Computes dwte[tokens[n] - vocab_start, :] += dout[n, :] for the tokens in this vocabulary shard.
//
// A scatter-add in which many rows hit one table row (a token repeats). Float atomics would make
// the order of the adds, and so the rounding, change from run to run; instead each table row's sum
// is formed in an order fixed by the shapes and the token values alone, then added to the table
// once. No float atomics: bitwise deterministic.
//
// Algorithm: a counting sort of the tokens by table row in two kernels, then one add per
// touched row. The table rows are dealt into `buckets` (a power of two <= 512) by their low bits,
// so the frequent tokens (small ids in GPT-2's BPE) spread over the buckets.
//  1. partition: block i of ceil(N / tile) counts all N tokens per bucket in shared memory
//     (integer counts: the same in every block, whatever the order), so it knows where each bucket
//     starts and how many of its tokens come before tile i; its first warp then places the tile's
//     (row, n) pairs, n ascending, at their bucket's place. A stable sort by bucket with no global
//     atomics and no zeroed memory.
//  2. gather: one block per bucket groups the bucket's pairs by row the same way in shared memory
//     (<= 512 rows per bucket), each row's n's ascending. A row hit <= 32 times is one work item:
//     a warp sums its dout rows in n order (a 16-byte chunk per lane at a time, its dwte values
//     and two rows' loads in flight together) and adds the sum to dwte once (one rounding).
//     A row hit more often is cut into pieces of 32 hits that the block's warps sum into fp32
//     partials (scratch, L2-resident); after a barrier one warp adds a row's pieces in order and
//     updates dwte once. All of one bucket runs in one block, so a very frequent token (a few % of
//     the batch: real text, not the benchmark's uniformly random tokens) is summed at one block's
//     pace (16 warps, two rows' loads in flight per lane: tens of GB/s) and can outlast the rest.
//  Tokens outside the shard are dropped in step 1. Grids: ceil(N / tile) <= 128 partition blocks
//  (tile >= 512 tokens) and one gather block per bucket, 512 threads each.
//
// Memory traffic, the floor (s = activation bytes, g = gradient bytes, U = distinct in-shard tokens):
//   N*C*s + 2*U*C*g (+ L2-resident: ~24 bytes of sorted pairs per token, the 4N bytes of tokens
//   each partition block reads, and 8*C bytes of partials per 32 hits of a row hit more than 32
//   times). GPT-2 124M at B*T = 65536, C = 768, bf16 dout / fp32 gradients: ~326 MB for uniformly
//   random tokens (U ~ 36.6K, 77 us at 4.2 TB/s); GPT-2 1.5B at B*T = 8192, C = 1600: ~123 MB (29 us).
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/embedding.h"

namespace pt::gpu {

namespace {

constexpr int kSortThreads = 512;         // both kernels
constexpr int kMaxBuckets = 512;          // a power of two, <= kSortThreads (one bucket per thread in a scan)
constexpr int kMaxBins = kSortThreads;    // table rows per bucket (one per thread in a scan)
constexpr int kMinTile = 512;             // tokens a partition block places
constexpr int kMaxTiles = 128;            // partition blocks (each one counts all N tokens)
constexpr int kPieceRows = kWarpSize;     // dout rows in one work item: one row index per lane
// A row hit h > kPieceRows times has ceil(h / kPieceRows) <= floor(h / kPartialSpacing) pieces, so
// a bucket starting at sorted position `start` with `size` tokens has at most size / kPartialSpacing
// partial rows: they can start at row start / kPartialSpacing without reaching the next bucket's,
// and N / kPartialSpacing + 1 rows hold them all.
constexpr int kPartialSpacing = kPieceRows / 2;

// VEC consecutive elements of S as loaded: 16-byte accesses (VEC = 1: one scalar; the address is
// 16-byte aligned otherwise). Kept as raw words until summed: 8 bf16 take 4 registers, not 8 floats.
template <typename S, int VEC>
struct Chunk {
  static_assert(VEC == 1 || VEC * sizeof(S) % 16 == 0, "VEC elements must be whole 16-byte accesses");
  using Word = std::conditional_t<VEC == 1, S, int4>;
  static constexpr int kWords = VEC == 1 ? 1 : VEC * sizeof(S) / 16;
  Word word[kWords];
  __device__ __forceinline__ float operator[](int k) const { return to_float(reinterpret_cast<const S*>(word)[k]); }
};

template <int VEC, typename S>
__device__ __forceinline__ Chunk<S, VEC> load_chunk(const S* p) {
  Chunk<S, VEC> c;
  const auto* words = reinterpret_cast<const typename Chunk<S, VEC>::Word*>(p);
#pragma unroll
  for (int a = 0; a < Chunk<S, VEC>::kWords; ++a) c.word[a] = words[a];
  return c;
}

template <int VEC, typename S>
__device__ __forceinline__ void store_chunk(S* p, const float (&x)[VEC]) {
  constexpr int kPer = VEC == 1 ? 1 : 16 / static_cast<int>(sizeof(S));  // elements per access
#pragma unroll
  for (int a = 0; a < VEC / kPer; ++a) {
    Packed<S, kPer> v;
#pragma unroll
    for (int k = 0; k < kPer; ++k) v.v[k] = from_float<S>(x[a * kPer + k]);
    store_packed<S, kPer>(p + a * kPer, v);
  }
}

__device__ __forceinline__ int local_row(int32_t token, int vocab_start, int vocab_local) {
  const long long row = static_cast<long long>(token) - vocab_start;
  return row >= 0 && row < vocab_local ? static_cast<int>(row) : -1;
}

// How many lanes of the warp hold this lane's bin, told to the lowest of them (0 to the others and
// for bin -1): one shared-memory atomic per distinct bin, where a frequent token would otherwise
// serialise 32 atomics on one address.
__device__ __forceinline__ int warp_tally(int bin) {
  const unsigned same = __match_any_sync(0xffffffffu, bin);
  return bin >= 0 && static_cast<int>(threadIdx.x % kWarpSize) == __ffs(same) - 1 ? __popc(same) : 0;
}

// Stable counting placement by one warp: the lanes hold 32 consecutive items (lane order = item
// order), each in a bin (-1: no item); cursor[bin] (shared) is where the bin's next item goes.
// Returns this lane's slot (-1 for no item) and moves the cursors past the 32 items.
__device__ __forceinline__ int warp_place(int bin, int* cursor) {
  const int lane = threadIdx.x % kWarpSize;
  const unsigned same = __match_any_sync(0xffffffffu, bin);
  const int earlier = __popc(same & ((1u << lane) - 1u));
  const int slot = bin >= 0 ? cursor[bin] + earlier : -1;
  __syncwarp();
  if (bin >= 0 && earlier == __popc(same) - 1) cursor[bin] = slot + 1;
  __syncwarp();
  return slot;
}

// Step 1 (see the header). Block i places tokens [i*tile, (i+1)*tile); every block writes the same
// bucket_start/bucket_size, block 0 stores them.
__global__ void __launch_bounds__(kSortThreads)
    partition_kernel(int* sorted_row, int* sorted_n, int* bucket_start, int* bucket_size, const int32_t* tokens, int N,
                     int vocab_start, int vocab_local, int bucket_bits, int tile) {
  using Scan = cub::BlockScan<int, kSortThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int total[kMaxBuckets], before[kMaxBuckets], cursor[kMaxBuckets];
  const int buckets = 1 << bucket_bits, lane = threadIdx.x % kWarpSize;
  const int t0 = blockIdx.x * tile, t1 = min(N, t0 + tile);
  if (threadIdx.x < buckets) total[threadIdx.x] = before[threadIdx.x] = 0;
  __syncthreads();
  for (int n0 = threadIdx.x - lane; n0 < N; n0 += kSortThreads) {  // a warp takes 32 consecutive tokens
    const int row = n0 + lane < N ? local_row(tokens[n0 + lane], vocab_start, vocab_local) : -1;
    const int bucket = row >= 0 ? row & (buckets - 1) : -1;
    if (const int k = warp_tally(bucket)) {
      atomicAdd(&total[bucket], k);
      if (n0 < t0) atomicAdd(&before[bucket], k);  // t0 is a multiple of 32: all 32 tokens are before, or none
    }
  }
  __syncthreads();
  const int b = threadIdx.x;
  int start;
  Scan(scan).ExclusiveSum(b < buckets ? total[b] : 0, start);
  if (b < buckets) {
    cursor[b] = start + before[b];
    if (blockIdx.x == 0) {
      bucket_start[b] = start;
      bucket_size[b] = total[b];
    }
  }
  __syncthreads();
  if (threadIdx.x >= kWarpSize) return;
  for (int n0 = t0; n0 < t1; n0 += kWarpSize) {
    const int n = n0 + lane;
    const int row = n < t1 ? local_row(tokens[n], vocab_start, vocab_local) : -1;
    const int slot = warp_place(row >= 0 ? row & (buckets - 1) : -1, cursor);
    if (slot >= 0) {
      sorted_row[slot] = row;
      sorted_n[slot] = n;
    }
  }
}

// Where a bucket's table row (bin) begins in the bucket's three sequences.
struct BinOffsets {
  int hit;      // its n's, grouped by row
  int item;     // its work items (pieces of <= kPieceRows hits)
  int partial;  // its fp32 partial rows (rows hit more than kPieceRows times)
};

struct AddBinOffsets {
  __device__ BinOffsets operator()(const BinOffsets& a, const BinOffsets& b) const {
    return {a.hit + b.hit, a.item + b.item, a.partial + b.partial};
  }
};

// The bin holding work item `item`: the last with first[bin].item <= item (a bin with no hits has no
// items, and the offset of the bin after it).
__device__ __forceinline__ int bin_of_item(const BinOffsets* first, int bins, int item) {
  int lo = 0, hi = bins - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid].item <= item)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// dst[c] (+)= sum over r = 0, 1, ..., rows-1 (in that order) of row(r)[c] for a [C] row dst:
// kAdd adds the sum to dst (one rounding; dst's old values are loaded with the first rows, so
// they are in flight together), else stores it. Lane l takes chunks l, l+32, ... of VEC columns,
// kRows rows' loads in flight (more spill at the kernel's 64 registers). Called by a whole warp
// (row may shuffle).
template <int VEC, bool kAdd, typename RowPtr, typename D>
__device__ __forceinline__ void warp_sum_rows(int C, int rows, RowPtr row, D* dst) {
  constexpr int kRows = 2;
  using S = std::remove_const_t<std::remove_pointer_t<decltype(row(0))>>;
  const int lane = threadIdx.x % kWarpSize, chunks = C / VEC;
  for (int q0 = 0; q0 < chunks; q0 += kWarpSize) {
    const int q = q0 + lane;
    const bool mine = q < chunks;
    Chunk<D, VEC> old;
    if (kAdd && mine) old = load_chunk<VEC>(dst + q * VEC);
    float acc[VEC] = {};
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      Chunk<S, VEC> v[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const S* src = row(min(r0 + u, rows - 1));
        if (mine && r0 + u < rows) v[u] = load_chunk<VEC>(src + q * VEC);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u)
        if (mine && r0 + u < rows)
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += v[u][k];
    }
    if (!mine) continue;
    if (kAdd)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += old[k];
    store_chunk<VEC>(dst + q * VEC, acc);
  }
}

// Step 2 (see the header): block = bucket. At most 64 registers: 2 blocks per SM.
template <typename T, typename G, int VEC>
__global__ void __launch_bounds__(kSortThreads, 2)
    gather_kernel(G* __restrict__ dwte, const T* __restrict__ dout, const int* sorted_row, const int* sorted_n,
                  int* grouped_n, float* __restrict__ partials, const int* bucket_start, const int* bucket_size, int C,
                  int vocab_local, int bucket_bits) {
  constexpr int kWarps = kSortThreads / kWarpSize;
  using Scan = cub::BlockScan<BinOffsets, kSortThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int hits[kMaxBins], cursor[kMaxBins];
  __shared__ BinOffsets first[kMaxBins];
  const int bucket = blockIdx.x, size = bucket_size[bucket];
  if (size == 0) return;
  const int start = bucket_start[bucket];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int bins = ((vocab_local - 1 - bucket) >> bucket_bits) + 1;  // rows bucket + bin * buckets < vocab_local
  const auto table_row = [&](int bin) { return dwte + ((static_cast<size_t>(bin) << bucket_bits) + bucket) * C; };

  // Hits per row, then each row's offsets.
  if (threadIdx.x < bins) hits[threadIdx.x] = 0;
  __syncthreads();
  for (int i0 = threadIdx.x - lane; i0 < size; i0 += kSortThreads) {
    const int bin = i0 + lane < size ? sorted_row[start + i0 + lane] >> bucket_bits : -1;
    if (const int k = warp_tally(bin)) atomicAdd(&hits[bin], k);
  }
  __syncthreads();
  const int h = threadIdx.x < bins ? hits[threadIdx.x] : 0, pieces = ceil_div(h, kPieceRows);
  BinOffsets mine_first, all;
  Scan(scan).ExclusiveScan(BinOffsets{h, pieces, h > kPieceRows ? pieces : 0}, mine_first, BinOffsets{0, 0, 0},
                           AddBinOffsets{}, all);
  if (threadIdx.x < bins) {
    first[threadIdx.x] = mine_first;
    cursor[threadIdx.x] = mine_first.hit;
  }
  __syncthreads();

  // Warp 0 groups the bucket's n's by row, each row's n's ascending (they arrive in n order).
  if (warp == 0) {
    for (int i0 = 0; i0 < size; i0 += kWarpSize) {
      const int i = i0 + lane;
      const int slot = warp_place(i < size ? sorted_row[start + i] >> bucket_bits : -1, cursor);
      if (slot >= 0) grouped_n[start + slot] = sorted_n[start + i];
    }
  }
  __syncthreads();

  // Work items: a row hit <= kPieceRows times is summed and added to the table at once; a piece of a
  // row hit more often goes to its partial row.
  float* bucket_partials = partials + static_cast<size_t>(start / kPartialSpacing) * C;
  for (int item = warp; item < all.item; item += kWarps) {
    const int bin = bin_of_item(first, bins, item), piece = item - first[bin].item;
    const int rows = min(kPieceRows, hits[bin] - piece * kPieceRows);
    const int my_n = lane < rows ? grouped_n[start + first[bin].hit + piece * kPieceRows + lane] : 0;
    const auto dout_row = [&](int r) { return dout + static_cast<size_t>(__shfl_sync(0xffffffffu, my_n, r)) * C; };
    if (hits[bin] <= kPieceRows)
      warp_sum_rows<VEC, true>(C, rows, dout_row, table_row(bin));
    else
      warp_sum_rows<VEC, false>(C, rows, dout_row,
                                bucket_partials + static_cast<size_t>(first[bin].partial + piece) * C);
  }
  if (all.partial == 0) return;
  __syncthreads();  // the partials are written

  // Rows hit more than kPieceRows times: their pieces in order, then one add to the table.
  for (int bin = warp; bin < bins; bin += kWarps) {
    if (hits[bin] <= kPieceRows) continue;
    const float* src = bucket_partials + static_cast<size_t>(first[bin].partial) * C;
    warp_sum_rows<VEC, true>(
        C, ceil_div(hits[bin], kPieceRows), [&](int r) { return src + static_cast<size_t>(r) * C; }, table_row(bin));
  }
}

// How embedding_backward cuts its work: table rows dealt into 2^bucket_bits buckets by their low
// bits, tokens in tiles of `tile` (a multiple of 32) for the partition.
struct SortShape {
  int bucket_bits = 0, tile = 0, tiles = 0;
  SortShape(int N, int vocab_local) {
    while ((1 << bucket_bits) < kMaxBuckets && (1 << bucket_bits) < vocab_local) ++bucket_bits;
    tile = std::max(kMinTile, ceil_div(ceil_div(N, kMaxTiles), kWarpSize) * kWarpSize);
    tiles = ceil_div(N, tile);
  }
  int buckets() const { return 1 << bucket_bits; }
};

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

// Byte offsets of embedding_backward's scratch parts, and its size.
struct SortScratch {
  size_t sorted_row, sorted_n, grouped_n, bucket_start, bucket_size, partials, bytes;
  SortScratch(int N, int C, int buckets) {
    size_t at = 0;
    const auto take = [&](size_t bytes) {
      const size_t here = at;
      at += align_up(bytes);
      return here;
    };
    sorted_row = take(size_t(N) * 4);
    sorted_n = take(size_t(N) * 4);
    grouped_n = take(size_t(N) * 4);
    bucket_start = take(size_t(buckets) * 4);
    bucket_size = take(size_t(buckets) * 4);
    partials = take((size_t(N) / kPartialSpacing + 1) * C * sizeof(float));
    bytes = at;
  }
};

}  // namespace

size_t embedding_backward_scratch_bytes(int N, int C, int vocab_local) {
  if (N <= 0 || C <= 0 || vocab_local <= 0) return 0;
  return SortScratch(N, C, SortShape(N, vocab_local).buckets()).bytes;
}

void embedding_backward(DType dtype, DType grad_dtype, void* dwte, const void* dout, const int32_t* tokens, int N,
                        int C, int vocab_start, int vocab_local, void* scratch, size_t scratch_bytes, void* stream) {
  if (N <= 0 || C <= 0 || vocab_local <= 0) return;
  check_act_grad("embedding_backward", dtype, grad_dtype);
  check(vocab_local <= kMaxBuckets * kMaxBins, "embedding_backward: vocab_local " + std::to_string(vocab_local) +
                                                   " is above the " + std::to_string(kMaxBuckets * kMaxBins) +
                                                   " rows the sort handles (shard the vocabulary)");
  check(scratch_bytes >= embedding_backward_scratch_bytes(N, C, vocab_local), "embedding_backward: scratch too small");
  const SortShape shape(N, vocab_local);
  const SortScratch parts(N, C, shape.buckets());
  char* base = static_cast<char*>(scratch);
  int* sorted_row = reinterpret_cast<int*>(base + parts.sorted_row);
  int* sorted_n = reinterpret_cast<int*>(base + parts.sorted_n);
  int* bucket_start = reinterpret_cast<int*>(base + parts.bucket_start);
  int* bucket_size = reinterpret_cast<int*>(base + parts.bucket_size);
  cudaStream_t s = as_stream(stream);

  partition_kernel<<<shape.tiles, kSortThreads, 0, s>>>(sorted_row, sorted_n, bucket_start, bucket_size, tokens, N,
                                                        vocab_start, vocab_local, shape.bucket_bits, shape.tile);
  CUDA_CHECK_LAUNCH();
  dispatch_act_grad("embedding_backward", dtype, grad_dtype, [&](auto act, auto grad) {
    using T = decltype(act);
    using G = decltype(grad);
    const auto launch = [&](auto kernel) {
      kernel<<<shape.buckets(), kSortThreads, 0, s>>>(
          static_cast<G*>(dwte), static_cast<const T*>(dout), sorted_row, sorted_n,
          reinterpret_cast<int*>(base + parts.grouped_n), reinterpret_cast<float*>(base + parts.partials),
          bucket_start, bucket_size, C, vocab_local, shape.bucket_bits);
    };
    if (vec16_ok<T>(C, {dout, dwte}))
      launch(gather_kernel<T, G, 16 / sizeof(T)>);
    else
      launch(gather_kernel<T, G, 1>);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pt::gpu
