// Shared by the Hugging Face folder tests (test_hf_export.cpp, test_hf_llama.cpp,
// test_hf_mixtral.cpp; a file's bytes and a checkpoint's weights are in ckpt_test_support.h): weights-only
// checkpoints of random weights, what export_hf and import_hf say, and rewriting a folder's
// model.safetensors and config.json with an edit, to make the malformed and foreign folders the
// importer must refuse. For the Llama family (LlamaForCausalLM, MixtralForCausalLM): the tiny
// Llama and Mixtral the tests export, the state dict transformers gives them, and the checks of
// what they share: the model.safetensors bytes, config.json's shared keys, the import back.
#pragma once
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/imported_checkpoint.h"
#include "core/ckpt/manifest.h"
#include "core/ckpt/safetensors.h"
#include "core/common/counter_rng.h"
#include "core/model/param_table.h"

namespace pt::test {

using Catch::Matchers::Contains;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Weights that differ in every element (the norms too, which start at 1), padded vocabulary rows
// zero as training keeps them.
inline std::vector<float> random_weights(const ParamTable& table) {
  std::vector<float> w(table.total_numel(), 0.0f);
  for (const ParamSpec& p : table.specs()) {
    const size_t row = p.global_shape.size() == 2 ? static_cast<size_t>(p.global_shape[1]) : 1;
    const size_t live = p.live_rows < 0 ? p.numel : static_cast<size_t>(p.live_rows) * row;
    for (size_t i = 0; i < live; i++)
      w[p.offset + i] = static_cast<float>(counter_uniform(5, hash_name(p.name), i) - 0.5);
  }
  return w;
}

// A weights-only checkpoint of `model` in <fx.dir>/<name>, as an import writes one.
inline std::string write_weights_checkpoint(const CkptFixture& fx, const ModelSection& model,
                                            const std::vector<float>& w, const std::string& name) {
  const std::string dir = (fx.dir / name).string();
  ckpt::write_imported_checkpoint(dir, model, build_param_table(model), w, "test");
  return dir;
}

// What `f` throws, or `done` when it returns.
inline std::string error_or(const std::function<void()>& f, const std::string& done) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return done;
}

// What import_hf says about a folder: its error, or "(accepted)".
inline std::string import_error(const std::string& folder, const std::string& out) {
  const std::string said = error_or([&] { ckpt::import_hf(folder, out); }, "(accepted)");
  if (said == "(accepted)") fs::remove_all(out);
  return said;
}

// What export_hf (f32) says about a checkpoint: its error, or "(exported)".
inline std::string export_error(const std::string& ckpt, const std::string& out) {
  return error_or([&] { ckpt::export_hf(ckpt, out, ckpt::HfDtype::f32); }, "(exported)");
}

// The tensors of a safetensors file as fp32, in data order, to rewrite it with an edit.
struct LoadedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
inline std::vector<LoadedTensor> load_all(const std::string& path) {
  ckpt::SafetensorsFile f(path);
  std::vector<LoadedTensor> out;
  for (const ckpt::StTensor& t : f.tensors()) out.push_back({t.name, t.shape, f.read_f32(t.name, t.shape)});
  return out;
}

