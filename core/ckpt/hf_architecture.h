// How a picotrain architecture appears as a Hugging Face transformers model: the class and
// model_type config.json names, the config.json written from (and read back into) a
// ModelSection, and one table of rules giving every parameter's Hugging Face name and the
// transform its data takes on the way. The exporter and importer (hf_model_folder.h) know no
// architecture; they walk the architecture's ParamTable and apply its rules, so a parameter
// added to a table without a rule is an error, never a tensor silently left out.
//
// Architectures: gpt2 (GPT2LMHeadModel, hf_gpt2.cpp), llama (LlamaForCausalLM, hf_llama.cpp) and
// llama with experts (MixtralForCausalLM, hf_mixtral.cpp; the two share hf_llama_family.h).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_table.h"

namespace pt::ckpt {

enum class HfDtype { f32, bf16 };

// One parameter (or family of per-block parameters) and its Hugging Face form. In both names
// "{L}" stands for the block index and "{E}" for an expert's (any number, the same in both).
struct HfTensorRule {
  std::string picotrain;  // e.g. "h.{L}.attn.c_attn.weight"
  std::string hf;         // e.g. "transformer.h.{L}.attn.c_attn.weight"
  // Hugging Face stores the matrix [in, out] (GPT-2's Conv1D); picotrain stores [out, in].
  bool transpose = false;
  // Rows past model.vocab_size are picotrain's vocabulary padding: left out on export,
  // zero-filled on import (Hugging Face's tensor has exactly vocab_size rows).
  bool vocab_rows = false;
  // A parameter only some models of the architecture have (Llama's lm_head, absent when the
  // head is tied to the embedding): a rule that matches nothing is then no error.
  bool optional = false;
};

struct HfArchitecture {
  std::string arch;        // model.arch
  bool experts = false;    // the form of that architecture's models with experts (moe.n_experts > 0)
  std::string model_type;  // config.json "model_type"
  std::string class_name;  // config.json "architectures"[0]
  std::vector<HfTensorRule> rules;
  ParamTable (*param_table)(const ModelSection&) = nullptr;
  // config.json for a model of this architecture stored in `dtype`.
  nlohmann::ordered_json (*config_json)(const ModelSection&, HfDtype dtype) = nullptr;
  // The model a config.json describes; throws RuntimeError naming `path` and the key when it
  // is malformed or describes a model picotrain does not compute exactly.
  ModelSection (*model_from_config)(const nlohmann::json& config, const std::string& path) = nullptr;
  // Export only: why the Hugging Face class cannot hold `model` (empty: it can); null: always can.
  std::string (*cannot_hold)(const ModelSection& model) = nullptr;
  // Import only: a prefix transformers leaves out when the base model alone was saved
  // (GPT-2's "transformer."); a tensor name without it is accepted too.
  std::string base_prefix;
  // Import only: name endings of buffers some transformers versions save that are not
  // parameters (GPT-2's causal mask "attn.bias"); they are skipped.
  std::vector<std::string> ignored_suffixes;
  // Import only: an output head tied to an embedding, which transformers does not save but an
  // older file may hold; accepted only when it equals `tied_to` (a HF name) exactly.
  std::string tied_head, tied_to;
};

// The Hugging Face form of `model` (its model.arch, with experts or without) / of a config.json
// model_type; ConfigError when there is none, or when that form cannot hold this model (a
// Mixtral with dense blocks, say), naming why.
const HfArchitecture& hf_architecture_for_model(const ModelSection& model);
const HfArchitecture& hf_architecture_for_model_type(const std::string& model_type, const std::string& path);

// One parameter of a table with its Hugging Face name and shape.
struct HfTensor {
  const ParamSpec* param = nullptr;
  std::string name;
  std::vector<int64_t> shape;  // Hugging Face's
  bool transpose = false;
  bool vocab_rows = false;
  size_t numel() const;
};
// Every parameter of `table` (its order), with the rule that names it. Throws RuntimeError
// naming a parameter no rule matches or a rule that matches nothing.
std::vector<HfTensor> hf_tensors(const HfArchitecture& arch, const ParamTable& table, const ModelSection& model);

// The transforms, both ways. `pt` is the parameter's data (param->numel floats), `hf` the
// Hugging Face tensor's (t.numel() floats). from_hf writes zeros into dropped padding rows.
void to_hf(const HfTensor& t, const float* pt, float* hf);
void from_hf(const HfTensor& t, const float* hf, float* pt);

// "float32" / "bfloat16" (config.json's torch_dtype) and "F32" / "BF16" (safetensors').
const char* torch_dtype_name(HfDtype dtype);
const char* safetensors_dtype_name(HfDtype dtype);
// config.json's bos_token_id and eos_token_id for `model`. A model trained on GPT-2's tokenizer
// (picotrain's, 50257 ids) has <|endoftext|> = 50256 to begin and end documents; another
// vocabulary has no id picotrain knows, so the fields are null rather than a config class's
// default (GPT2Config's 50256 would point past a smaller embedding; LlamaConfig's 1 and 2 name
// ordinary tokens). export_hf replaces both with the tokenizer's bos/eos when the folder gets
// tokenizer files (hf_tokenizer_files.h).
nlohmann::ordered_json end_of_text_id(const ModelSection& model);

// The GPT-2 entry (hf_gpt2.cpp), the Llama entry (hf_llama.cpp) and the Mixtral entry
// (hf_mixtral.cpp).
const HfArchitecture& hf_gpt2();
const HfArchitecture& hf_llama();
const HfArchitecture& hf_mixtral();

}  // namespace pt::ckpt
