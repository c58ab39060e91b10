// Hugging Face model folders: a trained checkpoint exports to config.json + model.safetensors
// and imports back bit for bit; the safetensors bytes are checked against the format by hand
// (header length, JSON, padding, packed offsets, Conv1D transposes, dropped vocabulary
// padding); bf16 export rounds to nearest even; every malformed file or folder is refused
// with a message naming the file and the tensor or key; `picotrain convert --format hf` works
// end to end and picks formats by the documented rule.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/durable_io.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/llmc_model_file.h"
#include "core/ckpt/safetensors.h"
#include "core/cpu/cpu_ops.h"
#include "hf_test_support.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;

namespace {

// A safetensors file from a header written by hand: 8-byte length, the JSON padded with
// spaces to a multiple of 8, then `data`.
std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

// The Hugging Face tensor of a picotrain parameter, computed here independently of
// hf_architecture.cpp: the first `rows` rows, transposed when `transpose`.
std::vector<float> expected_hf(const std::vector<float>& w, const ParamSpec& p, int64_t rows, bool transpose) {
  const int64_t cols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) (transpose ? out[j * rows + i] : out[i * cols + j]) = w[p.offset + i * cols + j];
  return out;
}

}  // namespace

TEST_CASE("Hugging Face folder: export, the bytes by hand, import back bit for bit", "[ckpt][hf]") {
  // vocab 200 padded to 256: the exported embedding has 200 rows, the import pads it again.
  CkptFixture fx("hf_export", 200);
  const RunConfig cfg = fx.config();
  REQUIRE(cfg.model.padded_vocab == 256);
  const std::vector<float> trained = train_and_save(cfg, 3);
  const ParamTable table = build_param_table(cfg.model);
  const std::string hf = (fx.dir / "hf").string();
  CHECK(export_hf(fx.ckpt_dir(), hf, HfDtype::f32) == fx.step_dir(3));
  CHECK(is_hf_model_folder(hf));
  CHECK_FALSE(is_hf_model_folder(fx.ckpt_dir()));
  CHECK_FALSE(fs::exists(hf + "/model.safetensors.tmp"));

  SECTION("model.safetensors: length, JSON header padded to 8, packed tensors in table order, raw data") {
    const std::vector<char> bytes = file_bytes(hf + "/model.safetensors");
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    REQUIRE(8 + n <= bytes.size());
    CHECK((8 + n) % 8 == 0);
    const std::string text(bytes.data() + 8, n);
    CHECK(text.front() == '{');
    const size_t close = text.find_last_of('}');
    CHECK(text.find_first_not_of(' ', close + 1) == std::string::npos);  // only spaces pad it
    CHECK(text.size() - close - 1 < 8);
    const ojson h = ojson::parse(text);  // ordered: the walk below is in file order
    CHECK(h["__metadata__"] == ojson{{"format", "pt"}});
    REQUIRE(h.size() == table.specs().size() + 1);  // every parameter once; no lm_head (tied)
    CHECK_FALSE(h.contains("lm_head.weight"));

    // Walk the header in file order: names, shapes and offsets by GPT-2's rules, each tensor's
    // bytes equal to picotrain's weights (Conv1D weights transposed, padding rows dropped).
    const char* data = bytes.data() + 8 + n;
    uint64_t at = 0;
    size_t i = 0;
    for (const auto& [name, e] : h.items()) {
      if (name == "__metadata__") continue;
      const ParamSpec& p = table.specs()[i++];
      INFO(name << " for " << p.name);
      CHECK(name == (p.name.rfind("h.", 0) == 0 || p.name.rfind("ln_f", 0) == 0 ? "transformer." + p.name
                                                                                : "transformer." + p.name + ".weight"));
      CHECK(e["dtype"] == "F32");
      const bool conv1d = p.name.find("weight") != std::string::npos && p.name.find(".ln_") == std::string::npos &&
                          p.name.rfind("h.", 0) == 0;
      const int64_t rows = p.name == "wte" ? 200 : p.global_shape[0];
      std::vector<int64_t> shape = p.global_shape;
      shape[0] = rows;
      if (conv1d) std::swap(shape[0], shape[1]);
      CHECK(e["shape"].get<std::vector<int64_t>>() == shape);
      const std::vector<float> want = expected_hf(trained, p, rows, conv1d);
      CHECK(e["data_offsets"] == ojson{at, at + want.size() * 4});
      CHECK(std::memcmp(data + at, want.data(), want.size() * 4) == 0);
      at += want.size() * 4;
    }
    CHECK(8 + n + at == bytes.size());
    CHECK(h["transformer.h.0.attn.c_attn.weight"]["shape"] == ojson{32, 96});
    CHECK(h["transformer.h.1.mlp.c_proj.weight"]["shape"] == ojson{128, 32});
    CHECK(h["transformer.wte.weight"]["shape"] == ojson{200, 32});
  }

  SECTION("config.json: what GPT2LMHeadModel needs") {
    const json c = json::parse(read_text(hf + "/config.json"));
    CHECK(c["model_type"] == "gpt2");
    CHECK(c["architectures"] == json{"GPT2LMHeadModel"});
    CHECK(c["vocab_size"] == 200);
    CHECK(c["n_positions"] == 64);
    CHECK(c["n_ctx"] == 64);
    CHECK(c["n_embd"] == 32);
    CHECK(c["n_layer"] == 2);
    CHECK(c["n_head"] == 2);
    CHECK(c["n_inner"].is_null());
    CHECK(c["layer_norm_epsilon"] == 1e-5);
    CHECK(c["activation_function"] == "gelu_new");
    CHECK(c["torch_dtype"] == "float32");
    CHECK(c["tie_word_embeddings"] == true);
    CHECK(c["scale_attn_weights"] == true);
    CHECK(c["scale_attn_by_inverse_layer_idx"] == false);
    CHECK(c["bos_token_id"].is_null());  // no <|endoftext|> in a 200-token vocabulary
    CHECK(c["eos_token_id"].is_null());
  }

  SECTION("import gives back the same weights, bit for bit, and a run resumes from them") {
    const std::string imported = (fx.dir / "imported").string();
    CHECK(import_hf(hf, imported) == imported + "/step_00000000");
    CHECK(same_bytes(checkpoint_weights(imported, table), trained));
    CheckpointReader r(resolve_checkpoint_path(imported, "test"));
    CHECK(r.manifest().step == 0);
    CHECK(r.manifest().model == model_shape_json(cfg.model));

    CpuOps ops;
    const World world;
    Trainer t(fx.config({"checkpoint.resume=" + imported, "checkpoint.dir=" + (fx.dir / "ft").string()}), world, ops);
    CHECK(t.steps_done() == 0);
    CHECK(same_bytes(master_weights(t), trained));

    CHECK_THROWS_WITH(import_hf(hf, imported), Contains("already holds checkpoints"));
  }

  SECTION("a folder saved the way older transformers did: no prefix, mask buffers, a tied lm_head") {
    const std::string old = (fx.dir / "old_style").string();
    rewrite_folder(hf, old, [](std::vector<LoadedTensor>& ts) {
      const std::vector<float> wte = tensor_named(ts, "transformer.wte.weight")->data;
      for (auto& t : ts) t.name = t.name.substr(std::string("transformer.").size());
      ts.push_back({"h.0.attn.bias", {1, 1, 64, 64}, std::vector<float>(64 * 64, 1.0f)});
      ts.push_back({"h.0.attn.masked_bias", {}, {-1e4f}});
      ts.push_back({"lm_head.weight", {200, 32}, wte});
    });
    const std::string imported = (fx.dir / "imported_old").string();
    import_hf(old, imported);
    CHECK(same_bytes(checkpoint_weights(imported, table), trained));
  }

  SECTION("bf16: BF16 tensors, each value rounded to nearest even, and back") {
    const std::string hf16 = (fx.dir / "hf16").string();
    export_hf(fx.step_dir(3), hf16, HfDtype::bf16);
    CHECK(json::parse(read_text(hf16 + "/config.json"))["torch_dtype"] == "bfloat16");
    const SafetensorsFile f(hf16 + "/model.safetensors");
    const std::vector<char> bytes = file_bytes(hf16 + "/model.safetensors");
    int wrong = 0;
    for (const StTensor& t : f.tensors()) {
      CHECK(t.dtype == "BF16");
      CHECK(t.end - t.begin == t.numel() * 2);
      // The file's raw halves against this test's rounding of the fp32 export's values.
      const std::vector<float> ref = SafetensorsFile(hf + "/model.safetensors").read_f32(t.name, t.shape);
      std::vector<uint16_t> raw(t.numel());
      std::memcpy(raw.data(), bytes.data() + f.data_start() + t.begin, raw.size() * 2);
      for (size_t i = 0; i < raw.size(); i++) wrong += raw[i] != f32_to_bf16(ref[i]);
    }
    CHECK(wrong == 0);

    const std::string imported = (fx.dir / "imported16").string();
    import_hf(hf16, imported);
    const std::vector<float> back = checkpoint_weights(imported, table);
    wrong = 0;
    for (size_t i = 0; i < trained.size(); i++) wrong += back[i] != bf16_to_f32(f32_to_bf16(trained[i]));
    CHECK(wrong == 0);
  }

  SECTION("import refuses a folder whose tensors are not the model's, naming the tensor") {
    const std::string bad = (fx.dir / "bad").string(), out = (fx.dir / "never").string();
    rewrite_folder(hf, bad, [](auto& ts) {
      std::erase_if(ts, [](auto& t) { return t.name == "transformer.h.1.mlp.c_fc.bias"; });
    });
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("has no tensor transformer.h.1.mlp.c_fc.bias"));
    // A Conv1D weight stored [out, in], as someone who forgot the transpose would write it.
    rewrite_folder(hf, bad, [](auto& ts) { tensor_named(ts, "transformer.h.0.attn.c_attn.weight")->shape = {96, 32}; });
    CHECK_THROWS_WITH(import_hf(bad, out),
                      Contains("tensor transformer.h.0.attn.c_attn.weight has shape [96, 32], expected [32, 96]"));
    rewrite_folder(hf, bad, [](auto& ts) { ts.push_back({"transformer.h.0.attn.q_attn.weight", {2}, {1, 2}}); });
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("transformer.h.0.attn.q_attn.weight is not a parameter"));
    rewrite_folder(hf, bad, [](auto& ts) {
      ts.push_back({"lm_head.weight", {200, 32}, std::vector<float>(200 * 32)});
    });
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("lm_head.weight differs from transformer.wte.weight"));
    rewrite_folder(hf, bad, [](auto& ts) {
      LoadedTensor t = *tensor_named(ts, "transformer.wpe.weight");
      t.name = "wpe.weight";
      ts.push_back(t);
    });
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("holds both transformer.wpe.weight and wpe.weight"));
    CHECK_FALSE(fs::exists(out));
  }

  SECTION("import refuses a config.json that is not a GPT-2 picotrain computes, naming the key") {
    const std::string bad = (fx.dir / "badcfg").string(), out = (fx.dir / "never").string();
    auto refused = [&](const std::function<void(json&)>& edit) {
      rewrite_folder(
          hf, bad, [](auto&) {}, edit);
      try {
        import_hf(bad, out);
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string("(accepted)");
    };
    CHECK_THAT(refused([](json& c) { c["layer_norm_epsilon"] = 1e-6; }), Contains("\"layer_norm_epsilon\": 1e-06"));
    CHECK_THAT(refused([](json& c) { c["activation_function"] = "relu"; }), Contains("\"activation_function\""));
    CHECK_THAT(refused([](json& c) { c["n_inner"] = 100; }), Contains("\"n_inner\": 100 is not supported"));
    CHECK_THAT(refused([](json& c) { c["tie_word_embeddings"] = false; }), Contains("\"tie_word_embeddings\""));
    CHECK_THAT(refused([](json& c) { c["n_head"] = 3; }), Contains("\"n_head\": 3 does not divide n_embd=32"));
    CHECK_THAT(refused([](json& c) { c["model_type"] = "bert"; }), Contains("model_type \"bert\" is not one"));
    CHECK_THAT(refused([](json& c) { c.erase("model_type"); }), Contains("no \"model_type\""));
    // The config says 3 layers, the file holds 2.
    CHECK_THAT(refused([](json& c) { c["n_layer"] = 3; }), Contains("has no tensor transformer.h.2.ln_1.weight"));
    // A key left out takes GPT2Config's default, as transformers reads it: n_positions 1024.
    CHECK_THAT(refused([](json& c) { c.erase("n_positions"); }),
               Contains("tensor transformer.wpe.weight has shape [64, 32], expected [1024, 32]"));

    write_bytes(bad + "/config.json", "{\"model_type\": ");
    CHECK_THROWS_WITH(import_hf(bad, out), Contains(bad + "/config.json is not valid JSON"));
    fs::remove(bad + "/model.safetensors");
    std::ofstream(bad + "/config.json") << read_text(hf + "/config.json");
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("has config.json but no model.safetensors"));
    std::ofstream(bad + "/model.safetensors.index.json") << "{}";
    CHECK_THROWS_WITH(import_hf(bad, out), Contains("sharded"));
    CHECK_FALSE(fs::exists(out));
  }

  SECTION("export refuses a checkpoint directory as its target and leaves nothing half-written") {
    CHECK_THROWS_WITH(export_hf(fx.ckpt_dir(), fx.ckpt_dir(), HfDtype::f32), Contains("is a picotrain checkpoint"));
    const std::string target = (fx.dir / "faulty").string();
    set_fault_hook([](std::string_view step, const std::string& path) {
      return step == "rename" && path.ends_with("model.safetensors") ? EIO : 0;
    });
    CHECK_THROWS_WITH(export_hf(fx.ckpt_dir(), target, HfDtype::f32), Contains("model.safetensors"));
    set_fault_hook(nullptr);
    CHECK_FALSE(fs::exists(target + "/model.safetensors"));
    CHECK_FALSE(fs::exists(target + "/model.safetensors.tmp"));
    CHECK_FALSE(fs::exists(target + "/config.json"));
  }
}

