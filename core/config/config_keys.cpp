// The table of every config key: its section, its C++ field (which gives the type and the
// default, from run_config.h) and the rule it must satisfy on its own. Parsing, writing back,
// the unknown-key message and the configuration reference (`picotrain keys`, docs/configuration.md)
// all follow this one list.
#include "core/config/config_keys.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "core/common/error.h"
#include "core/parallel/fp8_linear.h"
#include "core/tokenizer/tokenizer.h"

namespace pt::config {
namespace {

// ---- reading a JSON value as a field's type --------------------------------------------

// "a string", "an integer", ...: what a JSON value is, for "X is a string, expected Y".
std::string describe(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a fractional number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

[[noreturn]] void wrong_type(const std::string& key, const json& v, const std::string& expected) {
  throw ConfigError(key_value(key, v) + " is " + describe(v) + ", expected " + expected);
}

// Integers are range-checked rather than wrapped: n_layers=4294967297 must not become 1.
template <class Int>
Int read_integer(const std::string& key, const json& v) {
  if (v.is_number_float()) {
    // JSON has one number type: 1e3 is the integer 1000 (handy for token counts), 4.5 is not
    // an integer. Beyond 2^53 a double no longer says which integer was meant.
    // The magnitude is checked first, so a huge value gets the out-of-range message rather
    // than the whole-number one (with g++ -O2 here, trunc(1e20) != 1e20 was seen to hold).
    double d = v.get<double>();
    if (std::isnan(d)) wrong_type(key, v, "an integer");
    if (std::abs(d) > 0x1p53) throw ConfigError(key_value(key, v) + " is out of range: write it as an integer");
    if (std::trunc(d) != d) wrong_type(key, v, "an integer");
    return read_integer<Int>(key, json(int64_t(d)));
  }
  if (!v.is_number_integer()) wrong_type(key, v, "an integer");
  // nlohmann keeps non-negative literals as uint64 and negative ones as int64.
  bool fits;
  if (v.is_number_unsigned()) {
    fits = std::cmp_less_equal(v.get<uint64_t>(), std::numeric_limits<Int>::max());
  } else {
    int64_t s = v.get<int64_t>();
    if (std::is_unsigned_v<Int> && s < 0) throw ConfigError(key_value(key, v) + " must be >= 0");
    fits = std::in_range<Int>(s);
  }
  if (!fits) throw ConfigError(key_value(key, v) + " is out of range for a " + std::to_string(8 * sizeof(Int)) + "-bit integer");
  return v.get<Int>();
}

double read_number(const std::string& key, const json& v) {
  if (!v.is_number()) wrong_type(key, v, "a number");
  double x = v.get<double>();
  if (!std::isfinite(x)) throw ConfigError(key_value(key, v) + " must be a finite number");
  return x;
}

template <class T>
T read_as(const std::string& key, const json& v);

template <> int read_as<int>(const std::string& key, const json& v) { return read_integer<int>(key, v); }
template <> int64_t read_as<int64_t>(const std::string& key, const json& v) { return read_integer<int64_t>(key, v); }
template <> uint64_t read_as<uint64_t>(const std::string& key, const json& v) { return read_integer<uint64_t>(key, v); }
template <> double read_as<double>(const std::string& key, const json& v) { return read_number(key, v); }

template <> bool read_as<bool>(const std::string& key, const json& v) {
  if (!v.is_boolean()) wrong_type(key, v, "a boolean (true or false)");
  return v.get<bool>();
}

// A boolean whose default depends on other keys: null (or absent) leaves it to the rules.
template <> std::optional<bool> read_as<std::optional<bool>>(const std::string& key, const json& v) {
  if (v.is_null()) return std::nullopt;
  return read_as<bool>(key, v);
}

template <> std::string read_as<std::string>(const std::string& key, const json& v) {
  if (!v.is_string()) wrong_type(key, v, "a string");
  return v.get<std::string>();
}

template <> std::array<double, 2> read_as<std::array<double, 2>>(const std::string& key, const json& v) {
  if (!v.is_array() || v.size() != 2) wrong_type(key, v, "an array of 2 numbers");
  return {read_number(key + "[0]", v[0]), read_number(key + "[1]", v[1])};
}

// A list of integers, each read (and range-checked) as one: "parallel.pp_layers[2]=..." names
// the entry in a message.
template <> std::vector<int> read_as<std::vector<int>>(const std::string& key, const json& v) {
  if (!v.is_array()) wrong_type(key, v, "an array of integers");
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); i++) out.push_back(read_integer<int>(key + "[" + std::to_string(i) + "]", v[i]));
  return out;
}

// A field's value as JSON (nlohmann has no std::optional: unset is null).
template <class T>
json to_json_value(const T& v) {
  return json(v);
}
template <>
json to_json_value(const std::optional<bool>& v) {
  return v ? json(*v) : json(nullptr);
}

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::optional<bool>>) return "boolean";
  else if constexpr (std::is_same_v<T, std::vector<int>>) return "[integer, ...]";
  else if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_same_v<T, double>) return "number";
  else if constexpr (std::is_same_v<T, std::array<double, 2>>) return "[number, number]";
  else return "integer";
}

