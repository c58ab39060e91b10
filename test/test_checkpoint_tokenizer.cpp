// The tokenizer travels with the model (issue #33): data.tokenizer is checked against
// model.vocab_size, recorded in each checkpoint (a path's tokenizer.json copied in), used by
// `picotrain sample`, written into a Hugging Face folder by `convert --format hf` (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, generation_config.json) and read back by
// `convert --from`. Old checkpoints without a record still resolve by their vocabulary.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/hf_model_folder.h"
#include "core/ckpt/imported_checkpoint.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/model_tokenizer.h"
#include "core/model/param_table.h"
#include "core/train/trainer.h"
#include "test_tokenizer_support.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;
using Ids = std::vector<int32_t>;

namespace {

// A tokenizer of 258 ids: the bytes, "Ġt" (256, from one merge) and <|endoftext|> (257), with a
// tokenizer_config.json naming it bos and eos. Returns its folder.
std::string write_tiny_tokenizer(const TempDir& dir) {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const nlohmann::json added = {{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}}};
  const std::string file =
      write_json(dir, "tiny", tiny_tokenizer({"\xC4\xA0t"}, nlohmann::json::array({"\xC4\xA0 t"}), byte_level, added));
  std::ofstream((dir.path / "tiny" / "tokenizer_config.json").string())
      << R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})";
  return (dir.path / "tiny").string();
}

ckpt::Manifest manifest_of(const std::string& checkpoint) {
  return ckpt::CheckpointReader(ckpt::resolve_checkpoint_path(checkpoint, "test")).manifest();
}

nlohmann::json json_file(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

// Runs `picotrain ARGS` in `dir`; returns its exit code and puts stderr in `err`.
int picotrain(const fs::path& dir, const std::string& args, std::string& err) {
  const std::string cmd = std::string("'") + PICOTRAIN_BIN + "' " + args + " >'" + (dir / "out.txt").string() +
                          "' 2>'" + (dir / "err.txt").string() + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  err = slurp((dir / "err.txt").string());
  return WEXITSTATUS(status);
}

// The ids the PyTorch reference's own tokenizer.json reader (scripts/torch_ref/hf_tokenizer.py)
// gives for `texts` from the folder `hf`, which it also checks (bos/eos, vocabulary); nullopt, with
// a warning, when python3 lacks the regex package that reader needs.
std::optional<std::vector<Ids>> python_reference_ids(const std::string& hf, const std::vector<std::string>& texts) {
  TempDir dir;
  std::ofstream(dir.file("in.json"), std::ios::binary) << nlohmann::json(texts).dump();
  const std::string cmd = "python3 '" + std::string(PICOTRAIN_SOURCE_DIR) + "/scripts/torch_ref/hf_tokenizer.py' '" +
                          hf + "' '" + dir.file("in.json") + "' >'" + dir.file("out.json") + "' 2>'" +
                          dir.file("err.txt") + "'";
  if (std::system(cmd.c_str()) != 0) {
    const std::string err = slurp(dir.file("err.txt"));
    if (err.find("needs the Python package regex") != std::string::npos) {
      WARN("not compared with the PyTorch reference's reader: " << err);
      return std::nullopt;
    }
    FAIL("scripts/torch_ref/hf_tokenizer.py failed: " << err);
  }
  return nlohmann::json::parse(slurp(dir.file("out.json"))).get<std::vector<Ids>>();
}

const std::vector<std::string> kReferenceTexts = {
    "Hello world, it's 2026!", "  spaces\n\n\ttabs", "naïve 中文 😀", "def f(x):\n    return x ** 2",
    "IT'S DON'T 12345678", "a <|endoftext|> b"};

ModelSection tiny_llama(int vocab) {
  ModelSection m;
  m.arch = "llama";
  m.n_layers = 1;
  m.d_model = 16;
  m.n_heads = 2;
  m.vocab_size = vocab;
  m.padded_vocab = vocab;
  m.pad_vocab_multiple = 1;
  m.max_seq_len = 32;
  return m;
}

std::string import_weights(const std::string& dir, const ModelSection& m, const std::string& tokenizer) {
  const ParamTable table = build_param_table(m);
  return ckpt::write_imported_checkpoint(dir, m, table, std::vector<float>(table.total_numel(), 0.01f), "test",
                                         tokenizer);
}

}  // namespace

