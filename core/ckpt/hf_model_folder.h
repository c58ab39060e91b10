// Hugging Face model folders: config.json + model.safetensors, what transformers'
// save_pretrained writes and AutoModelForCausalLM.from_pretrained(DIR) loads with no conversion
// script. The architecture's names, transforms and config come from hf_architecture.h; this
// file only moves tensors between a folder and a picotrain checkpoint.
#pragma once
#include <string>

#include "core/ckpt/hf_architecture.h"

namespace pt::ckpt {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";

// `dir` looks like a Hugging Face model folder: it holds config.json and is no picotrain
// checkpoint (no manifest.json, no latest).
bool is_hf_model_folder(const std::string& dir);

// picotrain checkpoint (a step directory, or a checkpoint directory's latest) -> `out_dir`
// (created when missing): model.safetensors with the fp32 master weights under Hugging Face's
// names (rounded to bf16 when asked; padded vocabulary rows left out), the tokenizer files of the
// checkpoint's tokenizer (hf_tokenizer_files.h: the recorded one, else the one its vocabulary
// implies when its files are present), then config.json. Each
// file is written to a temporary name, fsynced and renamed. Refuses an out_dir that is a
// picotrain checkpoint directory. Returns the checkpoint it read.
std::string export_hf(const std::string& checkpoint, const std::string& out_dir, HfDtype dtype);

// Hugging Face folder -> a committed weights-only picotrain checkpoint at step 0 in `out_dir`
// (as import_llmc). Every parameter must be in model.safetensors with the shape config.json
// implies (F32, BF16 or F16); a tensor that is neither a parameter nor a known buffer is an
// error. A tokenizer.json in the folder that picotrain reads (byte-level BPE) is recorded in the
// checkpoint (checkpoint_tokenizer.h). Returns the step directory.
std::string import_hf(const std::string& in_dir, const std::string& out_dir);

}  // namespace pt::ckpt
