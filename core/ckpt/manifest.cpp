#include "core/ckpt/manifest.h"

#include <algorithm>
#include <map>

#include "core/ckpt/checksum.h"
#include "core/ckpt/vocab_padding.h"
#include "core/model/architecture.h"

namespace pt::ckpt {
namespace {

using nlohmann::json;

// Field access that turns nlohmann's type errors into a CorruptCheckpoint naming the file.
template <class T>
T get(const json& j, const char* key, const std::string& path) {
  if (!j.is_object() || !j.contains(key)) throw CorruptCheckpoint(path + ": missing field \"" + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw CorruptCheckpoint(path + ": field \"" + key + "\" has the wrong type: " + j.at(key).dump());
  }
}

uint64_t parse_hex64(const std::string& s, const std::string& path) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw CorruptCheckpoint(path + ": checksum \"" + s + "\" is not 16 hex digits");
  return std::stoull(s, nullptr, 16);
}

size_t dtype_bytes(const std::string& dtype, const std::string& path) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16") return 2;
  throw CorruptCheckpoint(path + ": unknown dtype \"" + dtype + "\"");
}

}  // namespace

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const TensorEntry* Manifest::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

nlohmann::ordered_json manifest_to_json(const Manifest& m) {
  using oj = nlohmann::ordered_json;
  oj j;
  j["format"] = kFormatName;
  j["format_version"] = kFormatVersion;
  j["step"] = m.step;
  j["data"] = {{"cursor", m.cursor}, {"train_tokens", m.train_tokens}};
  j["schedule"] = {{"step", m.step}, {"total_steps", m.total_steps}, {"next_lr", m.next_lr}};
  j["rng"] = {{"seed", m.seed}};
  const HealthRecord& h = m.health;
  j["health"] = {{"skipped_steps", h.skipped_steps},
                 {"skipped_in_a_row", h.skipped_in_a_row},
                 {"skipped_since_save", h.skipped_since_save},
                 {"rollbacks", h.rollbacks},
                 {"recent_losses", h.recent_losses}};
  j["model"] = m.model;
  const std::string shape_text = m.model.dump();
  j["model_hash"] = checksum_hex(checksum64(shape_text.data(), shape_text.size()));
  j["layout"] = m.layout;
  j["checksum"] = kChecksumName;
  oj files = oj::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = files;
  oj tensors = oj::array();
  for (const auto& t : m.tensors) {
    oj chunks = oj::array();
    for (const auto& c : t.chunks) {
      oj chunk = {{"file", c.file}, {"offset", c.offset}, {"bytes", c.bytes}, {"begin", c.begin}, {"end", c.end}};
      if (c.strided()) {  // only then, so files of contiguous chunks are exactly as before strides
        chunk["run"] = c.run;
        chunk["stride"] = c.stride;
      }
      chunk["checksum"] = checksum_hex(c.checksum);
      chunks.push_back(std::move(chunk));
    }
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}, {"chunks", chunks}});
  }
  j["tensors"] = tensors;
  j["config"] = m.config;
  if (!m.tokenizer.is_null()) j["tokenizer"] = m.tokenizer;  // only then: files without one are as before
  return j;
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says where.
    const std::string what = e.what();
    const auto tag_end = what.find("] ");
    throw CorruptCheckpoint(path + " is not valid JSON (" +
                            (tag_end == std::string::npos ? what : what.substr(tag_end + 2)) + ")");
  }
  if (get<std::string>(j, "format", path) != kFormatName)
    throw CorruptCheckpoint(path + ": not a picotrain checkpoint manifest");
  const int version = get<int>(j, "format_version", path);
  if (version != kFormatVersion)
    throw CorruptCheckpoint(path + ": format_version " + std::to_string(version) + ", this build reads version " +
                            std::to_string(kFormatVersion));
  const std::string algo = get<std::string>(j, "checksum", path);
  if (algo != kChecksumName)
    throw CorruptCheckpoint(path + ": checksum algorithm \"" + algo + "\" is unknown (this build uses " +
                            kChecksumName + ")");

  Manifest m;
  m.step = get<int>(j, "step", path);
  const json data = get<json>(j, "data", path);
  m.cursor = get<uint64_t>(data, "cursor", path);
  m.train_tokens = get<uint64_t>(data, "train_tokens", path);
  const json schedule = get<json>(j, "schedule", path);
  m.total_steps = get<int>(schedule, "total_steps", path);
  m.next_lr = get<double>(schedule, "next_lr", path);
  m.seed = get<uint64_t>(get<json>(j, "rng", path), "seed", path);
  if (j.contains("health")) {  // absent in checkpoints written before the run's guards
    const json h = get<json>(j, "health", path);
    m.health.skipped_steps = get<int>(h, "skipped_steps", path);
    m.health.skipped_in_a_row = get<int>(h, "skipped_in_a_row", path);
    m.health.skipped_since_save = get<int>(h, "skipped_since_save", path);
    m.health.rollbacks = get<int>(h, "rollbacks", path);
    m.health.recent_losses = get<std::vector<double>>(h, "recent_losses", path);
  }
  m.model = get<json>(j, "model", path);
  m.layout = get<json>(j, "layout", path);
  m.config = get<json>(j, "config", path);
  if (j.contains("tokenizer")) m.tokenizer = get<json>(j, "tokenizer", path);  // absent before tokenizers were recorded

  std::map<std::string, uint64_t> file_size;
  for (const auto& f : get<json>(j, "files", path)) {
    FileEntry e{get<std::string>(f, "name", path), get<uint64_t>(f, "bytes", path)};
    // File names are plain names inside the checkpoint directory, never paths out of it.
    if (e.name.empty() || e.name.find('/') != std::string::npos || e.name[0] == '.')
      throw CorruptCheckpoint(path + ": file name \"" + e.name + "\" is not a plain file name");
    file_size[e.name] = e.bytes;
    m.files.push_back(std::move(e));
  }

  for (const auto& t : get<json>(j, "tensors", path)) {
    TensorEntry e;
    e.name = get<std::string>(t, "name", path);
    e.shape = get<std::vector<int64_t>>(t, "shape", path);
    e.dtype = get<std::string>(t, "dtype", path);
    const std::string what = path + ": tensor " + e.name;
    if (std::any_of(e.shape.begin(), e.shape.end(), [](int64_t d) { return d < 0; }))
      throw CorruptCheckpoint(what + " has a negative dimension");
    const size_t esize = dtype_bytes(e.dtype, path);
    for (const auto& c : get<json>(t, "chunks", path)) {
      Chunk k;
      k.file = get<std::string>(c, "file", path);
      k.offset = get<uint64_t>(c, "offset", path);
      k.bytes = get<uint64_t>(c, "bytes", path);
      k.begin = get<uint64_t>(c, "begin", path);
      k.end = get<uint64_t>(c, "end", path);
      k.checksum = parse_hex64(get<std::string>(c, "checksum", path), path);
      if (c.contains("run") || c.contains("stride")) {
        k.run = get<uint64_t>(c, "run", path);
        k.stride = get<uint64_t>(c, "stride", path);
      }
      const auto f = file_size.find(k.file);
      if (f == file_size.end()) throw CorruptCheckpoint(what + ": chunk file " + k.file + " is not in \"files\"");
      std::string range = "[";  // (appended: GCC 12 warns falsely about "[" + std::string)
      range += std::to_string(k.begin) + ", " + std::to_string(k.end) + ")";
      if (c.contains("run") && (k.run == 0 || k.stride < k.run))
        throw CorruptCheckpoint(what + ": strided chunk " + range + " has run " + std::to_string(k.run) +
                                " and stride " + std::to_string(k.stride) + " (needs 0 < run <= stride)");
      if (k.begin >= k.end || k.end > e.numel())
        throw CorruptCheckpoint(what + ": chunk " + range + " is outside the tensor's " + std::to_string(e.numel()) +
                                " elements");
      // Checked from the extent (already inside the tensor), so no product below can overflow.
      if (k.strided() && (k.end - k.begin < k.run || (k.end - k.begin - k.run) % k.stride != 0))
        throw CorruptCheckpoint(what + ": strided chunk " + range + " is not whole runs of " + std::to_string(k.run) +
                                " elements every " + std::to_string(k.stride));
      if (k.bytes != k.numel() * esize)
        throw CorruptCheckpoint(what + ": chunk of " + std::to_string(k.numel()) + " elements has " +
                                std::to_string(k.bytes) + " bytes");
      if (k.offset + k.bytes > f->second)
        throw CorruptCheckpoint(what + ": chunk at byte " + std::to_string(k.offset) + " runs past the end of " +
                                k.file);
      e.chunks.push_back(std::move(k));
    }
    m.tensors.push_back(std::move(e));
  }
  return m;
}