TEST_CASE("data.tokenizer: a path's tokenizer.json is copied into each checkpoint and used from there",
          "[tokenizer][ckpt]") {
  TempDir tok_dir;
  const std::string source = write_tiny_tokenizer(tok_dir);
  CkptFixture fx("ckpt_tok", 300);
  std::string ckpt;
  {
    CpuOps ops;
    Trainer t(fx.config({"data.tokenizer=" + source}), World{}, ops);
    t.step();
    ckpt = t.save_checkpoint();
  }
  const ckpt::Manifest m = manifest_of(ckpt);
  CHECK(m.tokenizer == nlohmann::json{{"name", source}, {"file", "tokenizer.json"}});
  CHECK(slurp(ckpt + "/tokenizer.json") == slurp(source + "/tokenizer.json"));
  CHECK(slurp(ckpt + "/tokenizer_config.json") == slurp(source + "/tokenizer_config.json"));
  bool listed = false;
  for (const auto& f : m.files) listed = listed || f.name == "tokenizer.json";
  CHECK(listed);  // its size is checked like the data files'

  // The source may go away: the checkpoint has its own copy.
  fs::remove_all(source);
  const ModelSection model = ckpt::model_from_manifest(m, ckpt);
  const auto tok = tokenizer_for_checkpoint(fx.ckpt_dir(), model, "", "");
  CHECK(tok->name() == source);
  CHECK(tok->vocab_size() == 258);
  CHECK(tok->encode("a t<|endoftext|>") == Ids{'a', 256, 257});
  CHECK(tok->document_prefix() == Ids{257});
  // --tokenizer overrides the record.
  CHECK(tokenizer_for_checkpoint(ckpt, model, "bytes", "")->name() == "bytes");

  // Exported: the folder holds the same tokenizer.json and the files around it; imported back,
  // the new checkpoint records the folder's file.
  const std::string hf = (fx.dir / "hf").string();
  ckpt::export_hf(ckpt, hf, ckpt::HfDtype::f32);
  CHECK(slurp(hf + "/tokenizer.json") == slurp(ckpt + "/tokenizer.json"));
  CHECK(json_file(hf + "/special_tokens_map.json") ==
        nlohmann::json{{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}});
  const nlohmann::json gen = json_file(hf + "/generation_config.json");
  CHECK(gen["bos_token_id"] == 257);
  CHECK(gen["eos_token_id"] == 257);
  CHECK(json_file(hf + "/config.json")["eos_token_id"] == 257);
  CHECK(json_file(hf + "/tokenizer_config.json")["bos_token"] == "<|endoftext|>");
  CHECK(tokenizer_for_checkpoint(hf, model, "", "")->encode("a t") == Ids{'a', 256});

  const std::string imported = (fx.dir / "imported").string();
  const std::string step = ckpt::import_hf(hf, imported);
  CHECK(manifest_of(step).tokenizer == nlohmann::json{{"name", hf}, {"file", "tokenizer.json"}});
  CHECK(tokenizer_for_checkpoint(imported, model, "", "")->encode("a t<|endoftext|>") == Ids{'a', 256, 257});
}

TEST_CASE("data.tokenizer: model.vocab_size must hold the tokenizer's vocabulary", "[tokenizer][config]") {
  TempDir tok_dir;
  const std::string source = write_tiny_tokenizer(tok_dir);
  CkptFixture fx("ckpt_tok_vocab", 256);
  CpuOps ops;
  try {
    Trainer t(fx.config({"data.tokenizer=" + source}), World{}, ops);
    FAIL("a 258-token tokenizer was accepted for model.vocab_size=256");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Contains("data.tokenizer=" + source) && Contains("258 tokens") &&
                                          Contains("model.vocab_size=256"));
  }
  // A larger model vocabulary is fine (it is padded as usual).
  CHECK_NOTHROW(check_tokenizer_fits(*make_tokenizer(source), 300, "data.tokenizer"));
  // The name itself is checked with the config.
  CHECK_THROWS_WITH(fx.config({"data.tokenizer=no/such/tokenizer.json"}), Contains("data.tokenizer"));

  // On the command line: one error line naming both keys, exit code 2 (Llama 3's 128256 tokens).
  std::ofstream((fx.dir / "c.json").string()) << fx.json("cli").dump();
  std::string err;
  CHECK(picotrain(fx.dir, "train --config '" + (fx.dir / "c.json").string() + "' --set data.tokenizer=llama3", err) == 2);
  CHECK_THAT(err, Contains("data.tokenizer=llama3 has 128256 tokens") && Contains("model.vocab_size=256"));
}

TEST_CASE("a checkpoint without a recorded tokenizer resolves by its vocabulary", "[tokenizer][ckpt]") {
  CkptFixture fx("ckpt_tok_old");
  const std::string bytes = import_weights((fx.dir / "bytes").string(), tiny_llama(256), "");
  CHECK(manifest_of(bytes).tokenizer.is_null());
  CHECK(tokenizer_for_checkpoint(bytes, tiny_llama(256), "", "")->name() == "bytes");
  const std::string odd = import_weights((fx.dir / "odd").string(), tiny_llama(300), "");
  CHECK_THROWS_WITH(tokenizer_for_checkpoint(odd, tiny_llama(300), "", ""),
                    Contains("records no tokenizer") && Contains("--tokenizer"));
  // --tokenizer must fit the model too.
  CHECK_THROWS_WITH(tokenizer_for_checkpoint(odd, tiny_llama(300), "gpt2", gpt2_dir()),
                    Contains("--tokenizer gpt2 has 50257 tokens") && Contains("model.vocab_size=300"));
}

