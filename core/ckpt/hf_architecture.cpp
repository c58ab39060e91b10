#include "core/ckpt/hf_architecture.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"

namespace pt::ckpt {

namespace {

// Every architecture that has a Hugging Face form.
const std::vector<const HfArchitecture*>& all_architectures() {
  static const std::vector<const HfArchitecture*> all = {&hf_gpt2(), &hf_llama(), &hf_mixtral()};
  return all;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string with_block(const std::string& pattern, int layer) {
  std::string s = pattern;
  const size_t at = s.find("{L}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  return s;
}

// The Hugging Face name `rule` gives parameter `name` of block `layer`; empty when the rule is
// another parameter's. "{E}" stands for the digits of an expert's index, which the Hugging Face
// name takes over.
std::string name_by_rule(const HfTensorRule& rule, const std::string& name, int layer) {
  const std::string pattern = with_block(rule.picotrain, layer), hf = with_block(rule.hf, layer);
  const size_t at = pattern.find("{E}");
  if (at == std::string::npos) return pattern == name ? hf : std::string();
  const size_t head = at, tail = pattern.size() - at - 3;
  if (name.size() <= head + tail || name.compare(0, head, pattern, 0, head) != 0 ||
      name.compare(name.size() - tail, tail, pattern, at + 3, tail) != 0)
    return {};
  const std::string index = name.substr(head, name.size() - head - tail);
  if (index.find_first_not_of("0123456789") != std::string::npos) return {};
  std::string out = hf;
  const size_t e = out.find("{E}");
  check(e != std::string::npos, "a Hugging Face rule with {E} in one name only: " + rule.picotrain);
  return out.replace(e, 3, index);
}

}  // namespace

const HfArchitecture& hf_architecture_for_model(const ModelSection& model) {
  std::vector<std::string> known;
  const auto described = [](const std::string& arch, bool experts) { return arch + (experts ? " with experts" : ""); };
  for (const HfArchitecture* a : all_architectures()) {
    known.push_back(described(a->arch, a->experts));
    if (a->arch != model.arch || a->experts != model.moe.enabled()) continue;
    if (a->cannot_hold)
      if (const std::string why = a->cannot_hold(model); !why.empty())
        throw ConfigError("convert --format hf: " + why);
    return *a;
  }
  throw ConfigError("convert --format hf: model.arch=" + described(model.arch, model.moe.enabled()) +
                    " has no Hugging Face form yet (known: " + join_names(known) + ")");
}

const HfArchitecture& hf_architecture_for_model_type(const std::string& model_type, const std::string& path) {
  std::vector<std::string> known;
  for (const HfArchitecture* a : all_architectures()) {
    if (a->model_type == model_type) return *a;
    known.push_back(a->model_type);
  }
  throw ConfigError(path + ": model_type \"" + model_type +
                    "\" is not one picotrain imports (known: " + join_names(known) + ")");
}

size_t HfTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<HfTensor> hf_tensors(const HfArchitecture& arch, const ParamTable& table, const ModelSection& model) {
  std::vector<int> uses(arch.rules.size(), 0);
  std::vector<HfTensor> out;
  for (const ParamSpec& p : table.specs()) {
    HfTensor t;
    t.param = &p;
    for (size_t r = 0; r < arch.rules.size() && t.name.empty(); r++) {
      const HfTensorRule& rule = arch.rules[r];
      const bool per_block = rule.picotrain.find("{L}") != std::string::npos;
      if (per_block && (p.layer < 0 || p.layer >= model.n_layers)) continue;
      t.name = name_by_rule(rule, p.name, p.layer);
      if (t.name.empty()) continue;
      t.transpose = rule.transpose;
      t.vocab_rows = rule.vocab_rows;
      uses[r]++;
    }
    if (t.name.empty())
      throw RuntimeError("the " + arch.class_name + " table has no Hugging Face name for parameter " + p.name);
    t.shape = p.global_shape;
    if (t.transpose || t.vocab_rows)
      check(t.shape.size() == 2, "a transposed or vocabulary-padded parameter must be a matrix: " + p.name);
    if (t.vocab_rows) {
      check(model.vocab_size <= t.shape[0], "vocab_size is larger than the rows of " + p.name);
      t.shape[0] = model.vocab_size;
    }
    if (t.transpose) std::swap(t.shape[0], t.shape[1]);
    out.push_back(std::move(t));
  }
  for (size_t r = 0; r < arch.rules.size(); r++)
    if (uses[r] == 0 && !arch.rules[r].optional)
      throw RuntimeError("the " + arch.class_name + " rule for " + arch.rules[r].picotrain +
                         " matches no parameter of the model");
  return out;
}

// A matrix's kept rows (all of them, or the first vocab_size) copied, transposed or not.
void to_hf(const HfTensor& t, const float* pt, float* hf) {
  if (!t.transpose) {
    std::memcpy(hf, pt, t.numel() * sizeof(float));  // dropped padding rows are the tail
    return;
  }
  const size_t rows = static_cast<size_t>(t.shape[1]), cols = static_cast<size_t>(t.shape[0]);  // picotrain's
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) hf[j * rows + i] = pt[i * cols + j];
}

void from_hf(const HfTensor& t, const float* hf, float* pt) {
  std::fill(pt, pt + t.param->numel, 0.0f);  // padding rows stay zero, as training keeps them
  if (!t.transpose) {
    std::memcpy(pt, hf, t.numel() * sizeof(float));
    return;
  }
  const size_t rows = static_cast<size_t>(t.shape[1]), cols = static_cast<size_t>(t.shape[0]);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) pt[i * cols + j] = hf[j * rows + i];
}

const char* torch_dtype_name(HfDtype dtype) { return dtype == HfDtype::f32 ? "float32" : "bfloat16"; }
const char* safetensors_dtype_name(HfDtype dtype) { return dtype == HfDtype::f32 ? "F32" : "BF16"; }

nlohmann::ordered_json end_of_text_id(const ModelSection& model) {
  constexpr int kGpt2Vocab = 50257, kGpt2EndOfText = 50256;
  return model.vocab_size == kGpt2Vocab ? nlohmann::ordered_json(kGpt2EndOfText) : nlohmann::ordered_json(nullptr);
}

}  // namespace pt::ckpt
