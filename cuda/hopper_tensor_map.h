// TMA tensor maps (host side) for the Hopper flash attention kernels (flash_attention_*_sm90.cu):
// a bf16 [B][T][W] activation (qkv, dout) as a 3-D tensor read in boxes of 64 columns x box_rows
// rows x 1 sequence, in the 128-byte swizzle wgmma's shared-memory operands use (hopper.cuh).
// Rows past T (the last tile of a sequence) read as zeros, never the next sequence's rows.
#pragma once
#include <cuda.h>

#include <cstddef>

namespace pt::gpu {

// The box's width: 64 bf16 columns, one 128-byte swizzled row.
constexpr int kTmaBoxCols = 64;

// Needs base 16-byte aligned and W a multiple of 8 (the row stride a multiple of 16 bytes), as the
// flash kernels' callers check; box_rows at most 256.
CUtensorMap rows_tensor_map(const void* base, int B, int T, size_t W, int box_rows);

}  // namespace pt::gpu
