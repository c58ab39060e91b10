#include "core/ckpt/hf_model_folder.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/durable_io.h"
#include "core/ckpt/imported_checkpoint.h"
#include "core/ckpt/llmc_model_file.h"
#include "core/ckpt/manifest.h"
#include "core/ckpt/hf_tokenizer_files.h"
#include "core/ckpt/safetensors.h"
#include "core/common/console.h"
#include "core/common/error.h"
#include "core/model/model_tokenizer.h"
#include "core/model/sampler.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

namespace {

std::string in_folder(const std::string& dir, const char* file) { return (fs::path(dir) / file).string(); }

// Every parameter the architecture exports must be in the checkpoint with its global shape:
// the manifest, not only the model keys, says what is there.
void check_checkpoint_tensors(const Manifest& manifest, const std::vector<HfTensor>& tensors, const std::string& dir) {
  for (const HfTensor& t : tensors) {
    const std::string name = "master/" + t.param->name;
    const TensorEntry* e = manifest.find(name);
    if (!e) throw CorruptCheckpoint(dir + ": the checkpoint has no tensor " + name);
    if (e->shape != t.param->global_shape)
      throw CorruptCheckpoint(dir + ": tensor " + name + " has shape " + shape_text(e->shape) + ", the model needs " +
                              shape_text(t.param->global_shape));
  }
}

// The export target: created when missing; never a picotrain checkpoint directory, whose
// files an export would mix with.
void prepare_export_dir(const std::string& out_dir) {
  if (fs::exists(in_folder(out_dir, kManifestFile)) || fs::exists(in_folder(out_dir, "latest")))
    throw ConfigError("convert --to " + out_dir + " is a picotrain checkpoint directory; choose another folder");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw RuntimeError("cannot create directory " + out_dir + ": " + ec.message());
}

nlohmann::json read_config(const std::string& path) {
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(read_small_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(path + " is not valid JSON (" + e.what() + ")");
  }
  if (!c.is_object()) throw RuntimeError(path + " is not a JSON object");
  if (!c.contains("model_type") || !c["model_type"].is_string())
    throw RuntimeError(path + " has no \"model_type\" string: it does not describe a transformers model");
  return c;
}

// model.safetensors, or why the folder has none we can read.
std::string weights_file(const std::string& dir) {
  const std::string path = in_folder(dir, kHfWeightsFile);
  if (fs::exists(path)) return path;
  if (fs::exists(in_folder(dir, "model.safetensors.index.json")))
    throw RuntimeError(dir + " holds a sharded model (model.safetensors.index.json); picotrain reads one " +
                       kHfWeightsFile + " (save it with save_pretrained(..., max_shard_size=\"100GB\"))");
  if (fs::exists(in_folder(dir, "pytorch_model.bin")))
    throw RuntimeError(dir +
                       " holds pytorch_model.bin (a pickle, which picotrain does not read); save it with "
                       "save_pretrained(..., safe_serialization=True) to get " +
                       kHfWeightsFile);
  throw RuntimeError(dir + " has config.json but no " + kHfWeightsFile);
}

// The name tensor `hf_name` has in the file: itself, or without the base-model prefix (a
// folder saved from the base model alone). Empty when neither is there.
std::string name_in_file(const SafetensorsFile& f, const std::string& hf_name, const std::string& prefix) {
  const bool full = f.find(hf_name) != nullptr;
  const bool bare = !prefix.empty() && hf_name.rfind(prefix, 0) == 0 && f.find(hf_name.substr(prefix.size()));
  if (full && bare)
    throw RuntimeError(f.path() + " holds both " + hf_name + " and " + hf_name.substr(prefix.size()) +
                       "; which one is the model's is ambiguous");
  if (full) return hf_name;
  if (bare) return hf_name.substr(prefix.size());
  return {};
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The tokenizer an export ships: the one the checkpoint records (which must load), else the one
// its vocabulary implies when its files are here; null when there is none (the folder then has
// no tokenizer files, as before checkpoints recorded one).
std::unique_ptr<Tokenizer> exported_tokenizer(const Manifest& manifest, const std::string& dir, const ModelSection& m) {
  if (!manifest.tokenizer.is_null()) return tokenizer_for_checkpoint(dir, m, "", "");
  const std::string name = tokenizer_for_vocab(m.vocab_size);
  if (name.empty()) return nullptr;
  try {
    return make_tokenizer(name);
  } catch (const ConfigError& e) {
    print_line(Stream::err, std::string("warning   | convert: no tokenizer files in the folder: ") + e.what());
    return nullptr;
  }
}

// The tokenizer.json of an imported folder, when picotrain can read it and it fits the model: the
// imported checkpoint records it. One it cannot read (a SentencePiece model) is left out with a
// warning: the weights are still the model.
std::string imported_tokenizer(const std::string& in_dir, const ModelSection& m) {
  if (!fs::exists(in_folder(in_dir, kTokenizerFile))) return "";
  try {
    const HfTokenizer tok(in_dir, in_dir);
    check_tokenizer_fits(tok, m.vocab_size, "the tokenizer of " + in_dir);
    return in_dir;
  } catch (const ConfigError& e) {
    print_line(Stream::err, std::string("warning   | convert: the imported checkpoint records no tokenizer: ") + e.what());
    return "";
  }
}

}  // namespace

bool is_hf_model_folder(const std::string& dir) {
  // A run directory used as its own checkpoint.dir holds picotrain's resolved config.json
  // beside `latest`: that is a checkpoint directory, not a Hugging Face folder.
  return fs::is_directory(dir) && fs::is_regular_file(in_folder(dir, kHfConfigFile)) &&
         !fs::exists(in_folder(dir, kManifestFile)) && !fs::exists(in_folder(dir, "latest"));
}

std::string export_hf(const std::string& checkpoint, const std::string& out_dir, HfDtype dtype) {
  const std::string dir = resolve_checkpoint_path(checkpoint, "convert --from " + checkpoint);
  CheckpointReader r(dir);
  const ModelSection m = model_from_manifest(r.manifest(), dir);
  const HfArchitecture& arch = hf_architecture_for_model(m);
  const ParamTable table = arch.param_table(m);
  const std::vector<HfTensor> tensors = hf_tensors(arch, table, m);
  check_checkpoint_tensors(r.manifest(), tensors, dir);
  prepare_export_dir(out_dir);

  std::vector<StTensor> declared;
  for (const HfTensor& t : tensors) declared.push_back({t.name, safetensors_dtype_name(dtype), t.shape});
  SafetensorsWriter out(in_folder(out_dir, kHfWeightsFile), std::move(declared));
  std::vector<float> src, hf;
  std::vector<uint16_t> half;
  for (const HfTensor& t : tensors) {
    src.resize(t.param->numel);
    r.read_all("master/" + t.param->name, src.size(), src.data());
    hf.resize(t.numel());
    to_hf(t, src.data(), hf.data());
    if (dtype == HfDtype::f32) {
      out.write(t.name, hf.data(), hf.size() * sizeof(float));
    } else {
      half.resize(hf.size());
      for (size_t i = 0; i < hf.size(); i++) half[i] = f32_to_bf16(hf[i]);
      out.write(t.name, half.data(), half.size() * sizeof(uint16_t));
    }
  }
  out.commit();
  nlohmann::ordered_json config = arch.config_json(m, dtype);
  if (const std::unique_ptr<Tokenizer> tok = exported_tokenizer(r.manifest(), dir, m))
    if (const auto special = write_hf_tokenizer_files(*tok, m, out_dir)) {
      config["bos_token_id"] = special->bos_id >= 0 ? nlohmann::ordered_json(special->bos_id) : nullptr;
      config["eos_token_id"] = special->eos_id >= 0 ? nlohmann::ordered_json(special->eos_id) : nullptr;
    }
  // config.json last: a folder with a new config.json has the weights and tokenizer it describes.
  write_file_atomic(in_folder(out_dir, kHfConfigFile), config.dump(2) + "\n");
  return dir;
}

std::string import_hf(const std::string& in_dir, const std::string& out_dir) {
  const std::string config_path = in_folder(in_dir, kHfConfigFile);
  const nlohmann::json config = read_config(config_path);
  const HfArchitecture& arch = hf_architecture_for_model_type(config["model_type"].get<std::string>(), config_path);
  const ModelSection m = arch.model_from_config(config, config_path);
  const SafetensorsFile f(weights_file(in_dir));
  refuse_nonempty_import_target(out_dir);

  const ParamTable table = arch.param_table(m);
  const std::vector<HfTensor> tensors = hf_tensors(arch, table, m);
  std::vector<float> weights(table.total_numel());
  std::map<std::string, std::string> used;  // name in the file -> Hugging Face name
  for (const HfTensor& t : tensors) {
    const std::string name = name_in_file(f, t.name, arch.base_prefix);
    if (name.empty())
      throw RuntimeError(f.path() + " has no tensor " + t.name + ", which the " + arch.class_name + " of " +
                         config_path + " needs" +
                         (t.name == arch.tied_head ? " (its tie_word_embeddings is false: the head is not the embedding)"
                                                   : ""));
    const std::vector<float> data = f.read_f32(name, t.shape);
    from_hf(t, data.data(), weights.data() + t.param->offset);
    used[name] = t.name;
  }

  for (const StTensor& st : f.tensors()) {
    if (used.count(st.name)) continue;
    bool ignored = false;
    for (const auto& suffix : arch.ignored_suffixes) ignored = ignored || ends_with(st.name, suffix);
    if (ignored) continue;
    if (!arch.tied_head.empty() && st.name == arch.tied_head) {
      // An older save of a tied head: it must be the embedding, or this is not the model
      // picotrain would compute.
      const auto tied = std::find_if(used.begin(), used.end(), [&](const auto& u) { return u.second == arch.tied_to; });
      check(tied != used.end(), "the tied head's embedding " + arch.tied_to + " was not read");
      const std::vector<float> embedding = f.read_f32(tied->first, f.find(tied->first)->shape);
      const std::vector<float> head = f.read_f32(st.name, f.find(tied->first)->shape);
      if (std::memcmp(head.data(), embedding.data(), head.size() * sizeof(float)) != 0)
        throw RuntimeError(f.path() + ": tensor " + st.name + " differs from " + tied->first + "; picotrain's " +
                           arch.arch + " ties its head to the token embedding");
      continue;
    }
    throw RuntimeError(f.path() + ": tensor " + st.name + " is not a parameter of " + arch.class_name +
                       " as picotrain builds it (config " + config_path + ")");
  }
  return write_imported_checkpoint(out_dir, m, table, weights, in_dir, imported_tokenizer(in_dir, m));
}

}  // namespace pt::ckpt
