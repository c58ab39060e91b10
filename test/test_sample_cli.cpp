// Sampling from checkpoints and in the training log: a continuation from a fixed checkpoint and
// seed reproduces; `picotrain sample` prints the prompt and the continuation the library gives,
// and turns bad arguments into one error line and exit code 2; the GPT-2 tokenizer path;
// logging.sample_every prints samples at its steps and at the end, the same under ZeRO-3
// (gathered weights) as under ZeRO-0, and warns once when there is no tokenizer.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "ckpt_test_support.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/kv_cache_decoder.h"
#include "core/model/sample_run.h"
#include "core/model/sampler.h"
#include "core/tokenizer/tokenizer.h"
#include "test_tokenizer_support.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

struct Run {
  int rc = -1;
  std::string out, err;
  std::vector<std::string> error_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("error:", 0) == 0) lines.push_back(line);
    return lines;
  }
};

// Runs `picotrain ARGS` (ARGS already shell-quoted) with stdout and stderr captured.
Run picotrain(const fs::path& dir, const std::string& args) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = std::string("'") + PICOTRAIN_BIN + "' " + args + " >'" + out.string() + "' 2>'" +
                          err.string() + "'";
  const int status = std::system(cmd.c_str());
  Run r;
  REQUIRE(WIFEXITED(status));
  r.rc = WEXITSTATUS(status);
  r.out = read_text(out.string());
  r.err = read_text(err.string());
  return r;
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// Trains `steps` steps of the fixture's model and saves a checkpoint; returns its directory.
std::string make_checkpoint(const CkptFixture& fx, int steps, const std::vector<std::string>& sets = {}) {
  CpuOps ops;
  Trainer t(fx.config(sets), World{}, ops);
  for (int i = 0; i < steps; i++) t.step();
  return t.save_checkpoint();
}

// The text the library samples from a checkpoint (byte tokenizer).
std::string library_sample(const std::string& ckpt, const std::string& prompt, const SampleOptions& o) {
  const CheckpointWeights w = read_checkpoint_weights(ckpt);
  CpuOps ops;
  KvCacheDecoder dec(w.model, w.weights.data(), ops);
  const auto tok = make_tokenizer("bytes");
  return prompt + tok->decode(generate(dec, prompt_context(*tok, prompt), o, tok->vocab_size()));
}

std::string write_config(const CkptFixture& fx, const std::string& run, const nlohmann::json& logging) {
  nlohmann::json j = fx.json(run);
  for (auto it = logging.begin(); it != logging.end(); ++it) j["logging"][it.key()] = it.value();
  const std::string path = (fx.dir / (run + ".json")).string();
  std::ofstream(path) << j.dump();
  return path;
}

// The sample blocks of a training log: each "sample    | ..." header with the lines under it.
std::vector<std::string> sample_blocks(const std::string& log) {
  std::vector<std::string> blocks;
  std::istringstream in(log);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("sample    | ", 0) == 0) {
      blocks.push_back(line + "\n");
      inside = true;
    } else if (inside && line.rfind("          | ", 0) == 0) {
      blocks.back() += line + "\n";
    } else {
      inside = false;
    }
  }
  return blocks;
}

}  // namespace

TEST_CASE("a continuation from a fixed checkpoint and seed reproduces", "[sample]") {
  CkptFixture fx("sample_repro");
  const std::string ckpt = make_checkpoint(fx, 4);
  SampleOptions o;
  o.max_new_tokens = 40;
  o.temperature = 1.0;
  o.top_k = 0;
  o.seed = 21;
  const std::string a = library_sample(ckpt, "Hello", o);
  CHECK(a.size() == 5 + 40);
  CHECK(library_sample(ckpt, "Hello", o) == a);
  o.seed = 22;
  CHECK(library_sample(ckpt, "Hello", o) != a);

  SECTION("the checkpoint's weights are the trainer's") {
    CpuOps ops;
    Trainer t(fx.config({"checkpoint.resume=auto"}), World{}, ops);
    const CheckpointWeights w = read_checkpoint_weights(fx.ckpt_dir());
    CHECK(w.dir == ckpt);
    CHECK(same_bytes(w.weights, master_weights(t)));
    CHECK(w.model.d_model == 32);
    CHECK(w.model.padded_vocab == 256);
  }
}

