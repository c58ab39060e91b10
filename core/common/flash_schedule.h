// Which tiles of a block of attention meet, for the flash kernels (cuda/flash_attention_forward.cu,
// cuda/flash_attention_backward.cu), written once on the host and the device so that a CPU test
// (test_flash_schedule) proves the schedule the kernels follow: which key tiles a query tile
// visits, in which order the key blocks add a query tile's dQ, and how a KV cache's keys split
// over blocks.
//
// The problem (cuda/flash_attention_mma.cuh, FlashProblem): Tq queries, Tk keys, query i sees key
// j iff j <= i + delta and j < Tk (-Tq <= delta <= Tk; causal self-attention: delta = 0, Tq =
// Tk). Queries go in tiles of BM rows, keys in tiles of BN; the arithmetic is C++'s (truncating)
// integer arithmetic, exactly as the kernels do it.
#pragma once

#if defined(__CUDACC__)
#define PT_FLASH_FN __host__ __device__ __forceinline__
#else
#define PT_FLASH_FN inline
#endif

namespace pt::flash_schedule {

// Forward: the key tiles [0, n) the query tile starting at row q0 visits (those holding a key its
// last row sees); n <= 0 when none (a row that sees no key gets out 0 and lse -inf).
PT_FLASH_FN int forward_key_tiles(int q0, int BM, int Tq, int Tk, int delta, int BN) {
  const int rows_end = q0 + BM < Tq ? q0 + BM : Tq;
  const int keys_end = rows_end + delta < Tk ? rows_end + delta : Tk;
  return (keys_end + BN - 1) / BN;
}

// Backward (delta >= 0): the first query tile that key block kt meets, the one holding query
// kt * BN - delta (0 when that is negative). It may be past the last query tile: then the key
// block meets no query.
PT_FLASH_FN int first_query_tile(int kt, int delta, int BN, int BM) {
  const int first_query = kt * BN - delta;
  return (first_query > 0 ? first_query : 0) / BM;
}

// Backward (delta >= 0): the last of the nk key blocks that query tile qt meets. Key block kt meets
// query tile qt iff first_query_tile(kt) <= qt iff kt <= last_key_tile(qt): the key blocks that add
// into qt's dQ are exactly last_key_tile(qt), ..., 0, the order of the turn chain.
PT_FLASH_FN int last_key_tile(int qt, int delta, int nk, int BN, int BM) {
  const int last = (qt * BM + BM - 1 + delta) / BN;
  return last < nk - 1 ? last : nk - 1;
}

// The forward's split of a block's keys over blocks (flash-decoding): with fewer (query tile, b,
// head) blocks than `sms` SMs, the keys go in `count` ranges of `len` keys (whole tiles of BN),
// enough for about two blocks an SM, no range under min_keys keys, at most max_splits; else one
// range of all Tk keys. Every range holds at least one key, and together they hold the Tk keys.
struct KeySplit {
  int count, len;
};
inline KeySplit key_split(long long blocks, int Tk, int sms, int BN, int min_keys, int max_splits) {
  if (blocks <= 0 || blocks >= sms) return {1, Tk};
  long long wanted = (2LL * sms + blocks - 1) / blocks;
  if (wanted > Tk / min_keys) wanted = Tk / min_keys;
  if (wanted > max_splits) wanted = max_splits;
  if (wanted < 2) return {1, Tk};
  const int per_split = (Tk + static_cast<int>(wanted) - 1) / static_cast<int>(wanted);
  const int len = (per_split + BN - 1) / BN * BN;
  return {(Tk + len - 1) / len, len};
}

}  // namespace pt::flash_schedule