// A copy of the folder `src` in `dst` whose model.safetensors (F32) holds `edit(tensors)`,
// and whose config.json is `edit_config(config)`.
inline void rewrite_folder(const std::string& src, const std::string& dst,
                           const std::function<void(std::vector<LoadedTensor>&)>& edit,
                           const std::function<void(nlohmann::json&)>& edit_config = {}) {
  fs::remove_all(dst);
  fs::create_directories(dst);
  nlohmann::json config = nlohmann::json::parse(read_text(src + "/config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dst + "/config.json") << config.dump(2);
  std::vector<LoadedTensor> tensors = load_all(src + "/model.safetensors");
  edit(tensors);
  std::vector<ckpt::StTensor> declared;
  for (const auto& t : tensors) declared.push_back({t.name, ckpt::kStF32, t.shape});
  ckpt::SafetensorsWriter w(dst + "/model.safetensors", declared);
  for (const auto& t : tensors) w.write(t.name, t.data.data(), t.data.size() * 4);
  w.commit();
}

// A folder saved from the base model alone (LlamaModel, MixtralModel): its tensors' names
// without "model.".
inline void strip_model_prefix(std::vector<LoadedTensor>& ts) {
  for (auto& t : ts)
    if (t.name.rfind("model.", 0) == 0) t.name = t.name.substr(6);
}

// What import_hf says about a copy of the folder `hf` in `bad` whose config.json is `edit`ed.
inline std::string config_refusal(const std::string& hf, const std::string& bad, const std::string& out,
                                  const std::function<void(json&)>& edit) {
  rewrite_folder(
      hf, bad, [](auto&) {}, edit);
  return import_error(bad, out);
}

inline LoadedTensor* tensor_named(std::vector<LoadedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

// ---- the Llama family: LlamaForCausalLM and MixtralForCausalLM -------------------------------

// The fixture's 2 layers of d_model 32 (vocabulary 200 padded to 256) as a Llama of 4 query
// heads over 2 key/value heads (head_dim 8); eps and theta not the defaults, so the config
// shows they travel. kHfLlama's MLP is 48 wide; kHfMixtral's blocks are kTinyMoe's experts.
inline const std::vector<std::string> kHfLlamaFamily = {"model.arch=llama", "model.n_heads=4", "model.n_kv_heads=2",
                                                        "model.norm_eps=1e-6", "model.rope_theta=500000"};
inline const std::vector<std::string> kHfLlama = with(kHfLlamaFamily, {"model.ffn_hidden=48"});
inline const std::vector<std::string> kHfMixtral = with(kHfLlamaFamily, kTinyMoe);

// A model as the tables' tests name it: 3 layers, d_model 64, 8 query heads over 2 key/value
// heads, GPT-2's vocabulary.
inline ModelSection gpt2_vocab_llama() {
  ModelSection m;
  m.arch = "llama";
  m.n_layers = 3;
  m.d_model = 64;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.vocab_size = 50257;
  m.padded_vocab = 50304;
  m.max_seq_len = 128;
  return m;
}

// The Hugging Face tensors of `table` by the Llama family's rules `a`: one for each parameter,
// named as it is (picotrain's names are Hugging Face's), none transposed, the embedding and an
// untied head losing the padded vocabulary rows.
inline std::vector<ckpt::HfTensor> check_llama_family_tensors(const ckpt::HfArchitecture& a, const ParamTable& table,
                                                             const ModelSection& m) {
  std::vector<ckpt::HfTensor> ts = ckpt::hf_tensors(a, table, m);
  REQUIRE(ts.size() == table.specs().size());
  for (const ckpt::HfTensor& t : ts) {
    CHECK(t.name == t.param->name);
    CHECK_FALSE(t.transpose);
    CHECK(t.vocab_rows == (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight"));
  }
  return ts;
}

// A state dict: tensor names and shapes.
using HfStateDict = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Hugging Face's state dict of a LlamaForCausalLM or MixtralForCausalLM, in the order of
// picotrain's table for Llama, with the shapes transformers gives its modules (nn.Embedding
// [vocab, C], nn.Linear [out, in], the RMSNorms [C]), written out here from Hugging Face's
// definitions: each block's norms and attention, then `mlp` (names after "model.layers.N.").
inline HfStateDict llama_family_state_dict(int layers, int64_t vocab, int64_t C, int64_t q, int64_t kv,
                                           const HfStateDict& mlp, bool tied) {
  HfStateDict s = {{"model.embed_tokens.weight", {vocab, C}}};
  for (int l = 0; l < layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {C}});
    s.push_back({p + "self_attn.q_proj.weight", {q, C}});
    s.push_back({p + "self_attn.k_proj.weight", {kv, C}});
    s.push_back({p + "self_attn.v_proj.weight", {kv, C}});
    s.push_back({p + "self_attn.o_proj.weight", {C, q}});
    s.push_back({p + "post_attention_layernorm.weight", {C}});
    for (const auto& [name, shape] : mlp) s.push_back({p + name, shape});
  }
  s.push_back({"model.norm.weight", {C}});
  if (!tied) s.push_back({"lm_head.weight", {vocab, C}});
  return s;
}

// A weights-only checkpoint of random weights of the model `sets` make (<fx.dir>/ckpt), exported
// as f32 to <fx.dir>/hf.
struct ExportedModel {
  RunConfig cfg;
  ParamTable table;
  std::vector<float> w;
  std::string ckpt, hf;
};
inline ExportedModel export_random_model(const CkptFixture& fx, const std::vector<std::string>& sets) {
  const RunConfig cfg = fx.config(sets);
  REQUIRE(cfg.model.padded_vocab == 256);
  ParamTable table = build_param_table(cfg.model);
  std::vector<float> w = random_weights(table);
  const std::string ckpt = write_weights_checkpoint(fx, cfg.model, w, "ckpt");
  const std::string hf = (fx.dir / "hf").string();
  CHECK(ckpt::export_hf(ckpt, hf, ckpt::HfDtype::f32) == ckpt + "/step_00000000");
  CHECK(ckpt::is_hf_model_folder(hf));
  return {cfg, std::move(table), std::move(w), ckpt, hf};
}

// model.safetensors of an f32 export, byte by byte: the header's length, its JSON padded to a
// multiple of 8, the metadata, then tensor after tensor in the table's order, packed, each with
// `want`'s name and shape (and no other), F32, and the first rows of picotrain's tensor as they
// are: no transpose, padding rows dropped.
inline void check_f32_safetensors(const std::string& path, const ParamTable& table, const std::vector<float>& w,
                                  const HfStateDict& want) {
  const std::map<std::string, std::vector<int64_t>> shapes(want.begin(), want.end());
  const std::vector<char> bytes = file_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  REQUIRE(8 + n <= bytes.size());
  CHECK((8 + n) % 8 == 0);
  const ojson h = ojson::parse(std::string(bytes.data() + 8, n));
  CHECK(h["__metadata__"] == ojson{{"format", "pt"}});
  REQUIRE(h.size() == want.size() + 1);
  const char* data = bytes.data() + 8 + n;
  uint64_t at = 0;
  size_t i = 0;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    INFO(name);
    REQUIRE(i < table.specs().size());
    const ParamSpec& p = table.specs()[i++];
    CHECK(name == p.name);
    REQUIRE(shapes.count(name) == 1);
    const std::vector<int64_t>& shape = shapes.at(name);
    CHECK(e["dtype"] == "F32");
    CHECK(e["shape"].get<std::vector<int64_t>>() == shape);
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    CHECK(e["data_offsets"] == ojson{at, at + numel * 4});
    CHECK(std::memcmp(data + at, w.data() + p.offset, numel * 4) == 0);
    at += numel * 4;
  }
  CHECK(8 + n + at == bytes.size());
}

// config.json's keys that LlamaConfig and MixtralConfig share, for the tiny model of
// kHfLlamaFamily: the class, its model_type and intermediate_size (the MLP's or one expert's
// width) as given.
inline void check_llama_family_config(const json& c, const std::string& class_name, const std::string& model_type,
                                      int intermediate_size) {
  CHECK(c["architectures"] == json{class_name});
  CHECK(c["model_type"] == model_type);
  CHECK(c["vocab_size"] == 200);
  CHECK(c["hidden_size"] == 32);
  CHECK(c["intermediate_size"] == intermediate_size);
  CHECK(c["num_hidden_layers"] == 2);
  CHECK(c["num_attention_heads"] == 4);
  CHECK(c["num_key_value_heads"] == 2);
  CHECK(c["head_dim"] == 8);
  CHECK(c["hidden_act"] == "silu");
  CHECK(c["max_position_embeddings"] == 64);
  CHECK(c["rms_norm_eps"] == 1e-6);
  CHECK(c["rope_theta"] == 500000.0);
  CHECK(c["rope_scaling"].is_null());
  CHECK(c["tie_word_embeddings"] == false);
  CHECK(c["torch_dtype"] == "float32");
  CHECK(c["initializer_range"] == 0.02);
  CHECK(c["attention_dropout"] == 0.0);
  CHECK(c["bos_token_id"].is_null());  // no <|endoftext|> in a 200-token vocabulary
  CHECK(c["eos_token_id"].is_null());
}

// import_hf of the exported model's folder into <fx.dir>/imported: the model, its manifest and
// the weights, bit for bit (every master tensor's chunks carry the same checksums as the
// exported checkpoint's). The model read back from the manifest, with kHfLlamaFamily's
// attention, norms and RoPE.
inline ModelSection check_import_bit_for_bit(const CkptFixture& fx, const ExportedModel& x) {
  const std::string imported = (fx.dir / "imported").string();
  CHECK(ckpt::import_hf(x.hf, imported) == imported + "/step_00000000");
  CHECK(same_bytes(checkpoint_weights(imported, x.table), x.w));
  ckpt::CheckpointReader r(ckpt::resolve_checkpoint_path(imported, "test"));
  ckpt::CheckpointReader orig(ckpt::resolve_checkpoint_path(x.ckpt, "test"));
  CHECK(r.manifest().model == ckpt::model_shape_json(x.cfg.model));
  CHECK(r.manifest().model == orig.manifest().model);
  REQUIRE(r.manifest().tensors.size() == orig.manifest().tensors.size());
  for (size_t i = 0; i < r.manifest().tensors.size(); i++) {
    const ckpt::TensorEntry &a = r.manifest().tensors[i], &b = orig.manifest().tensors[i];
    INFO(a.name);
    CHECK(a.name == b.name);
    REQUIRE(a.chunks.size() == b.chunks.size());
    for (size_t c = 0; c < a.chunks.size(); c++) CHECK(a.chunks[c].checksum == b.chunks[c].checksum);
  }
  const ModelSection back = ckpt::model_from_manifest(r.manifest(), imported);
  CHECK(back.arch == "llama");
  CHECK(back.kv_heads() == 2);
  CHECK(back.eps() == 1e-6);
  CHECK(back.rope_base() == 500000.0);
  CHECK(back.padded_vocab == 256);
  return back;
}

}  // namespace pt::test
