// The grouped products (Ops::grouped_matmul_forward / _backward) as one matmul per group, from
// offsets on the host: CpuOps's implementation, and CudaOps's where its tensor-core kernels do not
// apply (fp32, widths that are not multiples of 8). Header-only: the CUDA backend links no core/
// sources.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/ops/ops.h"

namespace pt {

// offsets [G + 1] copied and checked against the contract: from 0, never decreasing, at most rows.
inline std::vector<int> checked_group_offsets(const int32_t* host, int G, int rows, const std::string& who) {
  std::vector<int> off(host, host + G + 1);
  check(off[0] == 0 && off[size_t(G)] <= rows,
        who + ": offsets must run from 0 to at most " + std::to_string(rows) + " rows");
  for (int g = 0; g < G; g++) check(off[size_t(g)] <= off[size_t(g) + 1], who + ": offsets must not decrease");
  return off;
}

// out[r0:r1] = inp[r0:r1] @ weight[g]^T for each group with rows.
inline void grouped_forward_by_group(Ops& ops, const std::vector<int>& off, Tensor out, Tensor inp, Tensor weight,
                                     int IC, int OC) {
  const size_t I = size_t(IC), O = size_t(OC);
  for (size_t g = 0; g + 1 < off.size(); g++) {
    const size_t r0 = size_t(off[g]), m = size_t(off[g + 1]) - r0;
    if (m > 0)
      ops.matmul_forward(out.slice(r0 * O, m * O), inp.slice(r0 * I, m * I), weight.slice(g * O * I, O * I), Tensor{},
                         static_cast<int>(m), IC, OC);
  }
}

// dinp[r0:r1] = dout[r0:r1] @ weight[g], dweight[g] += dout[r0:r1]^T @ inp[r0:r1] for each group
// with rows; either output may be null.
inline void grouped_backward_by_group(Ops& ops, const std::vector<int>& off, Tensor dinp, Tensor dweight, Tensor dout,
                                      Tensor inp, Tensor weight, int IC, int OC) {
  const size_t I = size_t(IC), O = size_t(OC);
  for (size_t g = 0; g + 1 < off.size(); g++) {
    const size_t r0 = size_t(off[g]), m = size_t(off[g + 1]) - r0, w0 = g * O * I;
    if (m == 0) continue;
    ops.matmul_backward(dinp ? dinp.slice(r0 * I, m * I) : Tensor{}, dweight ? dweight.slice(w0, O * I) : Tensor{},
                        Tensor{}, dout.slice(r0 * O, m * O), dweight ? inp.slice(r0 * I, m * I) : Tensor{},
                        dinp ? weight.slice(w0, O * I) : Tensor{}, static_cast<int>(m), IC, OC);
  }
}

}  // namespace pt