namespace {
// Whether some block of `m` has a dense MLP of width ffn_hidden: every block of a dense model;
// a model with experts only when some blocks are not sparse (moe.every > 1). Its shared experts
// are moe.n_shared_experts x expert_hidden wide, whatever ffn_hidden says.
bool has_dense_blocks(const ModelSection& m) { return !m.moe.enabled() || m.moe.every > 1; }
}  // namespace

json model_shape_json(const ModelSection& m) {
  json j{{"arch", m.arch},           {"n_layers", m.n_layers},       {"d_model", m.d_model},
         {"n_heads", m.n_heads},     {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len},
         {"padded_vocab", m.padded_vocab}};
  // Llama's family keys, resolved (what the model is built with): they change the tensors'
  // shapes (n_kv_heads, ffn_hidden, an lm_head or none) or what the weights mean (norm_eps,
  // rope_theta). GPT-2 fixes all of them, so its keys (and the hash of old checkpoints) stay.
  if (m.is_llama()) {
    j["n_kv_heads"] = m.kv_heads();
    // Left out when no block has a dense MLP (Mixtral): it shapes nothing there, and a model
    // imported from Hugging Face, which has no such width, would otherwise differ from the one
    // exported.
    if (has_dense_blocks(m)) j["ffn_hidden"] = m.ffn_width();
    j["norm_eps"] = m.eps();
    j["rope_theta"] = m.rope_base();
    j["tie_embeddings"] = m.tied();
  }
  // The experts' keys, only for a model with experts (a dense model's keys and hash stay as
  // they were). moe.aux_loss_coef is not among them: it weighs the training objective, shapes
  // no tensor and may change between runs; the manifest's config records it.
  if (m.moe.enabled()) {
    const MoeSection& e = m.moe;
    j["moe"] = {{"n_experts", e.n_experts},
                {"top_k", e.top_k},
                {"expert_hidden", describe_architecture(m).expert_hidden},  // resolved
                {"every", e.every},
                {"n_shared_experts", e.n_shared_experts}};
  }
  return j;
}

