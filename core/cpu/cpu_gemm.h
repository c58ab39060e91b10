// The CPU backend's one matrix product (core/cpu/cpu_matmul.cpp), shared by the linear layer and
// the FP8 emulation (cpu_fp8.cpp): C (+)= A @ B with A and B given by strides, so transposes
// cost nothing.
#pragma once

namespace pt::cpu {

// A strided matrix view: element (i, j) is p[i * rs + j * cs].
struct Strided {
  const float* p;
  long long rs, cs;
  float at(long long i, long long j) const { return p[i * rs + j * cs]; }
};

// C[M, Ncols] (row stride ldc) = init + A[M, K] @ B[K, Ncols], where init is C itself when
// accumulating, else bias[col] (or 0 when bias is null). Each C element sums its k in a fixed
// order, whichever thread computes it (deterministic).
void gemm(float* C, long long ldc, int M, int Ncols, int K, Strided a, Strided b, const float* bias,
          bool accumulate);

}  // namespace pt::cpu