TEST_CASE("picotrain sample prints the prompt and the continuation", "[sample][cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  CkptFixture fx("sample_cli");
  const std::string ckpt = make_checkpoint(fx, 3);
  SampleOptions o;
  o.max_new_tokens = 24;
  o.seed = 5;  // the CLI's default temperature and top-k are SampleOptions'

  const Run a = picotrain(fx.dir, "sample --checkpoint " + q(fx.ckpt_dir()) + " --prompt Hello -n 24 --seed 5");
  INFO(a.err);
  REQUIRE(a.rc == 0);
  CHECK(a.out == library_sample(ckpt, "Hello", o) + "\n");
  CHECK_THAT(a.out, StartsWith("Hello"));
  CHECK_THAT(a.err, Contains("sample    | " + ckpt) && Contains("bytes tokenizer"));
  CHECK(a.error_lines().empty());

  SECTION("again, from the step directory: the same text") {
    const Run b = picotrain(fx.dir, "sample --checkpoint " + q(ckpt) + " --prompt Hello -n 24 --seed 5");
    CHECK(b.rc == 0);
    CHECK(b.out == a.out);
  }
  SECTION("temperature 0 is greedy") {
    const Run g = picotrain(fx.dir, "sample --checkpoint " + q(ckpt) + " -p 'The ' -n 30 --temperature 0 --seed 1");
    const Run g2 = picotrain(fx.dir, "sample --checkpoint " + q(ckpt) + " -p 'The ' -n 30 -t 0 --seed 2 -k 7");
    REQUIRE(g.rc == 0);
    o.max_new_tokens = 30;
    o.temperature = 0;
    CHECK(g.out == library_sample(ckpt, "The ", o) + "\n");
    CHECK(g2.out == g.out);
    CHECK_THAT(g.err, Contains("greedy"));
  }
  SECTION("-n 0 prints the prompt alone") {
    const Run z = picotrain(fx.dir, "sample --checkpoint " + q(ckpt) + " --prompt 'just this' -n 0");
    CHECK(z.rc == 0);
    CHECK(z.out == "just this\n");
  }
}

TEST_CASE("picotrain sample decodes a Llama checkpoint", "[sample][cli]") {
  // Grouped-query attention (2 query heads on 1 K/V head), RoPE, SwiGLU, an untied head: the
  // decoder finds all of it by role in the checkpoint's weights.
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  CkptFixture fx("sample_llama");
  const std::string ckpt = make_checkpoint(fx, 3, {"model.arch=llama", "model.n_kv_heads=1", "model.ffn_hidden=48"});
  CHECK(read_checkpoint_weights(ckpt).model.arch == "llama");
  SampleOptions o;
  o.max_new_tokens = 20;
  o.seed = 9;
  const Run a = picotrain(fx.dir, "sample --checkpoint " + q(fx.ckpt_dir()) + " --prompt Hi -n 20 --seed 9");
  INFO(a.err);
  REQUIRE(a.rc == 0);
  CHECK(a.out == library_sample(ckpt, "Hi", o) + "\n");
  CHECK(a.out.size() == 2 + 20 + 1);  // the byte tokenizer: one byte a token
  CHECK_THAT(a.err, Contains(": llama, 2 layers, d_model 32, 2 heads (1 K/V)"));
  CHECK(a.error_lines().empty());
}

TEST_CASE("picotrain sample: bad arguments exit 2 with one error line", "[sample][cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  CkptFixture fx("sample_bad");
  const std::string ckpt = make_checkpoint(fx, 1);
  auto check_error = [&](const std::string& args, const std::string& want) {
    const Run r = picotrain(fx.dir, "sample " + args);
    INFO("picotrain sample " << args << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.rc == 2);
    const auto lines = r.error_lines();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Contains(want));
    CHECK(r.out.empty());
  };
  check_error("--checkpoint " + q((fx.dir / "nope").string()) + " --prompt x", "nope");
  check_error("--prompt x", "--checkpoint");
  check_error("--checkpoint " + q(fx.dir.string()) + " --prompt x", fx.dir.string());  // not a checkpoint
  check_error("--checkpoint " + q(ckpt) + " --temperature -1", "--temperature must be >= 0, got -1 (0: greedy)");
  check_error("--checkpoint " + q(ckpt) + " --top-k -2", "--top-k");
  check_error("--checkpoint " + q(ckpt) + " -n -5", "--tokens must be >= 0, got -5");
  check_error("--checkpoint " + q(ckpt) + " --tokenizer words", "--tokenizer");
  check_error("--checkpoint " + q(ckpt) + " --tokenizer gpt2 --tokenizer-dir " + q(gpt2_dir()), "50257");
}

