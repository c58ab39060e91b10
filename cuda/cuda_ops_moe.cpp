// CudaOps's mixture-of-experts ops (see cuda_ops.h): the router and its backward, the routing plan
// and the balancing loss on the device (cuda/moe_routing.cu), the permutation of the tokens into
// the experts' rows and the weighted combination back (cuda/moe.cu), and the experts' grouped
// products (cuda/grouped_matmul.cu). Each checks its arguments (cuda_ops_args.h), then calls its
// kernels' launcher. Host code only, compiled by g++ against the CUDA runtime headers.
#include <initializer_list>
#include <string>
#include <vector>

#include "core/ops/grouped_by_group.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_ops_args.h"
#include "cuda/grouped_matmul.h"
#include "cuda/moe.h"

namespace pt {

using namespace cuda_ops_args;

// ---- router, permutation, combination ----------------------------------------------------------
// slot_of lives on the device, so that it is a permutation of [0, N k) is moe_route's promise,
// not checked here; the kernels skip a slot out of range.

void CudaOps::moe_router_forward(Tensor probs, Tensor topk_expert, Tensor topk_weight, Tensor logits, int N, int E,
                                 int k) {
  const char* op = "moe_router_forward";
  check_dims(op, {N, E, k});
  check(k >= 1 && k <= E,
        where(op) + ": top-k of " + std::to_string(k) + " from " + std::to_string(E) + " experts");
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  const DType dt = need_act(logits, NE, op, "logits");
  need(probs, NE, DType::f32, op, "probs");
  need(topk_expert, NK, DType::i32, op, "topk_expert");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  gpu::moe_router_forward(dt, static_cast<float*>(probs.data), static_cast<int32_t*>(topk_expert.data),
                          static_cast<float*>(topk_weight.data), logits.data, N, E, k, stream_);
}

void CudaOps::moe_router_backward(Tensor dlogits, Tensor probs, Tensor topk_expert, Tensor topk_weight,
                                  Tensor dtopk_weight, Tensor dprobs_all, int N, int E, int k) {
  const char* op = "moe_router_backward";
  check_dims(op, {N, E, k});
  if (!dlogits) return;
  const size_t NE = size_t(N) * E, NK = size_t(N) * k;
  const DType dt = need_act(dlogits, NE, op, "dlogits");
  need(probs, NE, DType::f32, op, "probs");
  need(topk_expert, NK, DType::i32, op, "topk_expert");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  need(dtopk_weight, NK, DType::f32, op, "dtopk_weight");
  need(dprobs_all, E, DType::f32, op, "dprobs_all");
  gpu::moe_router_backward(dt, dlogits.data, static_cast<const float*>(probs.data),
                           static_cast<const int32_t*>(topk_expert.data), static_cast<const float*>(topk_weight.data),
                           static_cast<const float*>(dtopk_weight.data), static_cast<const float*>(dprobs_all.data), N,
                           E, k, stream_);
}

void CudaOps::moe_permute(Tensor out, Tensor x, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_permute";
  check_dims(op, {N, C, k});
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(x, NC, op, "x");
  need(out, NC * k, dt, op, "out");
  need(slot_of, size_t(N) * k, DType::i32, op, "slot_of");
  gpu::moe_permute(dt, out.data, x.data, static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_permute_backward(Tensor dx, Tensor dout, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_permute_backward";
  check_dims(op, {N, C, k});
  if (!dx) return;
  const size_t NC = size_t(N) * C;
  const DType dt = need_act(dx, NC, op, "dx");
  need(dout, NC * k, dt, op, "dout");
  need(slot_of, size_t(N) * k, DType::i32, op, "slot_of");
  gpu::moe_permute_backward(dt, dx.data, dout.data, static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_combine(Tensor y, Tensor expert_out, Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_combine";
  check_dims(op, {N, C, k});
  const size_t NC = size_t(N) * C, NK = size_t(N) * k;
  const DType dt = need_act(y, NC, op, "y");
  need(expert_out, NK * C, dt, op, "expert_out");
  need(topk_weight, NK, DType::f32, op, "topk_weight");
  need(slot_of, NK, DType::i32, op, "slot_of");
  gpu::moe_combine(dt, y.data, expert_out.data, static_cast<const float*>(topk_weight.data),
                   static_cast<const int32_t*>(slot_of.data), N, C, k, stream_);
}

void CudaOps::moe_combine_backward(Tensor dexpert_out, Tensor dtopk_weight, Tensor dy, Tensor expert_out,
                                   Tensor topk_weight, Tensor slot_of, int N, int C, int k) {
  const char* op = "moe_combine_backward";
  check_dims(op, {N, C, k});
  if (!dexpert_out && !dtopk_weight) return;
  const size_t NC = size_t(N) * C, NK = size_t(N) * k;
  const DType dt = need_act(dy, NC, op, "dy");
  need(slot_of, NK, DType::i32, op, "slot_of");
  if (dexpert_out) {
    need(dexpert_out, NK * C, dt, op, "dexpert_out");
    need(topk_weight, NK, DType::f32, op, "topk_weight");
  }
  if (dtopk_weight) {
    need(dtopk_weight, NK, DType::f32, op, "dtopk_weight");
    need(expert_out, NK * C, dt, op, "expert_out");
  }
  gpu::moe_combine_backward(dt, dexpert_out.data, static_cast<float*>(dtopk_weight.data), dy.data, expert_out.data,
                            static_cast<const float*>(topk_weight.data), static_cast<const int32_t*>(slot_of.data), N,
                            C, k, stream_);
}

// ---- the routing plan and the balancing loss -----------------------------------------------------

void CudaOps::moe_route(Tensor slot_of, Tensor offsets, Tensor topk_expert, int N, int k, int E) {
  const char* op = "moe_route";
  check_dims(op, {N, k, E});
  const size_t NK = size_t(N) * k;
  need(topk_expert, NK, DType::i32, op, "topk_expert");
  need(slot_of, NK, DType::i32, op, "slot_of");
  need(offsets, size_t(E) + 1, DType::i32, op, "offsets");
  gpu::moe_route(static_cast<int32_t*>(slot_of.data), static_cast<int32_t*>(offsets.data),
                 static_cast<const int32_t*>(topk_expert.data), N, k, E, stream_);
}

void CudaOps::moe_balance_sums(Tensor sums, Tensor probs, Tensor offsets, int N, int E) {
  const char* op = "moe_balance_sums";
  check_dims(op, {N, E});
  need(sums, 2 * size_t(E) + 1, DType::f32, op, "sums");
  need(probs, size_t(N) * E, DType::f32, op, "probs");
  need(offsets, size_t(E) + 1, DType::i32, op, "offsets");
  gpu::moe_balance_sums(static_cast<float*>(sums.data), static_cast<const float*>(probs.data),
                        static_cast<const int32_t*>(offsets.data), N, E, stream_);
}

void CudaOps::moe_balance_loss(Tensor dprobs_all, Tensor stats, Tensor sums, int E, int k, float aux_weight) {
  const char* op = "moe_balance_loss";
  check_dims(op, {E, k});
  need(dprobs_all, size_t(E), DType::f32, op, "dprobs_all");
  need(sums, 2 * size_t(E) + 1, DType::f32, op, "sums");
  if (stats) need(stats, 2, DType::f32, op, "stats");
  gpu::moe_balance_loss(static_cast<float*>(dprobs_all.data), static_cast<float*>(stats.data),
                        static_cast<const float*>(sums.data), E, k, aux_weight, stream_);
}

// ---- grouped products ------------------------------------------------------------------------------
// bf16 with IC and OC multiples of 8 and aligned operands: the tensor-core kernels, which read the
// offsets on the device. Otherwise (f32, the reference dtype; odd widths) the groups run one by
// one as matmuls, after one copy of the offsets to the host; so too with PICOTRAIN_GROUPED_MATMUL=0.

namespace {
// Whether the tensor-core kernels take the product: its shape (gpu::grouped_matmul_fits) and every
// operand 16-byte aligned (a parameter tensor inside a larger buffer may not be).
bool tensor_cores_take(DType dt, int G, int IC, int OC, std::initializer_list<Tensor> operands) {
  if (!gpu::grouped_matmul_fits(dt, G, IC, OC)) return false;
  for (const Tensor& t : operands)
    if (t && !is_aligned(t.data, 16)) return false;
  return true;
}

// The offsets [G + 1] on the host, checked: the per-group path's (one synchronising copy).
std::vector<int> host_group_offsets(Ops& ops, Tensor offsets, int G, int rows, const char* op) {
  std::vector<int32_t> host(size_t(G) + 1);
  ops.download(host.data(), DType::i32, offsets, host.size());
  return checked_group_offsets(host.data(), G, rows, where(op));
}
}  // namespace

void CudaOps::grouped_matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets, int G, int rows, int IC,
                                     int OC) {
  const char* op = "grouped_matmul_forward";
  check_dims(op, {G, rows, IC, OC});
  const DType dt = need_act(inp, size_t(rows) * IC, op, "inp");
  need(out, size_t(rows) * OC, dt, op, "out");
  need(weight, size_t(G) * OC * IC, dt, op, "weight");
  need(offsets, size_t(G) + 1, DType::i32, op, "offsets");
  if (grouped_kernels_ && tensor_cores_take(dt, G, IC, OC, {out, inp, weight})) {
    gpu::grouped_matmul_forward(out.data, inp.data, weight.data, static_cast<const int32_t*>(offsets.data), G, rows,
                                IC, OC, stream_);
    return;
  }
  grouped_forward_by_group(*this, host_group_offsets(*this, offsets, G, rows, op), out, inp, weight, IC, OC);
}

void CudaOps::grouped_matmul_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                                      Tensor offsets, int G, int rows, int IC, int OC) {
  const char* op = "grouped_matmul_backward";
  check_dims(op, {G, rows, IC, OC});
  if (!dinp && !dweight) return;
  const DType dt = need_act(dout, size_t(rows) * OC, op, "dout");
  need(offsets, size_t(G) + 1, DType::i32, op, "offsets");
  if (dinp) {
    need(dinp, size_t(rows) * IC, dt, op, "dinp");
    need(weight, size_t(G) * OC * IC, dt, op, "weight");
  }
  DType wt = dt;
  if (dweight) {
    wt = need_act(dweight, size_t(G) * OC * IC, op, "dweight");
    check(wt == dt || wt == DType::f32, where(op) + ": dweight must be " + std::string(dtype_name(dt)) + " or f32");
    need(inp, size_t(rows) * IC, dt, op, "inp");
  }
  if (grouped_kernels_ && tensor_cores_take(dt, G, IC, OC, {dinp, dweight, dout, inp, weight})) {
    // dinp and dW on two streams, as matmul_backward's (each kernel's bits are what they are alone).
    const auto* off = static_cast<const int32_t*>(offsets.data);
    run_beside(
        dinp && dweight,
        [&] {
          if (dinp)
            gpu::grouped_matmul_backward_input(dinp.data, dout.data, weight.data, off, G, rows, IC, OC, stream_);
        },
        [&](void* dw_stream, int) {
          if (dweight)
            gpu::grouped_matmul_backward_weight(wt, dweight.data, dout.data, inp.data, off, G, IC, OC, dw_stream);
        });
    return;
  }
  grouped_backward_by_group(*this, host_group_offsets(*this, offsets, G, rows, op), dinp, dweight, dout, inp, weight, IC,
                            OC);
}

}  // namespace pt
