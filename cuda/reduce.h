// Host launchers for the deterministic reductions (cuda/reduce.cu): the sum and the sum of
// squares of n elements (f32 or bf16) in double, the gradient norm and the loss of a step.
// The result is left in device memory (one double at `result`); the caller copies it to the
// host. `scratch` holds reduce_scratch_bytes() bytes. Same conventions as the other launchers.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

size_t reduce_scratch_bytes();
// *result = sum_i x[i]^2 (square = true) or sum_i x[i] (square = false), accumulated in double.
void reduce_sum(DType dtype, double* result, const void* x, size_t n, bool square, void* scratch,
                void* stream = nullptr);
// *result = (float) sum_i x[i], the sum accumulated in double as above and rounded once.
void reduce_sum_to_float(DType dtype, float* result, const void* x, size_t n, void* scratch, void* stream = nullptr);

}  // namespace pt::gpu
