// Building blocks of the Hopper (sm_90a) flash attention (flash_attention_forward_sm90.cu,
// flash_attention_backward_sm90.cu), as inline PTX: warpgroup matrix products (wgmma) with
// shared-memory matrix descriptors, mbarriers, TMA tile copies (cp.async.bulk.tensor), named
// barriers and register reallocation between warpgroups (setmaxnreg). Device code only, and only
// where __CUDA_ARCH_FEAT_SM90_ALL is defined (an sm_90a compile): every caller guards its use
// with PT_HOPPER_DEVICE.
//
// wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): the 128 threads of
// a warpgroup (4 consecutive warps, the first a multiple of 4) compute D (64 x N, fp32) += A (64 x
// 16) B (16 x N) together. B is always in shared memory, A in shared memory or registers. The
// fp32 accumulators of warp w (of the warpgroup) are rows 16 w + g and 16 w + g + 8 (g = lane / 4,
// t = lane % 4), in the mma.sync m16n8 C layout repeated along N: d[j][0..1] = (row g, columns
// 8 j + 2 t, +1), d[j][2..3] = (row g + 8, same columns). An A operand from registers has the
// mma.sync m16n8k16 A layout per warp, so two adjacent accumulator groups rounded to bf16 are an
// A fragment (flash::acc_to_a), as in the sm_80 kernels. The product is asynchronous: fence
// before (wgmma_fence: the registers it reads are written), commit a group after, and wait for
// it before the accumulators are read (wgmma_wait<N>: at most N groups still in flight).
//
// Shared-memory operands, all in the 128-byte swizzle that TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B: a tile is stored as sub-tiles of 64 bf16 columns (128 bytes a row),
// each [rows][64], 1024-byte aligned, and within each 8-row group (1024 bytes) the 16-byte chunk c
// of row r sits at chunk c ^ (r % 8). The descriptor (64 bits) gives the start address, the
// "leading" and "stride" byte offsets (in 16-byte units) and the swizzle mode:
//  - K-major (the 16 reduced columns contiguous: Q and K in Q K^T): 8-row groups SBO = 1024 bytes
//    apart; LBO unused (16 columns lie within one 128-byte row); the k-th 16-column step starts
//    32 k bytes further within the sub-tile, the next 64 columns in the next sub-tile;
//  - MN-major (the N columns contiguous: V [keys][HS] in P V, wgmma's transposed B, trans-b 1):
//    N runs along the 128-byte rows, 64 columns per sub-tile, sub-tiles LBO bytes apart; the
//    reduced dimension (keys) runs down the rows, 8-row groups SBO = 1024 bytes apart; the k-th
//    16-key step starts 16 rows (2048 bytes) further.
//
// mbarrier + TMA: a producer thread arms a barrier with the bytes it expects
// (mbar_arrive_expect_tx) and starts the copies that count against it (tma_load_3d); a consumer
// waits for the barrier's phase (mbar_wait(bar, parity), parity = the use count's low bit).
// Consumers free a buffer by arriving on its "empty" barrier; the producer waits for that before
// it overwrites the buffer.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.h"
#include "cuda/hopper_tensor_map.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PT_HOPPER_DEVICE 1
#else
#define PT_HOPPER_DEVICE 0
#endif

