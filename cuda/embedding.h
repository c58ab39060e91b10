// Host launchers for the token and position embeddings (cuda/embedding.cu; the token table's
// backward is cuda/embedding_backward.cu). Activations and the tables are `dtype` (f32 or bf16);
// gradient tables are `grad_dtype` (f32 or bf16; the model keeps f32 parameter gradients). Same
// conventions as the other launchers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor/tensor.h"

namespace pt::gpu {

// out[n, :] = wte[tokens[n] - vocab_start, :] for tokens in [vocab_start, vocab_start + vocab_local), else 0.
void embedding_forward(DType dtype, void* out, const int32_t* tokens, const void* wte, int N, int C, int vocab_start,
                       int vocab_local, void* stream = nullptr);

// Scratch bytes embedding_backward needs for N tokens of C channels (the sorted tokens and fp32
// partial sums for rows hit more than 32 times: about N*C bytes in all).
size_t embedding_backward_scratch_bytes(int N, int C, int vocab_local);
// dwte[tokens[n] - vocab_start, :] += dout[n, :] for in-range tokens; deterministic (see embedding_backward.cu).
// vocab_local is at most 262144 (a larger table throws before anything is launched).
void embedding_backward(DType dtype, DType grad_dtype, void* dwte, const void* dout, const int32_t* tokens, int N,
                        int C, int vocab_start, int vocab_local, void* scratch, size_t scratch_bytes,
                        void* stream = nullptr);

// out[b, t, :] += wpe[pos[t], :]. wpe has wpe_rows rows; a position outside them writes NaN
// (the host cannot check device-resident positions without a sync; NaN makes the bug loud).
void position_forward(DType dtype, void* out, const void* wpe, const int32_t* pos, int B, int T, int C, int wpe_rows,
                      void* stream = nullptr);
// dwpe[pos[t], :] += sum_b dout[b, t, :], deterministic; out-of-range positions are skipped.
void position_backward(DType dtype, DType grad_dtype, void* dwpe, const void* dout, const int32_t* pos, int B, int T,
                       int C, int wpe_rows, void* stream = nullptr);

}  // namespace pt::gpu
