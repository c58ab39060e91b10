// What transformers' LlamaForCausalLM and MixtralForCausalLM share, for hf_llama.cpp and
// hf_mixtral.cpp: a Mixtral is a Llama whose blocks' MLP is a sparse block of SwiGLU experts.
// The embedding, the attention, the norms and the head, their tensor names and their
// config.json keys are the same in both; the two differ in the MLP's tensors and keys and in
// the defaults their config classes give a key left out.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/ckpt/hf_architecture.h"
#include "core/ckpt/hf_config_keys.h"

namespace pt::ckpt {

// The config class's value of a key config.json leaves out (LlamaConfig's, MixtralConfig's).
// The two classes agree on the vocabulary, the width, the depth and the query heads (Llama 2
// 7B's and Mixtral 8x7B's): those are the members' defaults, the rest each class gives.
struct HfLlamaDefaults {
  int vocab_size = 32000, hidden_size = 4096, intermediate_size = 0, num_hidden_layers = 32;
  int num_attention_heads = 32;
  int num_key_value_heads = 0;  // 0: num_attention_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 0, rope_theta = 0;
};

// The rules of the embedding, each block's norms and attention, the block's MLP tensors
// `mlp` (names after "model.layers.{L}."), the final norm and an untied head. picotrain's
// names are Hugging Face's, so each rule maps a name to itself.
std::vector<HfTensorRule> llama_family_rules(const std::vector<std::string>& mlp);

// config.json for `m`: the class, its model_type, the shared keys with intermediate_size (the
// MLP's width: Llama's MLP, each of Mixtral's experts), then `own` (the class's own keys).
nlohmann::ordered_json llama_family_config_json(const ModelSection& m, HfDtype dtype, const char* class_name,
                                                const char* model_type, int intermediate_size,
                                                const nlohmann::ordered_json& own);

// The shared keys of a config.json read as transformers would (a key left out takes `d`'s
// value), refusing one that makes transformers compute what picotrain does not. The model is a
// dense Llama whose ffn_hidden is intermediate_size; the caller reads its own keys.
ModelSection llama_family_model_from_config(const HfConfigKeys& k, const HfLlamaDefaults& d);

// An entry with what the two have alike: the table, the base-model prefix, old buffers, the
// tied head.
HfArchitecture llama_family_architecture();

}  // namespace pt::ckpt