TEST_CASE("safetensors reader: every malformed file is refused naming the file and the tensor", "[ckpt][hf]") {
  const fs::path dir = fs::temp_directory_path() / ("picotrain_safetensors_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  auto error_of = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    try {
      SafetensorsFile f(path);
      f.read_f32("a", {2});
      return std::string("(accepted)");
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
  };
  const std::string two_floats(8, '\0'), a2 = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

  // A good file first: the hand-written bytes read back.
  CHECK(error_of(raw_safetensors("{" + a2 + "}", two_floats)) == "(accepted)");

  CHECK_THAT(error_of("abc"), Contains(path + " is 3 bytes: truncated"));
  std::string bytes = raw_safetensors("{" + a2 + "}", two_floats);
  const uint64_t huge = 1u << 20;
  std::memcpy(bytes.data(), &huge, 8);
  CHECK_THAT(error_of(bytes), Contains(path + ": the safetensors header length 1048576 runs past the end"));
  CHECK_THAT(error_of(raw_safetensors("{\"a\": [", two_floats)),
             Contains(path + ": the safetensors header is not valid JSON"));
  CHECK_THAT(error_of(raw_safetensors("[1, 2]", "")), Contains("not a JSON object"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", two_floats)),
             Contains(path + ": tensor a: unknown dtype \"F33\""));
  CHECK_THAT(
      error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", two_floats)),
      Contains("tensor a: shape [2,-1] has a dimension"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2]}})", two_floats)),
             Contains("tensor a: its header entry has no \"data_offsets\""));
  // Truncated data: the tensor's end is past the end of the file.
  CHECK_THAT(error_of(raw_safetensors("{" + a2 + "}", std::string(4, '\0'))),
             Contains(path + ": tensor a: data_offsets [0,8] are out of range: the data section holds 4 bytes"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", two_floats)),
             Contains("tensor a: data_offsets [0,8] hold 8 bytes, but shape [3] of F32 needs 3 x 4"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                      two_floats)),
             Contains("tensors a [0, 8) and b [4, 8) overlap"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                      std::string(12, '\0'))),
             Contains("4 bytes before tensor a [4, 12) belong to no tensor"));
  CHECK_THAT(error_of(raw_safetensors("{" + a2 + "}", std::string(12, '\0'))),
             Contains("the tensors end at data byte 8 but the file has 12"));
  CHECK_THAT(
      error_of(raw_safetensors(
          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"x": 1}})", two_floats)),
      Contains("__metadata__ entry \"x\" is not a string"));
  // Valid files the model cannot use: no such tensor, another shape, a dtype not converted.
  CHECK_THAT(error_of(raw_safetensors(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", two_floats)),
             Contains(path + " has no tensor a"));
  CHECK_THAT(
      error_of(raw_safetensors(R"({"a": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}})", two_floats)),
      Contains("tensor a has shape [1, 2], expected [2]"));
  CHECK_THAT(error_of(raw_safetensors(R"({"a": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})", two_floats)),
             Contains("tensor a is I32; picotrain reads F32, BF16 and F16"));

  // F16 and BF16 convert exactly: 1.5, -2, the smallest subnormal half, -inf.
  const uint16_t f16[] = {0x3e00, 0xc000, 0x0001, 0xfc00};
  write_bytes(path, raw_safetensors(R"({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})",
                                    std::string(reinterpret_cast<const char*>(f16), 8)));
  const std::vector<float> v = SafetensorsFile(path).read_f32("a", {4});
  CHECK(v == std::vector<float>{1.5f, -2.0f, std::ldexp(1.0f, -24), -INFINITY});
  fs::remove_all(dir);
}

TEST_CASE("safetensors writer: the header it writes, byte for byte", "[ckpt][hf]") {
  std::vector<StTensor> ts = {{"x", kStF32, {2, 3}}, {"y", kStBf16, {5}}};
  const std::string h = safetensors_header(ts, {{"format", "pt"}});
  const std::string json_text =
      R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"y":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]},"__metadata__":{"format":"pt"}})";
  const size_t padded = (json_text.size() + 7) / 8 * 8;
  REQUIRE(h.size() == 8 + padded);
  uint64_t n = 0;
  std::memcpy(&n, h.data(), 8);
  CHECK(n == padded);
  CHECK(h.substr(8, json_text.size()) == json_text);
  CHECK(h.substr(8 + json_text.size()) == std::string(padded - json_text.size(), ' '));
  CHECK(ts[1].begin == 24);
  CHECK(ts[1].end == 34);
}

