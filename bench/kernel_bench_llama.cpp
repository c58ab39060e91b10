// kernel_bench's Llama rows: the memory-bound ops a Llama block adds to GPT-2's (RMSNorm with and
// without its residual add, RoPE, SwiGLU), forward and backward, at Llama 3.2 1B's shapes (d 2048,
// 32 query heads and 8 key/value heads of 64, FFN 8192) and B*T = rows, as
// core/model/decoder_stage.cpp calls them. Work is the bytes each call must move at the least;
// the rows are judged against the copy bandwidth like the model table's (not part of its step).
#include <string>
#include <vector>

#include "bench/kernel_bench.h"

namespace pt::kernel_bench {

void bench_llama_ops(Bench& b, Ops& ops, int rows, int T) {
  const std::string sec = "llama-1b";
  const int N = rows, C = 2048, NH = 32, NKV = 8, HS = 64, H = 8192, B = rows / T;
  const int W = (NH + 2 * NKV) * HS, rot = NH + NKV;
  const DType bf = ops.compute_dtype(), f32 = DType::f32;
  const double s = static_cast<double>(dtype_size(bf)), NC = double(N) * C;
  const std::string nshape = "N=" + std::to_string(N) + " C=" + std::to_string(C);
  Buffers buf(ops);

  // ---- RMSNorm: out = w * x * rstd; backward ACCUMULATES dinp and dw (f32).
  {
    Tensor x = buf.rand(size_t(NC), bf, 1), a = buf.rand(size_t(NC), bf, 1), res = buf.zeros(size_t(NC), bf);
    Tensor w = buf.rand(C, bf, 1), out = buf.zeros(size_t(NC), bf), rstd = buf.zeros(N, f32);
    Tensor dout = buf.rand(size_t(NC), bf, 1), dx = buf.zeros(size_t(NC), bf), dw = buf.zeros(C, f32);
    b.run({sec, "rmsnorm_forward", nshape, false, NC * 2 * s + 4.0 * N + C * s, "N*C*2s + 4N + Cs"},
          [&] { ops.rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f); });
    b.run({sec, "residual_rmsnorm_forward", nshape, false, NC * 4 * s + 4.0 * N + C * s, "N*C*4s + 4N + Cs"},
          [&] { ops.residual_rmsnorm_forward(res, out, rstd, a, x, w, N, C, 1e-5f); });
    b.run({sec, "rmsnorm_backward", nshape, false, NC * 4 * s + 4.0 * N + C * (s + 8), "N*C*4s + 4N + C(s + 8)"},
          [&] { ops.rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C); });
  }
  // ---- RoPE, in place on the q and k heads of the packed rows (v untouched).
  {
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; t++) pos[t] = t;
    Tensor qkv = buf.rand(size_t(N) * W, bf, 1), p = buf.ints(pos);
    const double bytes = 2.0 * N * rot * HS * s;
    const std::string shape = "N=" + std::to_string(N) + " heads=" + std::to_string(rot) + " hd=" + std::to_string(HS);
    b.run({sec, "rope_forward", shape, false, bytes, "2*N*(NH+NKV)*hd*s"},
          [&] { ops.rope_forward(qkv, p, B, T, W, rot, HS, 500000.0f); });
    b.run({sec, "rope_backward", shape, false, bytes, "2*N*(NH+NKV)*hd*s"},
          [&] { ops.rope_backward(qkv, p, B, T, W, rot, HS, 500000.0f); });
  }
  // ---- SwiGLU on the fused gate|up projection.
  {
    const double nh = double(N) * H;
    Tensor gu = buf.rand(size_t(N) * 2 * H, bf, 2), y = buf.zeros(size_t(nh), bf), dy = buf.rand(size_t(nh), bf, 1);
    Tensor dgu = buf.zeros(size_t(N) * 2 * H, bf);
    const std::string shape = "N=" + std::to_string(N) + " H=" + std::to_string(H);
    b.run({sec, "swiglu_forward", shape, false, 3 * nh * s, "3*N*H*s"}, [&] { ops.swiglu_forward(y, gu, N, H); });
    b.run({sec, "swiglu_backward", shape, false, 5 * nh * s, "5*N*H*s (gate_up, dout, dgate_up)"},
          [&] { ops.swiglu_backward(dgu, gu, dy, N, H); });
  }
}

}  // namespace pt::kernel_bench
