// TpSlice: where a tensor-parallel rank's piece of a parameter lies in the whole (global)
// parameter, so that initialisation, checkpoints and weight gathering can address every element
// by its global index whatever the tp degree.
//
// The global tensor is viewed as [outer, split, inner] and split along the middle dimension:
// rank r of `parts` holds [outer, split/parts, inner], the middle indices
// [r*split/parts, (r+1)*split/parts), as a contiguous tensor of its own.
//   column-parallel weight [OC, IC]: outer 1 (3 for the fused q|k|v, so each rank holds its
//     heads' q, k and v rows), split OC/outer, inner IC; its bias the same with inner 1;
//   row-parallel weight [OC, IC]: outer OC, split IC, inner 1 (a rank holds columns);
//   vocab-parallel embedding [Vp, C]: outer 1, split Vp, inner C;
//   replicated: parts 1 (the whole tensor, local index = global index).
// A rank's local elements therefore form `outer` runs of run() contiguous global elements,
// stride() apart.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/common/error.h"

namespace pt {

struct TpSlice {
  int64_t outer = 1, split = 1, inner = 1;  // the global view
  int parts = 1, rank = 0;

  bool whole() const { return parts == 1; }
  int64_t local_split() const { return split / parts; }
  // Local elements per contiguous global run, and the global distance between runs.
  size_t run() const { return static_cast<size_t>(local_split() * inner); }
  size_t stride() const { return static_cast<size_t>(split * inner); }
  // The global index of local element i.
  size_t global_index(size_t i) const {
    if (whole()) return i;
    const size_t r = run();
    return (i / r) * stride() + static_cast<size_t>(rank) * r + i % r;
  }
  // f(local_begin, global_begin, n) for each maximal piece of local [begin, end) that is
  // contiguous in the global tensor, in local order.
  template <class F>
  void for_each_run(size_t begin, size_t end, F&& f) const {
    if (whole()) {
      if (end > begin) f(begin, begin, end - begin);
      return;
    }
    const size_t r = run();
    for (size_t i = begin; i < end;) {
      const size_t n = std::min(end, (i / r + 1) * r) - i;
      f(i, global_index(i), n);
      i += n;
    }
  }
};

}  // namespace pt