TEST_CASE("Hugging Face tables: a parameter without a rule, or a rule without a parameter, is an error", "[ckpt][hf]") {
  ModelSection m;
  m.n_layers = 2;
  m.d_model = 32;
  m.n_heads = 2;
  m.vocab_size = 200;
  m.max_seq_len = 64;
  m.padded_vocab = 256;
  const ParamTable table = build_param_table(m);
  const std::vector<HfTensor> ts = hf_tensors(hf_gpt2(), table, m);
  CHECK(ts.size() == table.specs().size());
  HfArchitecture missing = hf_gpt2();
  std::erase_if(missing.rules, [](const HfTensorRule& r) { return r.picotrain == "h.{L}.mlp.c_fc.bias"; });
  CHECK_THROWS_WITH(hf_tensors(missing, table, m), Contains("no Hugging Face name for parameter h.0.mlp.c_fc.bias"));
  HfArchitecture extra = hf_gpt2();
  extra.rules.push_back({"h.{L}.attn.q_norm.weight", "transformer.h.{L}.attn.q_norm.weight"});
  CHECK_THROWS_WITH(hf_tensors(extra, table, m), Contains("rule for h.{L}.attn.q_norm.weight matches no parameter"));
  ModelSection other = m;
  other.arch = "moe";
  CHECK_THROWS_AS(hf_architecture_for_model(other), ConfigError);
}