namespace pt::gpu::hopper {

// The warp-specialised arrangement of both attention kernels: a producer warpgroup that gives
// its registers to two consumer warpgroups (setmaxnreg), and tiles stored as sub-tiles of 64 bf16
// columns, one 128-byte swizzled row each (one TMA box's width, hopper_tensor_map.h).
constexpr int kWarpgroup = 128;
constexpr int kConsumers = 2;                                 // consumer warpgroups
constexpr int kThreads = (kConsumers + 1) * kWarpgroup;       // + the producer warpgroup
constexpr int kProducerRegs = 24, kConsumerRegs = 240;        // 128 x 24 + 256 x 240 <= 65,536
constexpr int kSwizzleCols = kTmaBoxCols;                     // bf16 columns of a sub-tile row
constexpr int kSwizzleRowBytes = 128;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory's first 1024-byte aligned byte (the 128-byte swizzle's sub-tiles are
// 1024-byte aligned; a kernel asks for 1 KiB more than its layout to have room for this).
__device__ __forceinline__ unsigned char* aligned_1024(unsigned char* raw) {
  return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

// ---- matrix descriptors ---------------------------------------------------------------------

// A 128-byte-swizzled operand starting at shared address `addr` (16-byte aligned; its sub-tile
// 1024-byte aligned), byte offsets as above.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);               // bits 0-13: start address
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;      // bits 16-29: leading byte offset
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;      // bits 32-45: stride byte offset
  d |= static_cast<uint64_t>(1) << 62;                              // bits 62-63: 1 = 128-byte swizzle
  return d;                                                         // bits 49-51 (base offset): 0
}

// ---- wgmma ------------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulators across a fence or wait: the
// asynchronous product uses the registers without the compiler seeing it.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R][4]) {
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// The same for an A operand in registers: kept alive (unmoved, not reused) until the wait.
template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[R][4]) {
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

// The three products the attention forward needs, each written out in full (PTX names every
// accumulator register): D (+)= A B with accumulate = 0 overwriting D.
//  - _ss: A and B both K-major in shared memory (S = Q K^T);
//  - _rs_tb: A from registers, B MN-major in shared memory (O += P V).
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// S^T = K Q^T, dP^T = V dO^T and dQ = dS K in the backward (flash_attention_backward_sm90.cu): A
// and B both from shared memory, N = 64, each operand K-major (TA, TB = 0) or MN-major (1: A's M,
// B's N contiguous along the 128-byte rows, as V is in the forward's P V).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}

// ---- warpgroup barriers and proxies -----------------------------------------------------------

// A barrier of `threads` threads (a multiple of 32: whole warps) under hardware barrier `id`
// (1-15; 0 is __syncthreads'), with __syncthreads' memory ordering among them: what a
// participant wrote before it is seen by every participant after it.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Orders this thread's ordinary shared-memory writes before later reads of them by the async
// proxy (wgmma's shared-memory operands, TMA): a writer runs it before the barrier the readers
// wait on.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- mbarrier ---------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) and the other threads; a
// __syncthreads follows.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar))
               : "memory");
}
// One arrival that also says `bytes` more will be written by copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase with this parity has completed. A wait of more than about ten
// seconds (2^34 SM cycles) traps instead: a copy that never completes its bytes, or an arrival
// count that is never reached, fails the kernel with a launch error rather than hanging the
// process (and a whole GPU session's time limit with it). The loop is PTX, labels scoped by the
// braces: written as a C++ loop (with clock64 and __trap) it made ptxas keep fewer registers for
// wgmma's accumulators across it, and the backward spilled hundreds of bytes at head size 128.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done, late;\n"
      ".reg .u64 t0, t1;\n"
      "mov.u64 t0, %%clock64;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@done bra DONE;\n"
      "mov.u64 t1, %%clock64;\n"
      "sub.u64 t1, t1, t0;\n"
      "setp.gt.u64 late, t1, 17179869184;\n"  // 2^34 cycles
      "@late trap;\n"
      "bra WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA --------------------------------------------------------------------------------------

// Copies the box at coordinates (c0 innermost, c1, c2) of the tensor `map` describes into shared
// memory at dst (1024-byte aligned for the 128-byte swizzle), completing `bar`'s expected bytes.
// Box elements outside the tensor arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
// Fetches the tensor map's 128 bytes ahead of the first copy that reads it.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- register reallocation between warpgroups -------------------------------------------------

// The warpgroup gives up registers down to N per thread (the producer) or takes them up to N (the
// consumers); every thread of the warpgroup executes it.
template <int N>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace pt::gpu::hopper
