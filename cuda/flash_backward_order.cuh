// What the two flash attention backwards (flash_attention_backward.cu on sm_80+,
// flash_attention_backward_sm90.cu on Hopper) share to sum gradients across blocks in a FIXED
// order, so that every bit of dQ (and, under grouped-query attention, dK and dV) is the same on
// every run: the acquire/release turn counters, the ordered fp32 add through L2, and the layout of
// the workspace that holds the partial sums and the counters.
//
// A tile's contributors add their parts one after another: contributor `pos` waits until the
// tile's counter equals pos (acquire), adds its part to the fp32 partial sum (the first stores,
// the last writes the gradient), and sets the counter to pos + 1 (release) once every thread of
// it has written. The kernels say who the contributors are and in which order.
#pragma once
#include <cstddef>

#include "cuda/flash_attention_mma.cuh"

namespace pt::gpu::flash {

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Spins until the counter reaches `pos` (one thread of the contributor does this, then a barrier
// carries the acquire to the others). A wait of more than about ten seconds (2^34 SM cycles)
// traps, as hopper::mbar_wait does: a turn that never comes (a broken order) fails the kernel with
// a launch error instead of hanging the process. The loop is PTX (labels scoped by the braces):
// a C++ loop here cost the Hopper kernel registers around it.
__device__ __forceinline__ void spin_until(const int* turn, int pos) {
  asm volatile(
      "{\n"
      ".reg .pred wait, late;\n"
      ".reg .s32 seen;\n"
      ".reg .u64 t0, t1;\n"
      "mov.u64 t0, %%clock64;\n"
      "SPIN:\n"
      "ld.acquire.gpu.global.s32 seen, [%0];\n"
      "setp.lt.s32 wait, seen, %1;\n"
      "@!wait bra DONE;\n"
      "mov.u64 t1, %%clock64;\n"
      "sub.u64 t1, t1, t0;\n"
      "setp.gt.u64 late, t1, 17179869184;\n"  // 2^34 cycles
      "@late trap;\n"
      "bra SPIN;\n"
      "DONE:\n"
      "}\n" ::"l"(turn),
      "r"(pos)
      : "memory");
}

// out[0..1] = scale (x, y) in bf16, or out += that (accumulate: one rounding of the fp32 sum).
__device__ __forceinline__ void store_gradient(bf16* out, float x, float y, float scale, bool accumulate) {
  if (accumulate) {
    const float2 old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out));
    store_pair(out, fmaf(x, scale, old.x), fmaf(y, scale, old.y));
  } else {
    store_pair(out, x * scale, y * scale);
  }
}

// acc[i] (+)= v for one thread's pair of fp32 scratch values (first: store, no read), or, for the
// last contributor, out[i] (+)= scale * (acc + v) in bf16 (out null: not wanted). __ldcg/__stcg
// go through L2 only: another block's writes are never hidden behind a stale L1 line.
__device__ __forceinline__ void ordered_add(float* acc, bf16* out, float x, float y, bool first, bool last,
                                            float scale, bool accumulate) {
  float2 v = make_float2(x, y);
  if (!first) {
    const float2 prev = __ldcg(reinterpret_cast<const float2*>(acc));
    v.x = prev.x + v.x;
    v.y = prev.y + v.y;
  }
  if (last) {
    if (out) store_gradient(out, v.x, v.y, scale, accumulate);
  } else {
    __stcg(reinterpret_cast<float2*>(acc), v);
  }
}

// The same for four values (a 16-byte scratch chunk, an 8-byte gradient store): out[0..3] =
// scale v in bf16, or out += that ...
__device__ __forceinline__ void store_gradient4(bf16* out, float4 v, float scale, bool accumulate) {
  float4 old = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (accumulate) {
    const uint2 bits = *reinterpret_cast<const uint2*>(out);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.y));
    old = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  const __nv_bfloat162 lo = __floats2bfloat162_rn(fmaf(v.x, scale, old.x), fmaf(v.y, scale, old.y));
  const __nv_bfloat162 hi = __floats2bfloat162_rn(fmaf(v.z, scale, old.z), fmaf(v.w, scale, old.w));
  uint2 bits;
  bits.x = *reinterpret_cast<const uint32_t*>(&lo);
  bits.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = bits;
}
// ... and acc[0..3] (+)= v, or for the last contributor out[0..3] (+)= scale (acc + v).
__device__ __forceinline__ void ordered_add4(float* acc, bf16* out, float4 v, bool first, bool last, float scale,
                                             bool accumulate) {
  if (!first) {
    const float4 prev = __ldcg(reinterpret_cast<const float4*>(acc));
    v = make_float4(prev.x + v.x, prev.y + v.y, prev.z + v.z, prev.w + v.w);
  }
  if (last) {
    if (out) store_gradient4(out, v, scale, accumulate);
  } else {
    __stcg(reinterpret_cast<float4*>(acc), v);
  }
}

// ---- the workspace (host side) ----------------------------------------------------------------

// Its parts (fp32 scratch, then int counters zeroed before every launch):
//  - dQ partial sums [B*NH][ceil(Tq/BM)][BM][HS] and their turn counters
//    [B*NH][ceil(Tq/BM)][dq_turns_per_tile] (the Hopper kernel orders each 64-column part of a
//    tile on its own);
//  - under grouped-query attention, dK and dV partial sums [B*NKV][ceil(Tk/BN)][2][BN][HS] and
//    their counters [B*NKV][ceil(Tk/BN)];
//  - the ticket that hands the blocks their work.
struct BackwardWorkspace {
  size_t dq_floats, dkv_floats, dq_turns, dkv_turns;
  size_t counters() const { return dq_turns + dkv_turns + 1; }
  size_t bytes() const { return (dq_floats + dkv_floats) * sizeof(float) + counters() * sizeof(int); }
};
inline BackwardWorkspace backward_workspace(int B, int Tq, int Tk, int NH, int NKV, int HS, int BM, int BN,
                                            int dq_turns_per_tile) {
  if (B <= 0 || Tq <= 0 || Tk <= 0) return {0, 0, 0, 0};
  const size_t dq_tiles = size_t(B) * NH * ((Tq + BM - 1) / BM);
  const size_t kv_tiles = NKV < NH ? size_t(B) * NKV * ((Tk + BN - 1) / BN) : 0;
  return {dq_tiles * BM * HS, kv_tiles * 2 * BN * HS, dq_tiles * dq_turns_per_tile, kv_tiles};
}
// The parts' places in a workspace of at least ws.bytes() (16-byte aligned).
struct BackwardScratch {
  float* dq_acc;
  float* dkv_acc;
  int* dq_turns;
  int* dkv_turns;
  int* ticket;
};
inline BackwardScratch backward_scratch(void* workspace, const BackwardWorkspace& ws) {
  BackwardScratch s{};
  s.dq_acc = static_cast<float*>(workspace);
  s.dkv_acc = s.dq_acc + ws.dq_floats;
  s.dq_turns = reinterpret_cast<int*>(s.dkv_acc + ws.dkv_floats);
  s.dkv_turns = s.dq_turns + ws.dq_turns;
  s.ticket = s.dkv_turns + ws.dkv_turns;
  return s;
}

}  // namespace pt::gpu::flash