TEST_CASE("picotrain convert --format hf: export and import from the command line", "[ckpt][hf][cli]") {
  CkptFixture fx("hf_cli", 200);
  train_and_save(fx.config(), 1);
  const std::string bin = PICOTRAIN_BIN, ckpt = fx.ckpt_dir(), hf = (fx.dir / "hf").string();
  Launch l = run_command(bin + " convert --from " + ckpt + " --to " + hf + " --format hf");
  INFO(l.output);
  CHECK(l.exit_code == 0);
  CHECK_THAT(l.output, Contains("exported " + fx.step_dir(1) + " to " + hf + " (Hugging Face folder"));
  CHECK(fs::exists(hf + "/config.json"));
  CHECK(fs::exists(hf + "/model.safetensors"));

  const std::string back = (fx.dir / "back").string();
  l = run_command(bin + " convert --from " + hf + " --to " + back);
  CHECK(l.exit_code == 0);
  CHECK_THAT(l.output, Contains("imported " + hf + " into " + back + "/step_00000000 (weights only, step 0)"));
  const ParamTable table = build_param_table(fx.config().model);
  CHECK(same_bytes(checkpoint_weights(back, table), checkpoint_weights(ckpt, table)));

  // The format rule: .bin is llm.c's by default; any other --to must name its format.
  l = run_command(bin + " convert --from " + ckpt + " --to " + (fx.dir / "model.bin").string());
  CHECK(l.exit_code == 0);
  CHECK(read_llmc_header((fx.dir / "model.bin").string()).model.vocab_size == 200);
  l = run_command(bin + " convert --from " + ckpt + " --to " + (fx.dir / "model").string());
  CHECK(l.exit_code == 2);
  CHECK_THAT(l.output, Contains("say --format hf"));
  l = run_command(bin + " convert --from " + hf + " --to " + (fx.dir / "x").string() + " --format llmc");
  CHECK(l.exit_code == 2);
  CHECK_THAT(l.output, Contains("is a Hugging Face folder"));
  l = run_command(bin + " convert --from " + hf + " --to " + (fx.dir / "x").string() + " --dtype bf16");
  CHECK(l.exit_code == 2);
  CHECK_THAT(l.output, Contains("--dtype applies to export only"));
  l = run_command(bin + " convert --from " + ckpt + " --to " + (fx.dir / "hf16").string() +
                  " --format hf --dtype bf16");
  CHECK(l.exit_code == 0);
  CHECK(SafetensorsFile((fx.dir / "hf16" / "model.safetensors").string()).tensors()[0].dtype == "BF16");
  // A broken folder is a runtime failure (exit 1) with one error line naming the file.
  write_bytes(hf + "/model.safetensors", "abc");
  l = run_command(bin + " convert --from " + hf + " --to " + (fx.dir / "y").string());
  CHECK(l.exit_code == 1);
  CHECK_THAT(l.output, Contains("error: " + hf + "/model.safetensors is 3 bytes: truncated"));
}