std::string model_hash(const ModelSection& m) {
  const std::string text = model_shape_json(m).dump();
  return checksum_hex(checksum64(text.data(), text.size()));
}

namespace {

// A model-shape JSON's keys by the config key each comes from: for a model with experts
// "moe.n_experts", ... first (the manifest keeps the moe section in its own object; other keys
// follow from it, e.g. whether there is an ffn_hidden), then "model.d_model", ....
std::vector<std::pair<std::string, json>> config_keys_of(const json& shape) {
  std::vector<std::pair<std::string, json>> keys;
  if (shape.contains("moe") && shape["moe"].is_object())
    for (const auto& [k, v] : shape["moe"].items()) keys.emplace_back("moe." + k, v);
  for (const auto& [key, value] : shape.items())
    if (key != "moe") keys.emplace_back("model." + key, value);
  return keys;
}

const json* find_key(const std::vector<std::pair<std::string, json>>& keys, const std::string& name) {
  for (const auto& [k, v] : keys)
    if (k == name) return &v;
  return nullptr;
}

}  // namespace

void check_model_shape(const Manifest& m, const ModelSection& cfg, const std::string& where) {
  const json want = model_shape_json(cfg);
  const char* loads_only = " (a checkpoint loads only into the model shape it was saved from)";
  // Experts or none first: every other difference between the two follows from it.
  const bool has_experts = m.model.is_object() && m.model.contains("moe");
  if (cfg.moe.enabled() && !has_experts)
    throw ConfigError("moe.n_experts=" + std::to_string(cfg.moe.n_experts) + " but the checkpoint " + where +
                      " holds a dense model (no experts)" + loads_only);
  if (!cfg.moe.enabled() && has_experts)
    throw ConfigError("moe.n_experts=0 (a dense model) but the checkpoint " + where + " holds a model with experts " +
                      m.model.at("moe").dump() + loads_only);
  const auto have = config_keys_of(m.model);
  const auto wanted = config_keys_of(want);
  for (const auto& [key, value] : wanted) {
    const json* got = find_key(have, key);
    if (!got) throw CorruptCheckpoint(where + "/" + kManifestFile + ": \"model\" has no key " + key);
    if (*got != value)
      throw ConfigError(key + "=" + value.dump() + " but the checkpoint " + where + " has " + got->dump() + loads_only);
  }
  for (const auto& [key, value] : have)
    if (!find_key(wanted, key))
      throw ConfigError("the checkpoint " + where + " has " + key + "=" + value.dump() +
                        ", which the configured model does not" + loads_only);
}

