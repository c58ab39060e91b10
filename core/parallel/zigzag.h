// How a context-parallel group of cp ranks splits a sequence of T tokens.
//
// Ring attention (cp_impl=ring) uses the ZIGZAG split: the sequence is cut into 2*cp equal
// chunks and rank r holds chunks r and 2*cp-1-r, in that order. Under a causal mask the work of
// a query chunk grows with its index, so pairing an early chunk with a late one gives every rank
// the same attention work (the plain split would leave rank cp-1 with ~2x the average).
// Ulysses (cp_impl=ulysses) uses the CONTIGUOUS split: rank r holds tokens
// [r*T/cp, (r+1)*T/cp); its all-to-all hands every rank the whole sequence for its heads, so
// the work is balanced either way, and gathering the rank order back is the sequence order.
//
// A rank's tokens are a [B, T_local] array: for each batch row, its chunks' tokens in the order
// above (so position_forward takes positions(rank), T_local of them, shared by the batch rows).
// take/put move token-shaped data ([B, T, width] arrays: token ids, targets, or any per-token
// vector) between the global and the local layout on the host.
#pragma once
#include <cstdint>
#include <vector>

#include "core/common/error.h"

namespace pt {

enum class CpSplitKind { zigzag, contiguous };

class CpSplit {
 public:
  // Throws when T is not a multiple of the chunk count (2*cp for zigzag, cp for contiguous).
  // With cp == 1 there is nothing to split: the split is contiguous whatever `kind` says.
  CpSplit(CpSplitKind kind, int T, int cp);

  CpSplitKind kind() const { return kind_; }
  int seq_len() const { return T_; }
  int ranks() const { return cp_; }
  int local_len() const { return T_ / cp_; }
  // Tokens per chunk: T/(2cp) for zigzag, T/cp for contiguous.
  int chunk_len() const { return T_ / chunks_per_rank() / cp_; }
  int chunks_per_rank() const { return kind_ == CpSplitKind::zigzag ? 2 : 1; }
  // The global chunk indices rank r holds, in local order: {r, 2cp-1-r} or {r}.
  std::vector<int> chunks(int rank) const;
  // The global position of each of rank r's local tokens (local_len() of them).
  std::vector<int32_t> positions(int rank) const;

  // local [B, local_len, width] <- rank r's tokens of global [B, T, width].
  template <class E>
  std::vector<E> take(const std::vector<E>& global, int B, int rank, int width = 1) const {
    check(global.size() == size_t(B) * T_ * width, "CpSplit::take: the global array does not hold B*T*width elements");
    std::vector<E> local(size_t(B) * local_len() * width);
    const std::vector<int32_t> pos = positions(rank);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < local_len(); t++)
        for (int w = 0; w < width; w++)
          local[(size_t(b) * local_len() + t) * width + w] = global[(size_t(b) * T_ + pos[t]) * width + w];
    return local;
  }
  // global [B, T, width] <- rank r's local [B, local_len, width] (its tokens only).
  template <class E>
  void put(std::vector<E>& global, const std::vector<E>& local, int B, int rank, int width = 1) const {
    check(global.size() == size_t(B) * T_ * width && local.size() == size_t(B) * local_len() * width,
          "CpSplit::put: array sizes do not match B, T and width");
    const std::vector<int32_t> pos = positions(rank);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < local_len(); t++)
        for (int w = 0; w < width; w++)
          global[(size_t(b) * T_ + pos[t]) * width + w] = local[(size_t(b) * local_len() + t) * width + w];
  }

 private:
  CpSplitKind kind_;
  int T_, cp_;
};

}  // namespace pt
