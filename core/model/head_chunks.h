// How many rows of a micro-batch the LM head computes at once. The head's logits are [N, Vl]
// (N tokens, this rank's vocabulary rows): 6.6 GB in bf16 for GPT-2 124M at B 64 x T 1024, and
// 4.2 GB for a Llama 3 vocabulary at 8 x 2048 tokens. DecoderStage runs the head in chunks of
// rows instead (matmul, cross-entropy with its gradient in place, the head's backward; then the
// next chunk: TensorParallel::column_chunked), so only one chunk's logits exist: at most
// kHeadChunkBytes, the memory plan's count. The price is one more read-modify-write of the
// head's fp32 weight gradient per extra chunk (154 MB at GPT-2 124M, ~40 us on an H100/H200,
// against ~1.2 ms of matmul per 5248-row chunk).
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt {

// The default budget of one chunk's logits: 512 MiB (GPT-2 124M's B 64 x T 1024 runs in
// 5248-row chunks, 6.1 GB below the whole logits).
constexpr size_t kHeadChunkBytes = size_t(512) << 20;

// Rows per chunk for N rows of Vl logits in `act`: as many whole multiples of 64 rows as fit in
// the budget (at least 64), all N when they fit.
int head_chunk_rows(int N, int Vl, DType act);

// Test hook (never a config key): a smaller budget makes small models run in several chunks;
// 0 restores kHeadChunkBytes. Read at stage construction and by the memory plan.
void set_head_chunk_bytes_for_tests(size_t bytes);

}  // namespace pt
