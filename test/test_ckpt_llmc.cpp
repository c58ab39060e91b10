// llm.c model files: export a trained checkpoint, import it back, and the two models give
// identical logits; the header and parameter order are llm.c's; bf16 files round to nearest
// even; files that are not llm.c models are refused with the reason.
#include <catch2/catch.hpp>

#include <cstring>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/llmc_model_file.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/decoder_stage.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;
using Catch::Matchers::Contains;

namespace {

// The logits of one forward pass of the model `weights` (table order) on fixed tokens.
std::vector<float> logits_of(const ModelSection& m, const std::vector<float>& weights) {
  CpuOps ops;
  const ParamTable table = build_param_table(m);
  ParamStore store(table, ops);
  store.load_master(weights.data());
  const int B = 2, T = 16;
  DecoderStage stage(m, store, ops, B, T);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    tokens[i] = (i * 37 + 5) % m.vocab_size;
    targets[i] = (i * 11 + 3) % m.vocab_size;
  }
  stage.forward(tokens.data(), targets.data(), 0.0f);
  std::vector<float> out(stage.logits().numel);
  ops.download(out.data(), DType::f32, stage.logits(), out.size());
  return out;
}

}  // namespace

TEST_CASE("llm.c round trip: export, import, identical logits", "[ckpt]") {
  // vocab 200 padded to 256: the padded rows of wte travel too.
  CkptFixture fx("ckpt_llmc", 200);
  const RunConfig cfg = fx.config();
  REQUIRE(cfg.model.padded_vocab == 256);
  const std::vector<float> trained = train_and_save(cfg, 3);
  const ParamTable table = build_param_table(cfg.model);
  const std::string bin = (fx.dir / "model.bin").string();
  CHECK(export_llmc(fx.ckpt_dir(), bin, LlmcDtype::f32) == fx.step_dir(3));

  SECTION("the file is llm.c's: header, size, parameter order") {
    const std::vector<char> bytes = file_bytes(bin);
    REQUIRE(bytes.size() == kLlmcHeaderBytes + table.total_numel() * 4);
    int32_t h[8];
    std::memcpy(h, bytes.data(), sizeof h);
    CHECK(std::vector<int32_t>(h, h + 8) == std::vector<int32_t>{20240326, 3, 64, 200, 2, 2, 32, 256});
    // llm.c groups tensor types over layers: after wte and wpe come ln_1.weight of every
    // layer, then ln_1.bias of every layer, ... so h.1.ln_1.bias is at wte + wpe + 2C + C.
    const size_t C = 32, off = 256 * C + 64 * C + 2 * C + C;
    const ParamSpec& p = table.get("h.1.ln_1.bias");
    CHECK(std::memcmp(bytes.data() + kLlmcHeaderBytes + off * 4, trained.data() + p.offset, C * 4) == 0);
    const ParamSpec& last = table.get("ln_f.bias");  // the file ends with lnfw, lnfb
    CHECK(std::memcmp(bytes.data() + bytes.size() - C * 4, trained.data() + last.offset, C * 4) == 0);
    CHECK(llmc_param_order(2).size() == table.specs().size());
  }

  SECTION("importing it back gives the same model and the same logits") {
    const std::string imported = (fx.dir / "imported").string();
    CHECK(import_llmc(bin, imported) == imported + "/step_00000000");
    const std::vector<float> back = checkpoint_weights(imported, table);
    CHECK(std::memcmp(back.data(), trained.data(), trained.size() * 4) == 0);
    const std::vector<float> a = logits_of(cfg.model, trained), b = logits_of(cfg.model, back);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);

    // A run resumes from it: weights in, Adam from zero, step 0.
    CpuOps ops;
    const World world;
    Trainer t(fx.config({"checkpoint.resume=" + imported, "checkpoint.dir=" + (fx.dir / "ft").string()}), world, ops);
    CHECK(t.steps_done() == 0);
    CHECK(same_bytes(master_weights(t), trained));
    std::vector<float> m(t.params().adam_m_shard().numel);
    ops.download(m.data(), DType::f32, t.params().adam_m_shard(), m.size());
    CHECK(std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; }));

    CHECK_THROWS_WITH(import_llmc(bin, imported), Contains("already holds checkpoints"));
  }

  SECTION("bf16: version 5, every value rounded to nearest even, and back") {
    const std::string bin16 = (fx.dir / "model_bf16.bin").string();
    export_llmc(fx.step_dir(3), bin16, LlmcDtype::bf16);
    const std::vector<char> bytes = file_bytes(bin16);
    REQUIRE(bytes.size() == kLlmcHeaderBytes + table.total_numel() * 2);
    int32_t version = 0;
    std::memcpy(&version, bytes.data() + 4, 4);
    CHECK(version == 5);
    const LlmcFileInfo info = read_llmc_header(bin16);
    CHECK(info.dtype == LlmcDtype::bf16);
    CHECK(info.model.padded_vocab == 256);

    const std::string imported = (fx.dir / "imported16").string();
    import_llmc(bin16, imported);
    const std::vector<float> back = checkpoint_weights(imported, table);
    int wrong = 0;
    for (size_t i = 0; i < trained.size(); i++) wrong += back[i] != bf16_to_f32(f32_to_bf16(trained[i]));
    CHECK(wrong == 0);
  }

  SECTION("files that are not llm.c models are refused with the reason") {
    std::vector<char> bytes = file_bytes(bin);
    auto write = [&](const std::vector<char>& b) {
      const std::string p = (fx.dir / "bad.bin").string();
      std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
      return p;
    };
    const std::string out = (fx.dir / "never").string();
    CHECK_THROWS_WITH(import_llmc(write({bytes.begin(), bytes.end() - 4}), out), Contains("bytes; its header describes"));
    std::vector<char> v = bytes;
    v[4] = 4;  // version 4
    CHECK_THROWS_WITH(import_llmc(write(v), out), Contains("version 4 is not supported"));
    v = bytes;
    v[0] = 0;
    CHECK_THROWS_WITH(import_llmc(write(v), out), Contains("not an llm.c model file"));
    CHECK_FALSE(fs::exists(out));
  }
}
