// Reading a transformers config.json the way transformers does: a key left out (or null) takes
// the config class's default; a key that is there must have the right type. Every failure is a
// RuntimeError naming the file and the key, for the architectures' model_from_config.
// read_decoder_shape reads what every architecture's config has alike (under the class's own key
// names); each architecture's model_from_config reads and refuses the rest itself.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/common/error.h"
#include "core/config/run_config.h"

namespace pt::ckpt {

class HfConfigKeys {
 public:
  HfConfigKeys(const nlohmann::json& config, std::string path) : c_(config), path_(std::move(path)) {}

  // `path: "key": why`: the error for a key whose value picotrain refuses.
  RuntimeError fail(const std::string& key, const std::string& why) const {
    return RuntimeError(path_ + ": \"" + key + "\": " + why);
  }
  bool given(const char* key) const { return c_.contains(key) && !c_[key].is_null(); }
  const std::string& path() const { return path_; }
  const nlohmann::json& at(const char* key) const { return c_[key]; }

  int whole(const char* key, int def) const {
    if (!given(key)) return def;
    const nlohmann::json& v = c_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw fail(key, v.dump() + " is not a whole number >= 1");
    return static_cast<int>(v.get<int64_t>());
  }
  double positive(const char* key, double def) const {
    if (!given(key)) return def;
    const nlohmann::json& v = c_[key];
    if (!v.is_number() || !(v.get<double>() > 0)) throw fail(key, v.dump() + " is not a number > 0");
    return v.get<double>();
  }
  double non_negative(const char* key, double def) const {
    if (!given(key)) return def;
    const nlohmann::json& v = c_[key];
    if (!v.is_number() || !(v.get<double>() >= 0)) throw fail(key, v.dump() + " is not a number >= 0");
    return v.get<double>();
  }
  bool flag(const char* key, bool def) const {
    if (!given(key)) return def;
    if (!c_[key].is_boolean()) throw fail(key, c_[key].dump() + " is not true or false");
    return c_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& def) const {
    if (!given(key)) return def;
    if (!c_[key].is_string()) throw fail(key, c_[key].dump() + " is not a string");
    return c_[key].get<std::string>();
  }
  // A boolean key whose only value picotrain computes is `want`.
  void require(const char* key, bool got, bool want, const std::string& why) const {
    if (got != want) throw fail(key, std::string(got ? "true" : "false") + " is not supported: " + why);
  }

 private:
  const nlohmann::json& c_;
  std::string path_;
};

// A whole-number key of a config class and the value the class gives it when left out.
struct HfWholeKey {
  const char* key;
  int def;
};

// The keys a config class names a decoder's shape by (GPT2Config's n_embd, LlamaConfig's
// hidden_size, ...).
struct HfDecoderShapeKeys {
  HfWholeKey vocab_size, max_seq_len, d_model, n_layers, n_heads;
};

// The decoder a config.json describes, as far as every architecture's config says it: the
// vocabulary (padded as picotrain's configs pad by default: vocab_padding.h), the context length,
// the width, the depth and the heads, which must divide the width. Throws RuntimeError naming
// the key.
ModelSection read_decoder_shape(const HfConfigKeys& k, const HfDecoderShapeKeys& keys);

}  // namespace pt::ckpt
