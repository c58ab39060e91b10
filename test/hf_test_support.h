// Shared by the Hugging Face folder tests (test_hf_export.cpp, test_hf_llama.cpp,
// test_hf_mixtral.cpp): a file's raw bytes, a checkpoint's weights in table order, weights-only
// checkpoints of random weights, what import_hf says about a folder, and rewriting a folder's
// model.safetensors and config.json with an edit, to make the malformed and foreign folders the
// importer must refuse.
#pragma once
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/imported_checkpoint.h"
#include "core/ckpt/safetensors.h"
#include "core/common/counter_rng.h"
#include "core/model/param_table.h"

namespace pt::test {

inline std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The master weights of a checkpoint (a step directory or a checkpoint directory), table order.
inline std::vector<float> checkpoint_weights(const std::string& dir, const ParamTable& table) {
  ckpt::CheckpointReader r(ckpt::resolve_checkpoint_path(dir, "test"));
  std::vector<float> w(table.total_numel());
  for (const auto& p : table.specs()) r.read_all("master/" + p.name, p.numel, w.data() + p.offset);
  return w;
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

// What import_hf says about a folder: its error, or "(accepted)".
inline std::string import_error(const std::string& folder, const std::string& out) {
  try {
    ckpt::import_hf(folder, out);
  } catch (const std::exception& e) {
    return e.what();
  }
  fs::remove_all(out);
  return "(accepted)";
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

inline LoadedTensor* tensor_named(std::vector<LoadedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace pt::test