ModelSection model_from_manifest(const Manifest& m, const std::string& where) {
  const std::string path = where + "/" + kManifestFile;
  ModelSection s;
  s.arch = get<std::string>(m.model, "arch", path);
  s.n_layers = get<int>(m.model, "n_layers", path);
  s.d_model = get<int>(m.model, "d_model", path);
  s.n_heads = get<int>(m.model, "n_heads", path);
  s.vocab_size = get<int>(m.model, "vocab_size", path);
  s.max_seq_len = get<int>(m.model, "max_seq_len", path);
  s.padded_vocab = get<int>(m.model, "padded_vocab", path);
  bool valid = s.n_layers >= 1 && s.d_model >= 1 && s.n_heads >= 1 && s.d_model % s.n_heads == 0 &&
               s.vocab_size >= 1 && s.padded_vocab >= s.vocab_size && s.max_seq_len >= 1;
  if (m.model.contains("moe")) {
    const json e = get<json>(m.model, "moe", path);
    MoeSection& x = s.moe;
    x.n_experts = get<int>(e, "n_experts", path);
    x.top_k = get<int>(e, "top_k", path);
    x.expert_hidden = get<int>(e, "expert_hidden", path);
    x.every = get<int>(e, "every", path);
    x.n_shared_experts = get<int>(e, "n_shared_experts", path);
    valid = valid && s.is_llama() && x.n_experts >= 1 && x.top_k >= 1 && x.top_k <= x.n_experts &&
            x.expert_hidden >= 1 && x.every >= 1 && x.every <= s.n_layers && x.n_shared_experts >= 0;
    // The balancing loss's weight is the writer's config's (see model_shape_json); a manifest
    // without it keeps the default.
    if (m.config.is_object() && m.config.contains("moe") && m.config.at("moe").contains("aux_loss_coef"))
      x.aux_loss_coef = get<double>(m.config.at("moe"), "aux_loss_coef", path);
    valid = valid && x.aux_loss_coef >= 0;
  }
  if (s.is_llama()) {
    s.n_kv_heads = get<int>(m.model, "n_kv_heads", path);
    if (has_dense_blocks(s)) s.ffn_hidden = get<int>(m.model, "ffn_hidden", path);
    s.norm_eps = get<double>(m.model, "norm_eps", path);
    s.rope_theta = get<double>(m.model, "rope_theta", path);
    s.tie_embeddings = get<bool>(m.model, "tie_embeddings", path);
    valid = valid && s.n_kv_heads >= 1 && s.n_heads % s.n_kv_heads == 0 &&
            (!has_dense_blocks(s) || s.ffn_hidden >= 1) && s.norm_eps > 0 && s.norm_eps < 1 && s.rope_theta > 0;
  }
  if (!valid) throw CorruptCheckpoint(path + ": \"model\" " + m.model.dump() + " is not a valid model shape");
  s.pad_vocab_multiple = pad_multiple_for(s.vocab_size, s.padded_vocab);
  return s;
}

}  // namespace pt::ckpt
