// llm.c model files (train_gpt2.c / train_gpt2.cu's gpt2_write_to_checkpoint), so a model
// moves between picotrain and llm.c's tools (and from there to Hugging Face with llm.c's
// dev/eval/export_hf.py).
//
// Format: a 1024-byte header of 256 little-endian int32 -- [0] magic 20240326, [1] version
// (3: fp32 parameters, 5: bf16), [2] max_seq_len, [3] vocab_size, [4] num_layers,
// [5] num_heads, [6] channels, [7] padded_vocab_size -- then the parameters, raw, in llm.c's
// order, which groups each tensor type over all layers: wte (padded rows zero), wpe, every
// layer's ln1w, then every ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
// fcprojb, and finally lnfw, lnfb. Weights are [out, in] in both programs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/run_config.h"

namespace pt::ckpt {

inline constexpr int32_t kLlmcModelMagic = 20240326;
inline constexpr int32_t kLlmcVersionF32 = 3;
inline constexpr int32_t kLlmcVersionBf16 = 5;
inline constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

enum class LlmcDtype { f32, bf16 };

// picotrain parameter names in llm.c's file order.
std::vector<std::string> llmc_param_order(int n_layers);

// fp32 -> bf16 rounding to nearest, ties to even (NaN stays a quiet NaN); and back (exact).
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);

// The model shape an llm.c file's header describes, checked against its size. Throws
// RuntimeError naming the file when it is not an llm.c model file this reader supports.
struct LlmcFileInfo {
  ModelSection model;
  LlmcDtype dtype = LlmcDtype::f32;
};
LlmcFileInfo read_llmc_header(const std::string& path);

// picotrain checkpoint (a step directory, or a checkpoint directory's latest) -> llm.c file:
// the fp32 master weights, rounded to bf16 when asked. Returns the checkpoint it read.
std::string export_llmc(const std::string& checkpoint, const std::string& out_file, LlmcDtype dtype);

// llm.c file -> a committed picotrain checkpoint at step 0 in `out_dir` (step_00000000 and
// latest): weights only, so training from it starts Adam from zero moments and the schedule
// from step 0. Refuses an out_dir that already holds checkpoints. Returns the step directory.
std::string import_llmc(const std::string& in_file, const std::string& out_dir);

}  // namespace pt::ckpt
