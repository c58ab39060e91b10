#include "core/model/head_chunks.h"

#include <algorithm>

namespace pt {

namespace {
size_t g_chunk_bytes = kHeadChunkBytes;
}  // namespace

void set_head_chunk_bytes_for_tests(size_t bytes) { g_chunk_bytes = bytes > 0 ? bytes : kHeadChunkBytes; }

int head_chunk_rows(int N, int Vl, DType act) {
  const size_t row_bytes = size_t(std::max(Vl, 1)) * dtype_size(act);
  if (size_t(N) * row_bytes <= g_chunk_bytes) return N;
  const size_t rows = g_chunk_bytes / row_bytes / 64 * 64;
  return static_cast<int>(std::min<size_t>(std::max<size_t>(rows, 64), size_t(N)));
}

}  // namespace pt