TEST_CASE("picotrain sample with the GPT-2 tokenizer", "[sample][cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  gpt2();  // fails (never skips) without the tokenizer files
  CkptFixture fx("sample_gpt2", 50257);
  const std::string ckpt = make_checkpoint(fx, 1);
  const std::string args = "sample --checkpoint " + q(ckpt) + " --tokenizer-dir " + q(gpt2_dir()) +
                           " --prompt 'Hello, world' -n 12 --seed 3 --ignore-eot";
  const Run a = picotrain(fx.dir, args);
  INFO(a.err);
  REQUIRE(a.rc == 0);
  CHECK_THAT(a.out, StartsWith("Hello, world"));
  CHECK_THAT(a.err, Contains("gpt2 tokenizer"));
  CHECK(a.out.size() > std::string("Hello, world\n").size());
  CHECK(picotrain(fx.dir, args).out == a.out);

  // The text printed is the decoding of the sampled ids, whatever the chunks it came out in.
  const CheckpointWeights w = read_checkpoint_weights(ckpt);
  CpuOps ops;
  KvCacheDecoder dec(w.model, w.weights.data(), ops);
  SampleOptions o;
  o.max_new_tokens = 12;
  o.seed = 3;
  const auto& tok = gpt2();
  const auto context = prompt_context(tok, "Hello, world");
  CHECK(context.front() == tok.eot_id());  // sampled as the start of a document
  CHECK(a.out == "Hello, world" + tok.decode(generate(dec, context, o, tok.vocab_size())) + "\n");
}

TEST_CASE("logging.sample_every prints samples in the training log", "[sample][cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  CkptFixture fx("sample_log");
  const nlohmann::json logging = {{"sample_every", 5}, {"sample_tokens", 12}, {"sample_prompt", "Hi"}};
  const Run zero0 = picotrain(fx.dir, "train --config " + q(write_config(fx, "z0", logging)) +
                                          " --set schedule.total_steps=12");
  INFO(zero0.out << zero0.err);
  REQUIRE(zero0.rc == 0);
  const auto blocks = sample_blocks(zero0.out);
  REQUIRE(blocks.size() == 3);
  CHECK_THAT(blocks[0], StartsWith("sample    | step 5, 12 tokens (temperature 0.8, top-k 200, seed 7):\n          | Hi"));
  CHECK_THAT(blocks[1], StartsWith("sample    | step 10,"));
  CHECK_THAT(blocks[2], StartsWith("sample    | step 12,"));  // the end of the run
  // After the step's log line (the step 10 line is logged: logging.every_steps is 1).
  CHECK(zero0.out.find("step 10/12") < zero0.out.find("sample    | step 10,"));

  SECTION("ZeRO-3 gathers the weights: the same samples") {
    const Run zero3 = picotrain(fx.dir, "train --config " + q(write_config(fx, "z3", logging)) +
                                            " --set schedule.total_steps=12 --set parallel.zero_stage=3");
    REQUIRE(zero3.rc == 0);
    CHECK(sample_blocks(zero3.out) == blocks);
  }
  SECTION("0 means never") {
    const Run none = picotrain(fx.dir, "train --config " + q(write_config(fx, "none", {{"sample_every", 0}})) +
                                           " --set schedule.total_steps=6");
    REQUIRE(none.rc == 0);
    CHECK(sample_blocks(none.out).empty());
  }
}

TEST_CASE("logging.sample_every without a tokenizer warns once", "[sample][cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  CkptFixture fx("sample_warn", 300);
  const Run r = picotrain(fx.dir, "train --config " + q(write_config(fx, "w", {{"sample_every", 2}})) +
                                      " --set schedule.total_steps=6");
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(sample_blocks(r.out).empty());
  const std::regex warning("warning.*model.vocab_size=300");
  CHECK(std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), warning), std::sregex_iterator()) == 1);
}
