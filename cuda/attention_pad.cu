// Head padding for the flash attention kernels, which are built for head sizes 64 and 128 (and 256
// on Hopper): a head of another size that is a multiple of 8 up to 128 (256) runs on them
// zero-padded (CudaOps' attention_forward and attention_backward copy q, k, v (and dout) into
// padded heads, run the kernel with the head's own softmax scale, and copy out (and dqkv) back).
//
// Computes dst [rows][heads][dst_hs] from src [rows][heads][src_hs] (bf16): each head's first
// min(src_hs, dst_hs) channels copied, the rest of dst's set to 0. Both head sizes are multiples of
// 8, so each thread moves one 16-byte chunk (8 channels) in a grid-stride loop over dst's chunks,
// the chunk fastest (a warp reads and writes whole heads, coalesced).
// Bytes: read rows * heads * min(src_hs, dst_hs) * 2, write rows * heads * dst_hs * 2; memory-bound,
// O(T HS) against attention's O(T^2 HS): at B*T = 8k tokens, 48 heads of 96 padded to 128, 25 MB
// read and 34 MB written, ~18 us at 3.35 TB/s (H100 SXM).
// Deterministic: each element is written by one thread.
#include <string>

#include "cuda/attention.h"
#include "cuda/cuda_common.h"

namespace pt::gpu {

namespace {

constexpr int kChunk = 8;  // bf16 channels in 16 bytes

__global__ void copy_heads_kernel(uint4* dst, int dst_chunks, const uint4* src, int src_chunks, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t head = i / dst_chunks;
    const int c = static_cast<int>(i % dst_chunks);
    dst[i] = c < src_chunks ? src[head * src_chunks + c] : make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

int flash_padded_head_size(int HS, bool hopper) {
  if (HS <= 0 || HS % kChunk != 0) return 0;
  return HS <= 64 ? 64 : HS <= 128 ? 128 : HS <= 256 && hopper ? 256 : 0;
}

bool flash_hopper_head_sizes() { return flash_sm90_available() && uses_sm90_kernel(flash_backward_path()); }

void copy_heads_bf16(void* dst, int dst_hs, const void* src, int src_hs, size_t rows, int heads, void* stream) {
  check(dst_hs > 0 && src_hs > 0 && dst_hs % kChunk == 0 && src_hs % kChunk == 0,
        "copy_heads_bf16: head sizes " + std::to_string(src_hs) + " -> " + std::to_string(dst_hs) +
            " must be positive multiples of 8");
  check(is_aligned(dst, 16) && is_aligned(src, 16), "copy_heads_bf16: needs 16-byte aligned tensors");
  const size_t n = rows * static_cast<size_t>(heads) * (dst_hs / kChunk);
  if (n == 0) return;
  constexpr int kThreads = 256;
  copy_heads_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, as_stream(stream)>>>(
      static_cast<uint4*>(dst), dst_hs / kChunk, static_cast<const uint4*>(src), src_hs / kChunk, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pt::gpu