// ---- rules on one key's value: each returns "" when it holds, else what it requires ----

template <class N>
std::string num(N x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

struct NoRule {
  template <class T>
  std::string operator()(const T&) const { return ""; }
};

template <class N>
auto at_least(N min) {
  return [min](const auto& v) { return v >= min ? std::string() : "must be >= " + num(min); };
}

auto greater_than(double min) {
  return [min](double v) { return v > min ? std::string() : "must be > " + num(min); };
}

// `brackets` is "[]", "[)" or "(]": which ends are included; it also writes the message.
auto in_interval(double lo, double hi, const char* brackets) {
  return [=](double v) {
    bool ok = (brackets[0] == '[' ? v >= lo : v > lo) && (brackets[1] == ']' ? v <= hi : v < hi);
    return ok ? std::string() : "must be in " + std::string(1, brackets[0]) + num(lo) + ", " + num(hi) + brackets[1];
  };
}

auto one_of(std::vector<std::string> allowed) {
  return [allowed](const std::string& v) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return std::string();
    return "must be one of " + join_names(allowed);
  };
}

// Every entry of a list at least `min` (the list's own rule; its length is a cross-key rule).
auto each_at_least(int min) {
  return [min](const std::vector<int>& v) {
    for (size_t i = 0; i < v.size(); i++)
      if (v[i] < min) return "entry " + std::to_string(i) + " (" + std::to_string(v[i]) + ") must be >= " + num(min);
    return std::string();
  };
}

auto not_empty = [](const std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); };

// Read when the run starts (the trainer checks model.vocab_size against it); here only its name.
auto tokenizer_rule = [](const std::string& v) {
  return v.empty() || is_tokenizer_name(v)
             ? std::string()
             : std::string("must be \"\" (by model.vocab_size), ") + kTokenizerNames + ", an existing path";
};

// core/ops/matmul_algos.h; a file is read when the run starts (trainer_matmul_algos.cpp).
auto matmul_algos_rule = [](const std::string& v) {
  return v.empty() ? std::string("must be \"heuristic\", \"timed\" or the path of a matmul_algos.json") : std::string();
};

// FP8: the recipes (core/parallel/fp8_linear.h).
auto fp8_rule = [](const std::string& v) {
  if (v == "off" || v == "tensorwise" || v == "rowwise" || v == "delayed") return std::string();
  return std::string("must be one of \"off\", \"tensorwise\", \"rowwise\", \"delayed\"");
};

