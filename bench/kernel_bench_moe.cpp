// kernel_bench's mixture-of-experts rows: a sparse block's routing and its experts' up product,
// forward and backward, as core/model/moe_layer.cpp runs them, at a small Mixtral's shapes (d
// 2048, 8 experts of width 4096, top-2; N tokens, N k routed rows): the routing plan and the
// balancing loss's sums on the device, and the up product (gate|up, [2H, C] per expert) as one
// grouped product over the device's offsets next to the per-expert matmuls it replaced (the
// offsets copied to the host, then one matmul per expert; "per expert" rows). Matmul rows are
// judged against the bf16 matmul ceiling, the routing rows against the copy bandwidth.
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "core/ops/grouped_by_group.h"

namespace pt::kernel_bench {

void bench_moe_ops(Bench& b, Ops& ops, int tokens, int C, int H, int E, int k) {
  const std::string sec = "moe";
  const int N = tokens, R = tokens * k, OC = 2 * H;
  const DType bf = ops.compute_dtype(), f32 = DType::f32, i32 = DType::i32;
  Buffers buf(ops);
  // Routed ids spread evenly over the experts (expert e takes rows [e R / E, (e + 1) R / E)).
  std::vector<int32_t> ids(static_cast<size_t>(R)), offsets(static_cast<size_t>(E) + 1);
  for (int i = 0; i < R; i++) ids[size_t(i)] = (i * 7 + i / E) % E;
  for (int e = 0; e <= E; e++) offsets[size_t(e)] = static_cast<int32_t>(size_t(e) * R / E);
  Tensor topk = buf.ints(ids), slot = buf.zeros(size_t(R), i32), route = buf.zeros(size_t(E) + 1, i32);
  Tensor probs = buf.rand(size_t(N) * E, f32, 1), sums = buf.zeros(2 * size_t(E) + 1, f32);
  const std::string rshape = "N=" + std::to_string(N) + " k=" + std::to_string(k) + " E=" + std::to_string(E);
  b.run({sec, "moe_route", rshape, false, 4.0 * R * (E + 1), "4*N*k*E (ids per expert block) + 4*N*k"},
        [&] { ops.moe_route(slot, route, topk, N, k, E); });
  b.run({sec, "moe_balance_sums", rshape, false, 4.0 * N * E, "4*N*E"},
        [&] { ops.moe_balance_sums(sums, probs, route, N, E); });

  Tensor off = buf.ints(offsets);
  Tensor x = buf.rand(size_t(R) * C, bf, 1), w = buf.rand(size_t(E) * OC * C, bf, 0.02f);
  Tensor h = buf.zeros(size_t(R) * OC, bf), dh = buf.rand(size_t(R) * OC, bf, 1);
  Tensor dx = buf.zeros(size_t(R) * C, bf), dw = buf.zeros(size_t(E) * OC * C, f32);
  const double flops = 2.0 * R * C * OC;
  const std::string mshape = "rows=" + std::to_string(R) + " C=" + std::to_string(C) + " 2H=" + std::to_string(OC) +
                             " E=" + std::to_string(E);
  // The per-expert path (CudaOps's fallback, core/ops/grouped_by_group.h): one host copy of the
  // offsets, then a matmul on each expert's rows.
  auto per_expert = [&](bool backward) {
    std::vector<int32_t> host(size_t(E) + 1);
    ops.download(host.data(), i32, off, host.size());
    const std::vector<int> rows(host.begin(), host.end());
    if (!backward) grouped_forward_by_group(ops, rows, h, x, w, C, OC);
    else grouped_backward_by_group(ops, rows, dx, dw, dh, x, w, C, OC);
  };
  b.run({sec, "expert up forward (grouped)", mshape, true, flops, "2*N*k*C*2H"},
        [&] { ops.grouped_matmul_forward(h, x, w, off, E, R, C, OC); });
  b.run({sec, "expert up forward (per expert)", mshape, true, flops, "2*N*k*C*2H"}, [&] { per_expert(false); });
  b.run({sec, "expert up backward (grouped)", mshape, true, 2 * flops, "4*N*k*C*2H (dinp + dW)"},
        [&] { ops.grouped_matmul_backward(dx, dw, dh, x, w, off, E, R, C, OC); });
  b.run({sec, "expert up backward (per expert)", mshape, true, 2 * flops, "4*N*k*C*2H (dinp + dW)"},
        [&] { per_expert(true); });
}

}  // namespace pt::kernel_bench
