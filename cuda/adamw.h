// Host launcher for the AdamW update (cuda/adamw.cu). Same conventions as the other launchers.
#pragma once
#include <cstddef>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// On n elements: g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// master -= lr * ((m / correction1) / (sqrt(v / correction2) + eps) + weight_decay * master);
// then params = master rounded to params_dtype (f32 or bf16). params may be nullptr or equal
// master (an fp32 model whose master IS the parameters): then nothing more is written.
// master, grad, m, v are f32. correction1/2 are 1 - beta^t, computed by the caller. `step`
// (nullable, device): {lr, correction1, correction2, grad_scale} read by the kernel instead of
// the arguments, for a recorded update replayed with each step's values.
void adamw_update(DType params_dtype, void* params, float* master, const float* grad, float* m, float* v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float correction1,
                  float correction2, float grad_scale, const float* step, void* stream = nullptr);

}  // namespace pt::gpu