auto fp8_layers_rule = [](const std::string& v) {
  try {
    parse_fp8_layers(v);
    return std::string();
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
};

auto dp_rule = [](int v) { return v == -1 || v >= 1 ? std::string() : std::string("must be -1 (derived) or >= 1"); };

auto hang_timeout_rule = [](double v) {
  return v == -1 || v >= 0 ? std::string() : std::string("must be -1 (600 with several ranks, off with one), 0 (off) or > 0");
};

auto betas_rule = [](const std::array<double, 2>& b) {
  bool ok = std::all_of(b.begin(), b.end(), [](double x) { return x >= 0 && x < 1; });
  return ok ? std::string() : std::string("must each be in [0, 1)");
};

// The grid's rank order: the four dimension names, innermost first, e.g. "tp-cp-dp-pp".
auto order_rule = [](const std::string& v) {
  std::vector<std::string> parts;
  std::stringstream s(v);
  for (std::string p; std::getline(s, p, '-');) parts.push_back(p);
  std::sort(parts.begin(), parts.end());
  bool ok = parts == std::vector<std::string>{"cp", "dp", "pp", "tp"} && v.back() != '-';
  return ok ? std::string() : std::string("must be a permutation of tp, cp, dp, pp joined by '-' (e.g. \"tp-cp-dp-pp\")");
};

// ---- the table ---------------------------------------------------------------------------

// Adds the keys of one section: `keys.add("n_layers", &ModelSection::n_layers, at_least(1))`.
template <class S>
class SectionKeys {
 public:
  using Getter = S& (*)(RunConfig&);
  SectionKeys(std::vector<ConfigKey>& out, const char* section, S RunConfig::*member)
      : out_(out), section_(section), member_(member) {}
  // A section stored inside another (moe: ModelSection::moe, part of the model's shape).
  SectionKeys(std::vector<ConfigKey>& out, const char* section, Getter get) : out_(out), section_(section), get_(get) {}

  template <class T, class Rule = NoRule>
  SectionKeys& add(const char* name, T S::*field, Rule rule = {}) {
    ConfigKey k;
    k.section = section_;
    k.name = name;
    k.type = type_name<T>();
    k.is_string = std::is_same_v<T, std::string>;
    std::string path = k.path();
    auto member = member_;
    auto get = get_;
    auto section_of = [=](RunConfig& c) -> S& { return get ? get(c) : c.*member; };
    k.read = [=](RunConfig& c, const json& v) { section_of(c).*field = read_as<T>(path, v); };
    k.write = [=](const RunConfig& c) { return to_json_value(section_of(const_cast<RunConfig&>(c)).*field); };
    k.check = [=](const RunConfig& c) {
      const T& v = section_of(const_cast<RunConfig&>(c)).*field;
      if (std::string broken = rule(v); !broken.empty())
        throw ConfigError(key_value(path, to_json_value(v)) + " " + broken);
    };
    out_.push_back(std::move(k));
    return *this;
  }

 private:
  std::vector<ConfigKey>& out_;
  std::string section_;
  S RunConfig::*member_ = nullptr;
  Getter get_ = nullptr;
};

// Derived keys (model.padded_vocab, batch.grad_accum_steps) are keys too, so a resolved config
// reads back; 0 means "derive it", any other value must equal the derived one (config_rules.cpp).
std::vector<ConfigKey> build_table() {
  std::vector<ConfigKey> k;

  SectionKeys(k, "run", &RunConfig::run)
      .add("name", &RunSection::name, not_empty)
      .add("out_dir", &RunSection::out_dir)  // "": runs/<name>
      .add("seed", &RunSection::seed)        // uint64: negative values are rejected when read
      .add("hang_timeout_s", &RunSection::hang_timeout_s, hang_timeout_rule)
      .add("max_skipped_steps", &RunSection::max_skipped_steps, at_least(0))
      .add("spike", &RunSection::spike, at_least(0.0))
      .add("spike_window", &RunSection::spike_window, at_least(2))
      .add("spike_skip_steps", &RunSection::spike_skip_steps, at_least(0))
      .add("spike_max_rollbacks", &RunSection::spike_max_rollbacks, at_least(1))
      .add("replay_every_steps", &RunSection::replay_every_steps, at_least(0))
      .add("replay_mismatch", &RunSection::replay_mismatch, one_of({"stop", "warn"}))
      .add("cuda_graphs", &RunSection::cuda_graphs);

  SectionKeys(k, "model", &RunConfig::model)
      .add("arch", &ModelSection::arch, one_of({"gpt2", "llama"}))
      .add("n_layers", &ModelSection::n_layers, at_least(1))
      .add("d_model", &ModelSection::d_model, at_least(1))
      .add("n_heads", &ModelSection::n_heads, at_least(1))
      .add("vocab_size", &ModelSection::vocab_size, at_least(1))
      .add("pad_vocab_multiple", &ModelSection::pad_vocab_multiple, at_least(1))
      .add("max_seq_len", &ModelSection::max_seq_len, at_least(1))
      .add("n_kv_heads", &ModelSection::n_kv_heads, at_least(0))
      .add("ffn_hidden", &ModelSection::ffn_hidden, at_least(0))
      .add("ffn_multiple_of", &ModelSection::ffn_multiple_of, at_least(0))
      .add("ffn_dim_multiplier", &ModelSection::ffn_dim_multiplier, at_least(0.0))
      .add("norm_eps", &ModelSection::norm_eps, in_interval(0, 1, "[)"))
      .add("rope_theta", &ModelSection::rope_theta, at_least(0.0))
      .add("tie_embeddings", &ModelSection::tie_embeddings)
      .add("padded_vocab", &ModelSection::padded_vocab, at_least(0));

  SectionKeys<MoeSection>(k, "moe", [](RunConfig& c) -> MoeSection& { return c.model.moe; })
      .add("n_experts", &MoeSection::n_experts, at_least(0))
      .add("top_k", &MoeSection::top_k, at_least(1))
      .add("expert_hidden", &MoeSection::expert_hidden, at_least(0))
      .add("every", &MoeSection::every, at_least(1))
      .add("n_shared_experts", &MoeSection::n_shared_experts, at_least(0))
      .add("aux_loss_coef", &MoeSection::aux_loss_coef, at_least(0.0));

  SectionKeys(k, "parallel", &RunConfig::parallel)
      .add("dp", &ParallelSection::dp, dp_rule)
      .add("tp", &ParallelSection::tp, at_least(1))
      .add("pp", &ParallelSection::pp, at_least(1))
      .add("cp", &ParallelSection::cp, at_least(1))
      .add("ep", &ParallelSection::ep, at_least(1))
      .add("order", &ParallelSection::order, order_rule)
      .add("zero_stage", &ParallelSection::zero_stage, in_interval(0, 3, "[]"))
      .add("dp_replicate", &ParallelSection::dp_replicate, at_least(1))
      .add("grad_bucket_mb", &ParallelSection::grad_bucket_mb, greater_than(0))
      .add("sequence_parallel", &ParallelSection::sequence_parallel)
      .add("pp_schedule", &ParallelSection::pp_schedule, one_of({"afab", "1f1b", "interleaved"}))
      .add("pp_virtual_stages", &ParallelSection::pp_virtual_stages, at_least(1))
      .add("pp_layers", &ParallelSection::pp_layers, each_at_least(1))  // []: an even split
      .add("cp_impl", &ParallelSection::cp_impl, one_of({"ring", "ulysses"}))
      .add("comm_backend", &ParallelSection::comm_backend, one_of({"auto", "nccl", "mpi"}));

  SectionKeys(k, "recompute", &RunConfig::recompute)
      .add("mode", &RecomputeSection::mode, one_of({"none", "selective", "full"}));

  SectionKeys(k, "batch", &RunConfig::batch)
      .add("micro_batch_size", &BatchSection::micro_batch_size, at_least(1))
      .add("seq_len", &BatchSection::seq_len, at_least(1))
      .add("global_batch_tokens", &BatchSection::global_batch_tokens, at_least(0))
      .add("grad_accum_steps", &BatchSection::grad_accum_steps, at_least(0));

  SectionKeys(k, "optim", &RunConfig::optim)
      .add("lr", &OptimSection::lr, greater_than(0))
      .add("betas", &OptimSection::betas, betas_rule)
      .add("eps", &OptimSection::eps, greater_than(0))
      .add("weight_decay", &OptimSection::weight_decay, at_least(0))
      .add("grad_clip", &OptimSection::grad_clip, at_least(0));

  SectionKeys(k, "schedule", &RunConfig::schedule)
      .add("total_steps", &ScheduleSection::total_steps, at_least(1))
      .add("warmup_steps", &ScheduleSection::warmup_steps, at_least(0))
      .add("decay", &ScheduleSection::decay, one_of({"cosine", "linear", "wsd", "constant"}))
      .add("min_lr_ratio", &ScheduleSection::min_lr_ratio, in_interval(0, 1, "[]"))
      .add("cooldown_fraction", &ScheduleSection::cooldown_fraction, in_interval(0, 1, "(]"));

  SectionKeys(k, "precision", &RunConfig::precision)
      .add("compute_dtype", &PrecisionSection::compute_dtype, one_of({"auto", "fp32", "bf16"}))
      .add("master_weights", &PrecisionSection::master_weights, one_of({"fp32"}))
      .add("fp8", &PrecisionSection::fp8, fp8_rule)
      .add("fp8_layers", &PrecisionSection::fp8_layers, fp8_layers_rule)
      .add("fp8_grad_format", &PrecisionSection::fp8_grad_format, one_of({"e5m2", "e4m3"}))
      .add("fp8_amax_history", &PrecisionSection::fp8_amax_history, in_interval(1, 1024, "[]"))
      .add("fp8_weight_gather", &PrecisionSection::fp8_weight_gather)
      .add("matmul_algos", &PrecisionSection::matmul_algos, matmul_algos_rule);

  SectionKeys(k, "data", &RunConfig::data)
      .add("train", &DataSection::train, not_empty)
      .add("val", &DataSection::val)  // "": no validation
      .add("val_every_steps", &DataSection::val_every_steps, at_least(0))
      .add("final_val", &DataSection::final_val)
      .add("val_tokens", &DataSection::val_tokens, at_least(0))
      .add("tokenizer", &DataSection::tokenizer, tokenizer_rule);

  SectionKeys(k, "eval", &RunConfig::eval)
      .add("task", &EvalSection::task)  // "": none
      .add("every_steps", &EvalSection::every_steps, at_least(0))
      .add("max_examples", &EvalSection::max_examples, at_least(0))
      .add("name", &EvalSection::name);  // "": from the task's file name

  SectionKeys(k, "checkpoint", &RunConfig::checkpoint)
      .add("dir", &CheckpointSection::dir)  // "": <out_dir>/checkpoints
      .add("every_steps", &CheckpointSection::every_steps, at_least(0))
      .add("final", &CheckpointSection::final)
      .add("keep_latest", &CheckpointSection::keep_latest, at_least(2))
      .add("keep_every", &CheckpointSection::keep_every, at_least(0))
      .add("save_timeout_s", &CheckpointSection::save_timeout_s, at_least(0))
      .add("resume", &CheckpointSection::resume, not_empty);  // "none", "auto" or a path

  SectionKeys(k, "logging", &RunConfig::logging)
      .add("every_steps", &LoggingSection::every_steps, at_least(1))
      .add("metrics_file", &LoggingSection::metrics_file, not_empty)
      .add("peak_tflops", &LoggingSection::peak_tflops, at_least(0))
      .add("flops_formula", &LoggingSection::flops_formula, one_of({"palm", "llmc"}))
      .add("sample_every", &LoggingSection::sample_every, at_least(0))
      .add("sample_prompt", &LoggingSection::sample_prompt)  // any text, "" included
      .add("sample_tokens", &LoggingSection::sample_tokens, at_least(1));

  return k;
}

}  // namespace

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = build_table();
  return keys;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> s;
    for (const auto& k : config_keys())
      if (s.empty() || s.back() != k.section) s.push_back(k.section);
    return s;
  }();
  return sections;
}

void check_section(const std::string& section) {
  const auto& sections = config_sections();
  if (std::find(sections.begin(), sections.end(), section) == sections.end())
    throw ConfigError("unknown section " + section + " (valid sections: " + join_names(sections) + ")");
}

const ConfigKey& find_key(const std::string& section, const std::string& name) {
  check_section(section);
  std::vector<std::string> names;
  for (const auto& k : config_keys()) {
    if (k.section != section) continue;
    if (k.name == name) return k;
    names.push_back(k.name);
  }
  throw ConfigError("unknown key " + section + "." + name + " (valid keys in " + section + ": " + join_names(names) + ")");
}

std::string key_value(const std::string& key, const json& value) { return key + "=" + value.dump(); }

}  // namespace pt::config