TEST_CASE("llama3 by name: recorded as a name, exported with Llama 3's files, imported and sampled",
          "[tokenizer][llama3][ckpt]") {
  CkptFixture fx("ckpt_tok_llama3");
  const ModelSection m = tiny_llama(128256);
  const std::string step = import_weights((fx.dir / "named").string(), m, "llama3");
  CHECK(manifest_of(step).tokenizer == nlohmann::json{{"name", "llama3"}});
  CHECK_FALSE(fs::exists(step + "/tokenizer.json"));  // found by name, not copied
  CHECK(tokenizer_for_checkpoint(step, m, "", "")->name() == "llama3");

  const std::string hf = (fx.dir / "hf").string();
  ckpt::export_hf(step, hf, ckpt::HfDtype::bf16);
  CHECK(slurp(hf + "/tokenizer.json") == slurp(llama3_dir() + "/tokenizer.json"));
  const nlohmann::json gen = json_file(hf + "/generation_config.json");
  CHECK(gen["bos_token_id"] == 128000);
  CHECK(gen["eos_token_id"] == 128001);
  CHECK(json_file(hf + "/special_tokens_map.json")["eos_token"] == "<|end_of_text|>");
  CHECK(json_file(hf + "/tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast");
  CHECK(json_file(hf + "/config.json")["bos_token_id"] == 128000);

  const std::string imported = (fx.dir / "imported").string();
  ckpt::import_hf(hf, imported);
  const auto tok = tokenizer_for_checkpoint(imported, m, "", "");
  for (const char* text : {"Hello World", "12345678", "<|begin_of_text|>hi<|end_of_text|>", "naïve 中文 😀"})
    CHECK(tok->encode(text) == llama3().encode(text));
  if (const auto python = python_reference_ids(hf, kReferenceTexts))
    for (size_t i = 0; i < kReferenceTexts.size(); i++) CHECK((*python)[i] == llama3().encode(kReferenceTexts[i]));

  // picotrain sample uses the recorded tokenizer (the copied file, named by the folder's path).
  std::string err;
  REQUIRE(picotrain(fx.dir, "sample --checkpoint '" + imported + "' -p Hello -n 2", err) == 0);
  CHECK_THAT(err, Contains(hf + " tokenizer"));
}

TEST_CASE("gpt2 by vocabulary: the exported tokenizer.json encodes as GPT-2 in Hugging Face's reader",
          "[tokenizer][gpt2][ckpt]") {
  CkptFixture fx("ckpt_tok_gpt2");
  ModelSection m = tiny_llama(50257);
  const std::string step = import_weights((fx.dir / "gpt2").string(), m, "");
  const std::string hf = (fx.dir / "hf").string();
  ckpt::export_hf(step, hf, ckpt::HfDtype::f32);
  CHECK(json_file(hf + "/generation_config.json")["eos_token_id"] == 50256);
  CHECK(json_file(hf + "/special_tokens_map.json")["bos_token"] == "<|endoftext|>");
  CHECK(json_file(hf + "/tokenizer_config.json")["model_max_length"] == 32);
  // Hugging Face's JavaScript reader and the PyTorch reference's give GPT-2's ids (the special
  // token, spelled in text, is the special token in a tokenizer.json).
  const auto tok = make_tokenizer(hf);
  const std::string lib = std::string(PICOTRAIN_SOURCE_DIR) + "/data/tokenizers-js";
  const auto node = node_reference_ids("hf_reference.js", {lib, hf + "/tokenizer.json"}, kReferenceTexts);
  const auto python = python_reference_ids(hf, kReferenceTexts);
  for (size_t i = 0; i < kReferenceTexts.size(); i++) {
    INFO(kReferenceTexts[i]);
    CHECK(node[i] == tok->encode(kReferenceTexts[i]));
    if (python) CHECK((*python)[i] == tok->encode(kReferenceTexts[i]));
    if (kReferenceTexts[i].find("<|endoftext|>") == std::string::npos)
      CHECK(tok->encode(kReferenceTexts[i]) == gpt2().encode(kReferenceTexts[i]));
  }
  CHECK(tok->encode("a <|endoftext|> b") == Ids{64, 220, 50256, 275});
}

TEST_CASE("configs/tiny-llama3.json: a Llama with an untied head on Llama 3's tokenizer", "[tokenizer][llama3][config]") {
  const RunConfig c = load_config(std::string(PICOTRAIN_SOURCE_DIR) + "/configs/tiny-llama3.json", {}, 1);
  CHECK(c.model.arch == "llama");
  CHECK_FALSE(c.model.tied());
  CHECK(c.data.tokenizer == "llama3");
  CHECK(c.data.train == "data/tiny_llama3/corpus_train_*.bin");  // what scripts/speedrun.sh prepares for it
  CHECK(run_tokenizer_name(c) == "llama3");
  CHECK(c.model.vocab_size == llama3().vocab_size());
  CHECK_NOTHROW(check_tokenizer_fits(llama3(), c.model.vocab_size, "data.tokenizer=llama3"));
}
