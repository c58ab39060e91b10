#include "core/ckpt/manifest.h"

#include <algorithm>
#include <map>

#include "core/ckpt/checksum.h"

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
  m.model = get<json>(j, "model", path);
  m.layout = get<json>(j, "layout", path);
  m.config = get<json>(j, "config", path);

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

json model_shape_json(const ModelSection& m) {
  json j{{"arch", m.arch},           {"n_layers", m.n_layers},       {"d_model", m.d_model},
         {"n_heads", m.n_heads},     {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len},
         {"padded_vocab", m.padded_vocab}};
  // Llama's family keys, resolved (what the model is built with): they change the tensors'
  // shapes (n_kv_heads, ffn_hidden, an lm_head or none) or what the weights mean (norm_eps,
  // rope_theta). GPT-2 fixes all of them, so its keys (and the hash of old checkpoints) stay.
  if (m.is_llama()) {
    j["n_kv_heads"] = m.kv_heads();
    j["ffn_hidden"] = m.ffn_width();
    j["norm_eps"] = m.eps();
    j["rope_theta"] = m.rope_base();
    j["tie_embeddings"] = m.tied();
  }
  return j;
}

std::string model_hash(const ModelSection& m) {
  const std::string text = model_shape_json(m).dump();
  return checksum_hex(checksum64(text.data(), text.size()));
}

void check_model_shape(const Manifest& m, const ModelSection& cfg, const std::string& where) {
  const json want = model_shape_json(cfg);
  for (const auto& [key, value] : want.items()) {
    const auto have = m.model.find(key);
    if (have == m.model.end())
      throw CorruptCheckpoint(where + "/" + kManifestFile + ": \"model\" has no key " + key);
    if (*have != value)
      throw ConfigError("model." + key + "=" + value.dump() + " but the checkpoint " + where + " has " +
                        have->dump() + " (a checkpoint loads only into the model shape it was saved from)");
  }
}

int pad_multiple_for(int vocab_size, int padded_vocab) {
  const int def = ModelSection{}.pad_vocab_multiple;
  return (vocab_size + def - 1) / def * def == padded_vocab ? def : padded_vocab;
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
  if (s.is_llama()) {
    s.n_kv_heads = get<int>(m.model, "n_kv_heads", path);
    s.ffn_hidden = get<int>(m.model, "ffn_hidden", path);
    s.norm_eps = get<double>(m.model, "norm_eps", path);
    s.rope_theta = get<double>(m.model, "rope_theta", path);
    s.tie_embeddings = get<bool>(m.model, "tie_embeddings", path);
    valid = valid && s.n_kv_heads >= 1 && s.n_heads % s.n_kv_heads == 0 && s.ffn_hidden >= 1 && s.norm_eps > 0 &&
            s.norm_eps < 1 && s.rope_theta > 0;
  }
  if (!valid) throw CorruptCheckpoint(path + ": \"model\" " + m.model.dump() + " is not a valid model shape");
  s.pad_vocab_multiple = pad_multiple_for(s.vocab_size, s.padded_vocab);
  return s;
}

}  // namespace pt::ckpt
