// RunConfig: every rule fails with a message naming the key and the value; defaults, derived
// values, `--set` overrides, unknown keys and wrong types; the resolved config round-trips; the
// configuration reference explains every key once, with its default; the shipped configs load; and
// the binary turns a bad config into one "error:" line and exit code 2 (tagged [cli]).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/config/config_keys.h"
#include "core/config/config_reference.h"
#include "core/config/run_config.h"
#include "run_test_support.h"

using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A config of configs/tiny.json's model shape; everything else is a default.
json tiny() {
  return json::parse(R"({
    "run": {"name": "t"},
    "model": {"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "max_seq_len": 256},
    "batch": {"micro_batch_size": 8, "seq_len": 64, "global_batch_tokens": 1024},
    "data": {"train": "data/tiny/corpus_train_*.bin"}
  })");
}

// The ConfigError message of config_from_json, or "(no error)". Other exceptions propagate.
std::string error_of(const std::vector<std::string>& sets, int world = 1, const json& j = tiny()) {
  try {
    pt::config_from_json(j, sets, world);
  } catch (const pt::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string error_of_json(const json& j) { return error_of({}, 1, j); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("picotrain_test_config_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

std::string read_text(const fs::path& p) {
  std::stringstream s;
  s << std::ifstream(p).rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("every rule names its key and the offending value", "[config]") {
  struct Case {
    std::vector<std::string> set;
    int world;
    std::vector<std::string> want;  // substrings of the message
  };
  const std::vector<Case> cases = {
      // run
      {{"run.name="}, 1, {"run.name=\"\"", "must not be empty"}},
      {{"run.seed=-1"}, 1, {"run.seed=-1", ">= 0"}},
      {{"run.hang_timeout_s=-2"}, 1, {"run.hang_timeout_s=-2", "must be -1", "0 (off)"}},
      // model
      {{"model.n_layers=0"}, 1, {"model.n_layers=0", ">= 1"}},
      {{"model.d_model=0"}, 1, {"model.d_model=0", ">= 1"}},
      {{"model.n_heads=0"}, 1, {"model.n_heads=0", ">= 1"}},
      {{"model.vocab_size=0"}, 1, {"model.vocab_size=0", ">= 1"}},
      {{"model.pad_vocab_multiple=0"}, 1, {"model.pad_vocab_multiple=0", ">= 1"}},
      {{"model.max_seq_len=0"}, 1, {"model.max_seq_len=0", ">= 1"}},
      {{"model.padded_vocab=-1"}, 1, {"model.padded_vocab=-1", ">= 0"}},
      {{"model.d_model=130"}, 1, {"model.d_model=130", "divisible by model.n_heads=4"}},
      {{"model.padded_vocab=300"}, 1, {"model.padded_vocab=300", "derived value 256"}},
      // batch shape
      {{"batch.seq_len=0"}, 1, {"batch.seq_len=0", ">= 1"}},
      {{"batch.seq_len=512"}, 1, {"batch.seq_len=512", "model.max_seq_len=256"}},
      {{"batch.micro_batch_size=0"}, 1, {"batch.micro_batch_size=0", ">= 1"}},
      // parallel sizes and the world
      {{"parallel.tp=0"}, 1, {"parallel.tp=0", ">= 1"}},
      {{"parallel.pp=0"}, 1, {"parallel.pp=0", ">= 1"}},
      {{"parallel.cp=0"}, 1, {"parallel.cp=0", ">= 1"}},
      {{"parallel.dp=0"}, 1, {"parallel.dp=0", "-1"}},
      {{"parallel.dp=-2"}, 1, {"parallel.dp=-2", "-1"}},
      {{"parallel.dp=2"}, 1, {"parallel.dp*tp*pp*cp = 2*1*1*1 = 2", "world size 1"}},
      {{"parallel.tp=2"}, 3, {"parallel.dp=-1", "world size 3", "tp*pp*cp = 2*1*1 = 2"}},
      {{}, 0, {"world size 0"}},
      // tensor parallel
      {{"parallel.tp=3"}, 3, {"parallel.tp=3", "model.n_heads=4"}},
      {{"parallel.tp=3"}, 1, {"parallel.tp=3 must divide model.n_heads=4"}},  // the shape before the world
      {{"parallel.tp=2", "model.vocab_size=255", "model.pad_vocab_multiple=1"}, 2, {"parallel.tp=2", "model.padded_vocab=255"}},
      {{"parallel.tp=4", "parallel.sequence_parallel=true", "batch.seq_len=66", "batch.global_batch_tokens=0"}, 4,
       {"parallel.tp=4", "batch.seq_len=66", "sequence_parallel"}},
      // 1 sequence of 16 tokens over cp 4: 4 tokens per rank, not divisible by tp 8 (nor are 4 heads)
      {{"parallel.tp=8", "parallel.cp=4", "parallel.sequence_parallel=true", "model.n_heads=8",
        "batch.micro_batch_size=1", "batch.seq_len=16", "batch.global_batch_tokens=0"},
       32,
       {"parallel.tp=8 must divide the 4 tokens a context-parallel rank holds", "sequence_parallel"}},
      // context parallel
      {{"parallel.cp=2", "batch.seq_len=66", "batch.global_batch_tokens=0"}, 2, {"batch.seq_len=66", "2*parallel.cp=4"}},
      {{"parallel.cp=4", "parallel.tp=2", "parallel.cp_impl=ulysses"}, 8, {"tp*cp = 2*4 = 8", "model.n_heads=4", "ulysses"}},
      {{"parallel.cp_impl=allgather"}, 1, {"parallel.cp_impl=\"allgather\"", "ring, ulysses"}},
      // pipeline parallel
      {{"parallel.pp=3"}, 3, {"model.n_layers=4", "pp*pp_virtual_stages = 3*1 = 3"}},
      {{"parallel.pp_virtual_stages=0"}, 1, {"parallel.pp_virtual_stages=0", ">= 1"}},
      {{"parallel.pp_schedule=zb"}, 1, {"parallel.pp_schedule=\"zb\"", "afab, 1f1b, interleaved"}},
      {{"parallel.pp=2", "parallel.pp_schedule=interleaved"}, 2, {"parallel.pp_virtual_stages=1", ">= 2"}},
      {{"parallel.pp_schedule=interleaved", "parallel.pp_virtual_stages=2"}, 1, {"parallel.pp=1", ">= 2"}},
      {{"parallel.pp=2", "parallel.pp_virtual_stages=2"}, 2, {"parallel.pp_virtual_stages=2", "must be 1", "1f1b"}},
      {{"parallel.pp=3"}, 3, {"or list the blocks of each stage in parallel.pp_layers"}},
      {{"parallel.pp=2", "parallel.pp_layers=[1,2,1]"}, 2,
       {"parallel.pp_layers=[1,2,1] has 3 entries", "parallel.pp*pp_virtual_stages = 2*1 = 2"}},
      {{"parallel.pp=2", "parallel.pp_layers=[1,2]"}, 2, {"parallel.pp_layers=[1,2] sums to 3 blocks", "model.n_layers=4"}},
      {{"parallel.pp=2", "parallel.pp_layers=[4,0]"}, 2, {"parallel.pp_layers=[4,0]", "entry 1 (0) must be >= 1"}},
      {{"parallel.pp_layers=3"}, 1, {"parallel.pp_layers=3", "an array of integers"}},
      {{"parallel.pp_layers=[1.5,2.5]"}, 1, {"parallel.pp_layers[0]=1.5", "an integer"}},
      // activation recompute
      {{"recompute.mode=some"}, 1, {"recompute.mode=\"some\"", "none, selective, full"}},
      // grid order and ZeRO
      {{"parallel.order=tp-cp-dp"}, 1, {"parallel.order=\"tp-cp-dp\"", "permutation"}},
      {{"parallel.order=tp-tp-dp-pp"}, 1, {"parallel.order=\"tp-tp-dp-pp\"", "permutation"}},
      {{"parallel.order=tp-cp-dp-pp-"}, 1, {"parallel.order=\"tp-cp-dp-pp-\"", "permutation"}},
      {{"parallel.order=tp,cp,dp,pp"}, 1, {"parallel.order=\"tp,cp,dp,pp\"", "permutation"}},
      {{"parallel.zero_stage=4"}, 1, {"parallel.zero_stage=4", "[0, 3]"}},
      {{"parallel.zero_stage=-1"}, 1, {"parallel.zero_stage=-1", "[0, 3]"}},
      {{"parallel.dp_replicate=0"}, 1, {"parallel.dp_replicate=0", ">= 1"}},
      {{"parallel.dp_replicate=2"}, 3, {"parallel.dp_replicate=2 must divide parallel.dp=3"}},
      {{"parallel.grad_bucket_mb=0"}, 1, {"parallel.grad_bucket_mb=0", "> 0"}},
      // global batch and accumulation
      {{"batch.global_batch_tokens=-1"}, 1, {"batch.global_batch_tokens=-1", ">= 0"}},
      {{"batch.global_batch_tokens=1000"}, 1, {"batch.global_batch_tokens=1000", "8*64*1 = 512"}},
      {{}, 4, {"batch.global_batch_tokens=1024", "8*64*4 = 2048"}},
      {{"batch.grad_accum_steps=3"}, 1, {"batch.grad_accum_steps=3", "derived value 2"}},
      {{"batch.grad_accum_steps=-1"}, 1, {"batch.grad_accum_steps=-1", ">= 0"}},
      // optimizer
      {{"optim.lr=0"}, 1, {"optim.lr=0", "> 0"}},
      {{"optim.lr=-0.001"}, 1, {"optim.lr=-0.001", "> 0"}},
      {{"optim.betas=[0.9,1.0]"}, 1, {"optim.betas=[0.9,1.0]", "[0, 1)"}},
      {{"optim.betas=[-0.1,0.9]"}, 1, {"optim.betas=[-0.1,0.9]", "[0, 1)"}},
      {{"optim.eps=0"}, 1, {"optim.eps=0", "> 0"}},
      {{"optim.weight_decay=-0.1"}, 1, {"optim.weight_decay=-0.1", ">= 0"}},
      {{"optim.grad_clip=-1"}, 1, {"optim.grad_clip=-1", ">= 0"}},
      // schedule
      {{"schedule.total_steps=0"}, 1, {"schedule.total_steps=0", ">= 1"}},
      {{"schedule.warmup_steps=-1"}, 1, {"schedule.warmup_steps=-1", ">= 0"}},
      {{"schedule.warmup_steps=2000"}, 1, {"schedule.warmup_steps=2000", "schedule.total_steps=1000"}},
      {{"schedule.decay=step"}, 1, {"schedule.decay=\"step\"", "cosine, linear, wsd, constant"}},
      {{"schedule.min_lr_ratio=1.5"}, 1, {"schedule.min_lr_ratio=1.5", "[0, 1]"}},
      {{"schedule.min_lr_ratio=-0.1"}, 1, {"schedule.min_lr_ratio=-0.1", "[0, 1]"}},
      {{"schedule.cooldown_fraction=0"}, 1, {"schedule.cooldown_fraction=0", "(0, 1]"}},
      {{"schedule.cooldown_fraction=1.5"}, 1, {"schedule.cooldown_fraction=1.5", "(0, 1]"}},
      // precision
      {{"precision.compute_dtype=fp16"}, 1, {"precision.compute_dtype=\"fp16\"", "auto, fp32, bf16"}},
      {{"precision.master_weights=bf16"}, 1, {"precision.master_weights=\"bf16\"", "fp32"}},
      // data
      {{"data.train="}, 1, {"data.train=\"\"", "must not be empty"}},
      {{"data.val_every_steps=-1"}, 1, {"data.val_every_steps=-1", ">= 0"}},
      {{"data.val_tokens=-1"}, 1, {"data.val_tokens=-1", ">= 0"}},
      // checkpoint
      {{"checkpoint.every_steps=-1"}, 1, {"checkpoint.every_steps=-1", ">= 0"}},
      {{"checkpoint.keep_latest=1"}, 1, {"checkpoint.keep_latest=1", ">= 2"}},
      {{"checkpoint.keep_every=-1"}, 1, {"checkpoint.keep_every=-1", ">= 0"}},
      {{"checkpoint.save_timeout_s=-1"}, 1, {"checkpoint.save_timeout_s=-1", ">= 0"}},
      {{"checkpoint.resume="}, 1, {"checkpoint.resume=\"\"", "must not be empty"}},
      // logging
      {{"logging.every_steps=0"}, 1, {"logging.every_steps=0", ">= 1"}},
      {{"logging.metrics_file="}, 1, {"logging.metrics_file=\"\"", "must not be empty"}},
      {{"logging.peak_tflops=-1"}, 1, {"logging.peak_tflops=-1", ">= 0"}},
      {{"logging.flops_formula=megatron"}, 1, {"logging.flops_formula=\"megatron\"", "palm, llmc"}},
      {{"logging.sample_every=-1"}, 1, {"logging.sample_every=-1", ">= 0"}},
      {{"logging.sample_tokens=0"}, 1, {"logging.sample_tokens=0", ">= 1"}},
      // model: the Llama family's keys
      {{"model.arch=bert"}, 1, {"model.arch=\"bert\"", "gpt2, llama"}},
      {{"model.n_kv_heads=-1"}, 1, {"model.n_kv_heads=-1", ">= 0"}},
      {{"model.ffn_hidden=-1"}, 1, {"model.ffn_hidden=-1", ">= 0"}},
      {{"model.norm_eps=1"}, 1, {"model.norm_eps=1", "[0, 1)"}},
      {{"model.rope_theta=-1"}, 1, {"model.rope_theta=-1", ">= 0"}},
      {{"model.n_kv_heads=2"}, 1, {"model.n_kv_heads does not apply to model.arch=\"gpt2\"", "multi-head"}},
      {{"model.ffn_hidden=100"}, 1, {"model.ffn_hidden does not apply to model.arch=\"gpt2\""}},
      {{"model.ffn_multiple_of=64"}, 1, {"model.ffn_multiple_of does not apply"}},
      {{"model.ffn_dim_multiplier=1.3"}, 1, {"model.ffn_dim_multiplier does not apply"}},
      {{"model.norm_eps=1e-6"}, 1, {"model.norm_eps does not apply", "1e-5"}},
      {{"model.rope_theta=10000"}, 1, {"model.rope_theta does not apply", "learns its positions"}},
      {{"model.tie_embeddings=false"}, 1, {"model.tie_embeddings does not apply"}},
      {{"model.arch=llama", "model.n_kv_heads=3"}, 1, {"model.n_kv_heads=3 must divide model.n_heads=4"}},
      {{"model.arch=llama", "model.n_heads=128"}, 1, {"= 1 must be even for RoPE"}},
      {{"model.arch=llama", "model.n_kv_heads=1", "parallel.tp=2"}, 2,
       {"parallel.tp=2 must divide model.n_kv_heads=1", "whole key/value heads"}},
      {{"model.arch=llama", "model.n_kv_heads=2", "parallel.tp=2", "parallel.cp=2", "parallel.cp_impl=ulysses"}, 4,
       {"parallel.tp*cp = 2*2 = 4 must divide model.n_kv_heads=2"}},
      {{"model.arch=llama", "model.ffn_hidden=341", "parallel.tp=2"}, 2,
       {"parallel.tp=2 must divide the MLP width model.ffn_hidden=341"}},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(join(c.set) << " on " << c.world << " ranks") {
      std::string msg = error_of(c.set, c.world);
      for (const auto& w : c.want) CHECK_THAT(msg, Contains(w));
    }
  }
}

TEST_CASE("a rule breaks the same way in the file as through --set", "[config]") {
  json j = tiny();
  j["model"]["n_heads"] = 3;
  CHECK_THAT(error_of_json(j), Contains("model.d_model=128 must be divisible by model.n_heads=3"));
}

TEST_CASE("defaults are GPT-2 124M", "[config]") {
  auto c = pt::config_from_json(json{{"data", {{"train", "x_*.bin"}}}}, {}, 1);
  CHECK(c.run.name == "picotrain");
  CHECK(c.run.seed == 1337);
  CHECK(c.run.hang_timeout_s == -1);
  CHECK(c.model.arch == "gpt2");
  CHECK(c.model.n_layers == 12);
  CHECK(c.model.d_model == 768);
  CHECK(c.model.n_heads == 12);
  CHECK(c.model.head_dim() == 64);
  CHECK(c.model.vocab_size == 50257);
  CHECK(c.model.max_seq_len == 1024);
  CHECK(c.parallel.order == "tp-cp-dp-pp");
  CHECK(c.parallel.pp_schedule == "1f1b");
  CHECK(c.parallel.cp_impl == "ring");
  CHECK(c.parallel.zero_stage == 0);
  CHECK_FALSE(c.parallel.sequence_parallel);
  CHECK(c.batch.micro_batch_size == 4);
  CHECK(c.batch.seq_len == 1024);
  CHECK(c.optim.lr == 6e-4);
  CHECK(c.optim.betas == std::array<double, 2>{0.9, 0.95});
  CHECK(c.optim.eps == 1e-8);
  CHECK(c.schedule.decay == "cosine");
  CHECK(c.precision.compute_dtype == "auto");
  CHECK(c.data.val.empty());
  CHECK(c.checkpoint.final);  // a finished run leaves its trained model
  CHECK(c.checkpoint.keep_latest == 2);
  CHECK(c.checkpoint.keep_every == 0);
  CHECK(c.checkpoint.save_timeout_s == 900);
  CHECK(c.checkpoint.resume == "none");
  CHECK(c.logging.metrics_file == "metrics.jsonl");
  CHECK(c.logging.flops_formula == "palm");
  CHECK(c.logging.sample_every == 0);
  CHECK(c.logging.sample_prompt == "The");
  CHECK(c.logging.sample_tokens == 64);
  // derived
  CHECK(c.model.padded_vocab == 50304);
  CHECK(c.parallel.dp == 1);
  CHECK(c.batch.global_batch_tokens == 4 * 1024);
  CHECK(c.batch.grad_accum_steps == 1);
  CHECK(c.run.out_dir == "runs/picotrain");
  CHECK(c.checkpoint.dir == "runs/picotrain/checkpoints");
  CHECK(c.world_size == 1);
}

TEST_CASE("the Llama family's shape: its defaults, and Llama's MLP-width rule", "[config]") {
  auto c = pt::config_from_json(tiny(), {"model.arch=llama"}, 1);
  CHECK(c.model.n_kv_heads == 4);  // multi-head unless told
  CHECK(c.model.ffn_hidden == 512);  // 8/3 * 128 = 341, up to a multiple of 256
  CHECK(c.model.ffn_multiple_of == 256);
  CHECK(c.model.ffn_dim_multiplier == 1.0);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(c.model.rope_theta == 10000.0);
  CHECK(c.model.tie_embeddings == false);
  // GPT-2 resolves to its own fixed values, which read back.
  auto g = pt::config_from_json(tiny(), {}, 1);
  CHECK(g.model.n_kv_heads == 4);
  CHECK(g.model.ffn_hidden == 512);  // 4 * 128
  CHECK(g.model.tie_embeddings == true);
  CHECK(g.model.rope_theta == 0.0);
  // The published Llama 3 widths (Llama 3 paper; Meta's reference code's rule).
  pt::ModelSection m;
  m.arch = "llama";
  const auto width = [&](int d, int multiple, double mult) {
    m.d_model = d;
    m.ffn_multiple_of = multiple;
    m.ffn_dim_multiplier = mult;
    return m.ffn_width();
  };
  CHECK(width(4096, 1024, 1.3) == 14336);   // 8B
  CHECK(width(8192, 4096, 1.3) == 28672);   // 70B
  CHECK(width(16384, 4096, 1.2) == 53248);  // 405B
  CHECK(width(2048, 256, 0) == 5632);       // TinyLlama 1.1B
  m.ffn_hidden = 1000;
  CHECK(m.ffn_width() == 1000);  // given: taken as it is
}

TEST_CASE("derived values", "[config]") {
  SECTION("padded vocab rounds up to the multiple") {
    auto padded = [](int vocab, int multiple) {
      return pt::config_from_json(tiny(), {"model.vocab_size=" + std::to_string(vocab),
                                           "model.pad_vocab_multiple=" + std::to_string(multiple)}, 1)
          .model.padded_vocab;
    };
    CHECK(padded(50257, 128) == 50304);
    CHECK(padded(256, 128) == 256);
    CHECK(padded(257, 128) == 384);
    CHECK(padded(255, 1) == 255);
    // a given padded_vocab that agrees is accepted
    CHECK(pt::config_from_json(tiny(), {"model.padded_vocab=256"}, 1).model.padded_vocab == 256);
  }
  SECTION("dp=-1 takes the ranks tp*pp*cp leave") {
    auto c = pt::config_from_json(tiny(), {"parallel.tp=2", "parallel.pp=2", "batch.global_batch_tokens=0"}, 8);
    CHECK(c.parallel.dp == 2);
    CHECK(pt::config_from_json(tiny(), {"parallel.cp=2"}, 4).parallel.dp == 2);
    CHECK(pt::config_from_json(tiny(), {"parallel.dp=2", "parallel.tp=2"}, 4).parallel.dp == 2);
  }
  SECTION("gradient accumulation fills the global batch") {
    auto accum = [](std::vector<std::string> sets, int world) {
      return pt::config_from_json(tiny(), sets, world).batch.grad_accum_steps;
    };
    CHECK(accum({}, 1) == 2);  // 1024 / (8*64)
    CHECK(accum({}, 2) == 1);  // dp=2
    CHECK(accum({"parallel.tp=2"}, 2) == 2);  // TP ranks share a batch
    CHECK(accum({"parallel.cp=2"}, 2) == 2);  // so do CP ranks
    CHECK(accum({"batch.global_batch_tokens=8192"}, 2) == 8);
    auto c = pt::config_from_json(tiny(), {"batch.global_batch_tokens=0"}, 4);
    CHECK(c.batch.grad_accum_steps == 1);
    CHECK(c.batch.global_batch_tokens == 8 * 64 * 4);
  }
  SECTION("paths follow run.name and run.out_dir") {
    auto c = pt::config_from_json(tiny(), {"run.name=exp1"}, 1);
    CHECK(c.run.out_dir == "runs/exp1");
    CHECK(c.checkpoint.dir == "runs/exp1/checkpoints");
    c = pt::config_from_json(tiny(), {"run.out_dir=/scratch/x"}, 1);
    CHECK(c.checkpoint.dir == "/scratch/x/checkpoints");
    c = pt::config_from_json(tiny(), {"checkpoint.dir=/ckpt"}, 1);
    CHECK(c.checkpoint.dir == "/ckpt");
  }
}

TEST_CASE("--set overrides", "[config]") {
  SECTION("values are JSON when they parse, else strings") {
    auto c = pt::config_from_json(tiny(), {"run.name=foo", "optim.lr=3e-4", "optim.betas=[0.9,0.99]",
                                           "parallel.sequence_parallel=true", "data.val=data/v_*.bin"}, 1);
    CHECK(c.run.name == "foo");
    CHECK(c.optim.lr == 3e-4);
    CHECK(c.optim.betas == std::array<double, 2>{0.9, 0.99});
    CHECK(c.parallel.sequence_parallel);
    CHECK(c.data.val == "data/v_*.bin");
  }
  SECTION("a string key takes the text literally unless it is a quoted string") {
    CHECK(pt::config_from_json(tiny(), {"run.name=2024"}, 1).run.name == "2024");
    CHECK(pt::config_from_json(tiny(), {"run.name=true"}, 1).run.name == "true");
    CHECK(pt::config_from_json(tiny(), {"run.name=\"q\""}, 1).run.name == "q");
    CHECK(pt::config_from_json(tiny(), {"run.name=a=b"}, 1).run.name == "a=b");
    // A sample prompt is text whatever it looks like, the empty text and newlines included.
    CHECK(pt::config_from_json(tiny(), {"logging.sample_prompt=1 2 3"}, 1).logging.sample_prompt == "1 2 3");
    CHECK(pt::config_from_json(tiny(), {"logging.sample_prompt="}, 1).logging.sample_prompt.empty());
    CHECK(pt::config_from_json(tiny(), {"logging.sample_prompt=\"\\n\""}, 1).logging.sample_prompt == "\n");
  }
  SECTION("applied after the file, in order") {
    auto c = pt::config_from_json(tiny(), {"model.n_layers=8", "model.n_layers=2"}, 1);
    CHECK(c.model.n_layers == 2);
  }
  SECTION("bad forms") {
    CHECK_THAT(error_of({"model.n_layers"}), Contains("missing '='") && Contains("model.n_layers"));
    CHECK_THAT(error_of({"n_layers=3"}), Contains("missing '.'") && Contains("n_layers"));
    CHECK_THAT(error_of({"model.n_layer=3"}),
               Contains("unknown key model.n_layer") && Contains("valid keys in model: arch, n_layers, d_model"));
    CHECK_THAT(error_of({"modle.n_layers=3"}), Contains("unknown section modle") && Contains("run, model, moe, parallel"));
    CHECK_THAT(error_of({"model.n_layers=abc"}),
               Contains("model.n_layers=\"abc\" is a string, expected an integer") && Contains("--set model.n_layers=abc"));
    CHECK_THAT(error_of({"optim.betas=[0.9]"}), Contains("optim.betas=[0.9]") && Contains("2 numbers"));
  }
}

TEST_CASE("unknown keys and wrong types in the file", "[config]") {
  json j = tiny();
  SECTION("unknown key lists the valid ones") {
    j["model"]["n_layer"] = 4;
    CHECK_THAT(error_of_json(j), Contains("unknown key model.n_layer (valid keys in model: arch, n_layers, d_model"));
  }
  SECTION("unknown section, even when empty") {
    j["modle"] = json::object();
    CHECK_THAT(error_of_json(j), Contains("unknown section modle (valid sections: run, model, moe, parallel, recompute, batch, "
                                          "optim, schedule, precision, data, eval, checkpoint, logging)"));
  }
  SECTION("a section that is not an object") {
    j["model"] = 3;
    CHECK_THAT(error_of_json(j), Contains("model=3 must be an object"));
  }
  SECTION("the config is not an object") { CHECK_THAT(error_of_json(json::array()), Contains("JSON object")); }
  SECTION("integer keys") {
    j["model"]["n_layers"] = "4";
    CHECK_THAT(error_of_json(j), Contains("model.n_layers=\"4\" is a string, expected an integer"));
    j["model"]["n_layers"] = 4.5;
    CHECK_THAT(error_of_json(j), Contains("model.n_layers=4.5 is a fractional number, expected an integer"));
    j["model"]["n_layers"] = 4294967297LL;
    CHECK_THAT(error_of_json(j), Contains("model.n_layers=4294967297 is out of range"));
    j["model"]["n_layers"] = nullptr;
    CHECK_THAT(error_of_json(j), Contains("model.n_layers=null is null, expected an integer"));
  }
  SECTION("number, boolean, string, pair keys") {
    j["optim"]["lr"] = "fast";
    CHECK_THAT(error_of_json(j), Contains("optim.lr=\"fast\" is a string, expected a number"));
    j = tiny();
    j["parallel"]["sequence_parallel"] = 1;
    CHECK_THAT(error_of_json(j), Contains("parallel.sequence_parallel=1 is an integer, expected a boolean"));
    j = tiny();
    j["checkpoint"]["final"] = "no";
    CHECK_THAT(error_of_json(j), Contains("checkpoint.final=\"no\" is a string, expected a boolean"));
    CHECK_THAT(error_of({"checkpoint.final=0"}), Contains("checkpoint.final=0 is an integer, expected a boolean"));
    CHECK_FALSE(pt::config_from_json(tiny(), {"checkpoint.final=false"}, 1).checkpoint.final);
    j = tiny();
    j["run"]["name"] = 7;
    CHECK_THAT(error_of_json(j), Contains("run.name=7 is an integer, expected a string"));
    j = tiny();
    j["optim"]["betas"] = {0.9, "x"};
    CHECK_THAT(error_of_json(j), Contains("optim.betas[1]=\"x\" is a string, expected a number"));
  }
  SECTION("JSON has one number type: whole numbers are integers, integers are numbers") {
    j["optim"]["lr"] = 1;
    j["data"]["val_tokens"] = 1e7;
    auto c = pt::config_from_json(j, {"schedule.total_steps=2e3"}, 1);
    CHECK(c.optim.lr == 1.0);
    CHECK(c.data.val_tokens == 10000000);
    CHECK(c.schedule.total_steps == 2000);
    CHECK(pt::config_to_json(c)["data"]["val_tokens"].is_number_integer());
    CHECK_THAT(error_of({"model.n_layers=1e10"}), Contains("model.n_layers=10000000000") && Contains("out of range"));
    CHECK_THAT(error_of({"run.seed=1e20"}), Contains("run.seed=1e+20 is out of range"));
  }
}

TEST_CASE("the resolved config round-trips", "[config]") {
  auto check_round_trip = [](const std::vector<std::string>& sets, int world) {
    json first = pt::config_to_json(pt::config_from_json(tiny(), sets, world));
    for (const auto& k : pt::config::config_keys()) CHECK(first[k.section].contains(k.name));
    CHECK(first["parallel"]["dp"] != -1);
    CHECK(first["batch"]["grad_accum_steps"] != 0);
    CHECK(first["model"]["padded_vocab"] == 256);
    json second = pt::config_to_json(pt::config_from_json(first, {}, world));
    CHECK(first == second);
  };
  SECTION("one rank") { check_round_trip({}, 1); }
  SECTION("llama with grouped-query attention") {
    check_round_trip({"model.arch=llama", "model.n_kv_heads=2", "model.rope_theta=500000", "parallel.tp=2"}, 2);
  }
  SECTION("a 4-D layout") {
    check_round_trip({"parallel.tp=2", "parallel.pp=2", "parallel.cp=2", "parallel.sequence_parallel=true",
                      "parallel.zero_stage=1", "optim.betas=[0.8,0.9]"}, 16);
  }
  SECTION("through the file write_resolved_config writes") {
    TempDir tmp;
    auto cfg = pt::config_from_json(tiny(), {"run.out_dir=" + (tmp.path / "run").string()}, 2);
    pt::write_resolved_config(cfg);
    fs::path written = tmp.path / "run" / "config.json";
    REQUIRE(fs::exists(written));
    CHECK(std::distance(fs::directory_iterator(tmp.path / "run"), fs::directory_iterator()) == 1);  // no temp left
    CHECK(pt::config_to_json(pt::load_config(written.string(), {}, 2)) == pt::config_to_json(cfg));
    pt::write_resolved_config(cfg);  // overwriting is fine
    // the file lists sections in the documented order, not alphabetically
    std::string text = read_text(written);
    CHECK(text.find("\"run\"") < text.find("\"model\""));
  }
}

TEST_CASE("load_config reports file problems", "[config]") {
  TempDir tmp;
  SECTION("missing file names the path") {
    std::string path = (tmp.path / "nope.json").string();
    CHECK_THROWS_WITH(pt::load_config(path, {}, 1), Contains(path));
  }
  SECTION("syntax error names the file and the position") {
    auto path = tmp.write("bad.json", "{\n  \"run\": {\"name\": \"x\",}\n}\n").string();
    CHECK_THROWS_WITH(pt::load_config(path, {}, 1), Contains(path) && Contains("line 2"));
  }
  SECTION("overrides apply to the file") {
    auto path = tmp.write("ok.json", tiny().dump()).string();
    CHECK(pt::load_config(path, {"model.n_layers=2"}, 1).model.n_layers == 2);
  }
}

TEST_CASE("the shipped configs load", "[config]") {
  const std::string dir = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/";
  SECTION("tiny") {
    auto c = pt::load_config(dir + "tiny.json", {}, 1);
    CHECK(c.model.padded_vocab == 256);
    CHECK(c.batch.grad_accum_steps == 4);  // 4 micro-batches: room for dp up to 4
    CHECK(c.schedule.total_steps == 200);
    CHECK(c.data.val == "data/tiny/corpus_val_*.bin");
  }
  SECTION("the Llama configs: tiny, and Llama 3's published shapes") {
    const auto tiny_llama = pt::load_config(dir + "tiny-llama.json", {}, 1);
    CHECK(tiny_llama.model.arch == "llama");
    CHECK(tiny_llama.model.n_kv_heads == 2);
    const auto l8 = pt::load_config(dir + "llama3-8b.json", {}, 8);
    CHECK(l8.model.ffn_hidden == 14336);
    CHECK(l8.model.n_kv_heads == 8);
    CHECK(l8.model.vocab_size == 128256);
    CHECK(l8.model.rope_theta == 500000.0);
    CHECK(pt::load_config(dir + "llama3-70b.json", {}, 32).model.ffn_hidden == 28672);
    const auto l405 = pt::load_config(dir + "llama3-405b.json", {}, 16384);
    CHECK(l405.model.ffn_hidden == 53248);
    CHECK(l405.model.n_layers == 126);
    CHECK(l405.parallel.dp == 128);  // tp 8 x pp 16 x dp 128 = 16384
    CHECK(l405.batch.global_batch_tokens == 16777216);
  }
  SECTION("tiny admits the layouts the parallel tests use") {
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2, 4})
        for (int cp : {1, 2, 4})
          for (int dp : {1, 2, 4}) {
            int world = tp * pp * cp * dp;
            if (world > 16) continue;
            std::vector<std::string> sets = {"parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
                                             "parallel.cp=" + std::to_string(cp), "parallel.sequence_parallel=true"};
            INFO(join(sets) << " dp=" << dp);
            CHECK_NOTHROW(pt::load_config(dir + "tiny.json", sets, world));
            if (tp * cp <= 4) {
              sets.push_back("parallel.cp_impl=ulysses");
              CHECK_NOTHROW(pt::load_config(dir + "tiny.json", sets, world));
            }
          }
    CHECK_NOTHROW(pt::load_config(dir + "tiny.json",
                                  {"parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual_stages=2"}, 2));
  }
  SECTION("gpt2-124m") {
    auto c = pt::load_config(dir + "gpt2-124m.json", {}, 8);
    CHECK(c.model.padded_vocab == 50304);
    CHECK(c.batch.grad_accum_steps == 1);
    CHECK(c.schedule.total_steps == 18865);
    CHECK(pt::load_config(dir + "gpt2-124m.json", {}, 1).batch.grad_accum_steps == 8);
  }
}

// The configuration reference (docs/configuration.md, `picotrain keys`) explains every key of
// the key table once, with the table's own type and default: explaining a new key is part of
// adding it (core/config/config_reference_text.cpp). The markdown that `picotrain keys --markdown`
// prints reads back to the same rows; the ctest config_reference_doc compares it with the file.
TEST_CASE("the reference explains every key once, and its markdown reads back to it", "[config]") {
  std::set<std::string> explained;
  for (const auto& m : pt::config::key_meanings()) {
    const std::string path(m.path);
    INFO(path);
    CHECK(explained.insert(path).second);  // one meaning per key
    CHECK_FALSE(m.meaning.empty());
    const size_t dot = path.find('.');
    REQUIRE(dot != std::string::npos);
    CHECK_NOTHROW(pt::config::find_key(path.substr(0, dot), path.substr(dot + 1)));  // no meaning without a key
  }
  const std::vector<pt::config::KeyDoc> docs = pt::config::config_reference();
  const pt::RunConfig defaults;
  REQUIRE(docs.size() == pt::config::config_keys().size());
  for (size_t i = 0; i < docs.size(); i++) {
    const auto& k = pt::config::config_keys()[i];
    INFO("reference row for " << k.path());
    CHECK(docs[i].path() == k.path());
    CHECK(docs[i].type == k.type);
    CHECK(docs[i].default_json == k.write(defaults).dump());
  }
  const std::string markdown = pt::config::config_reference_markdown();
  const std::vector<pt::config::KeyDoc> read_back = pt::config::parse_config_reference(markdown);
  REQUIRE(read_back.size() == docs.size());
  for (size_t i = 0; i < docs.size(); i++) {
    INFO(docs[i].path());
    CHECK(read_back[i].path() == docs[i].path());
    CHECK(read_back[i].type == docs[i].type);
    CHECK(read_back[i].default_json == docs[i].default_json);
    CHECK(read_back[i].meaning == docs[i].meaning);  // a '|' in a meaning is escaped in the table
  }
  CHECK_THAT(markdown, Contains("](../README.md)") && Contains("picotrain keys --markdown > docs/configuration.md"));
  for (const std::string& s : pt::config::config_sections()) CHECK_THAT(markdown, Contains("\n## " + s + "\n"));
}

TEST_CASE("the key help: a section, a key, a part of a name, or every key", "[config]") {
  const auto docs = pt::config::parse_config_reference(
      "# Title\n| `not_a_key` | x | `1` | before the first section |\n## run\n| key | type | default | meaning |\n"
      "|---|---|---|---|\n"
      "| `seed` | integer | `1337` | Seed of `every` random stream, with enough words to need a second line. |\n"
      "## optim\n| `lr` | number | `0.0006` | Peak learning rate. |\n| `seed_like` | number | `1.0` | Made up. |\n"
      "# Next\n| `ignored` | x | `1` | after the reference |\n");
  REQUIRE(docs.size() == 3);
  CHECK(docs[0].path() == "run.seed");
  CHECK(docs[0].default_json == "1337");
  const std::string all = pt::config::format_key_help(docs, "", 40);
  CHECK(all ==
        "run\n  run.seed  (integer, default 1337)\n      Seed of every random stream, with\n      enough words to "
        "need a second\n      line.\n\noptim\n  optim.lr  (number, default 0.0006)\n      Peak learning rate.\n  "
        "optim.seed_like  (number, default 1.0)\n      Made up.\n");
  // A '|' escaped in a cell is one character of the meaning; a link reads as its text and file.
  const auto escaped = pt::config::parse_config_reference(
      "## checkpoint\n| `save_timeout_s` | number | `900.0` | The log's `checkpoint\\| ... saved` line; see "
      "[hangs](reliability.md#when-a-run-hangs). |\n");
  REQUIRE(escaped.size() == 1);
  CHECK(escaped[0].meaning == "The log's `checkpoint| ... saved` line; see [hangs](reliability.md#when-a-run-hangs).");
  CHECK_THAT(pt::config::format_key_help(escaped, ""),
             Contains("The log's checkpoint| ... saved line; see hangs (docs/reliability.md)."));
  CHECK_THAT(pt::config::format_key_help(docs, "optim"), Contains("optim.lr") && Contains("optim.seed_like"));
  const std::string seed = pt::config::format_key_help(docs, "seed");  // a part of two names
  CHECK_THAT(seed, Contains("run.seed") && Contains("optim.seed_like") && !Contains("optim.lr"));
  CHECK(pt::config::format_key_help(docs, "nothing").empty());
}

// Needs the picotrain binary (app/main.cpp): run alone with `test_config "[cli]"`.
TEST_CASE("a bad config exits 2 with one error line naming the key", "[cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  TempDir tmp;
  json bad = tiny();
  bad["model"]["n_heads"] = 3;
  auto config = tmp.write("bad.json", bad.dump());
  auto good = tmp.write("good.json", tiny().dump());
  auto err = tmp.path / "stderr.txt";

  auto run = [&](const std::string& args) {
    std::string cmd = std::string("'") + PICOTRAIN_BIN + "' train " + args + " >/dev/null 2>'" + err.string() + "'";
    int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  };
  auto error_lines = [&] {
    std::vector<std::string> lines;
    std::ifstream in(err);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("error:", 0) == 0) lines.push_back(line);
    return lines;
  };

  SECTION("a rule in the file") {
    CHECK(run("--config '" + config.string() + "'") == 2);
    auto lines = error_lines();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Contains("model.n_heads=3"));
  }
  SECTION("an unknown key through --set") {
    CHECK(run("--config '" + good.string() + "' --set model.n_layer=3") == 2);
    auto lines = error_lines();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Contains("model.n_layer"));
  }
  SECTION("a missing config file") {
    CHECK(run("--config '" + (tmp.path / "nope.json").string() + "'") == 2);
    auto lines = error_lines();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Contains("nope.json"));
  }
}

TEST_CASE("picotrain keys explains the keys; a filter that matches none exits 2", "[cli]") {
  REQUIRE(fs::exists(PICOTRAIN_BIN));
  auto keys = [](const std::string& args) { return pt::test::run_command(std::string(PICOTRAIN_BIN) + " keys " + args); };
  const pt::test::Launch all = keys("");
  CHECK(all.exit_code == 0);
  for (const auto& k : pt::config::config_keys()) CHECK_THAT(all.output, Contains("  " + k.path() + "  ("));
  const pt::test::Launch parallel = keys("parallel");
  CHECK(parallel.exit_code == 0);
  CHECK_THAT(parallel.output, Contains("parallel.zero_stage  (integer, default 0)") && !Contains("optim.lr"));
  const pt::test::Launch bad = keys("no_such_key");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("error: no config key matches 'no_such_key'; the sections are run, model"));
}

TEST_CASE("the moe section: its rules and resolved values", "[config][moe]") {
  const std::vector<std::string> llama = {"model.arch=llama", "moe.n_experts=4"};
  auto c = pt::config_from_json(tiny(), llama, 1);
  CHECK(c.model.moe.enabled());
  CHECK(c.model.moe.expert_hidden == 512);  // 0: the dense width (Llama's rule on d_model 128)
  CHECK(c.model.moe.top_k == 2);
  CHECK(pt::config_to_json(c)["moe"]["expert_hidden"] == 512);  // resolved, and it reads back
  CHECK(pt::config_from_json(pt::config_to_json(c), {}, 1).model.moe.expert_hidden == 512);
  CHECK(!pt::config_from_json(tiny(), {}, 1).model.moe.enabled());

  CHECK(error_of({"moe.n_experts=4"}) ==
        "moe.n_experts=4 needs model.arch=\"llama\" (the experts are SwiGLU MLPs in a Llama block, as in Mixtral); "
        "model.arch=\"gpt2\"");
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), llama.begin(), llama.end());
    return more;
  };
  CHECK(error_of(with({"moe.top_k=5"})) == "moe.top_k=5 must be <= moe.n_experts=4");
  CHECK(error_of(with({"moe.every=5"})) ==
        "moe.every=5 must be <= model.n_layers=4 (block l is sparse when (l + 1) % every == 0; no block would be)");
  CHECK(error_of(with({"moe.top_k=0"})) == "moe.top_k=0 must be >= 1");
  CHECK(error_of(with({"moe.aux_loss_coef=-1"})) == "moe.aux_loss_coef=-1.0 must be >= 0");
  CHECK(error_of(with({"moe.n_shared_experts=1", "moe.expert_hidden=3", "parallel.tp=2"}), 2) ==
        "parallel.tp=2 must divide the shared experts' width moe.n_shared_experts*expert_hidden = 1*3 = 3 (they are "
        "one tensor-parallel SwiGLU; the routed experts are not split by tp)");
  CHECK(error_of({"parallel.ep=2"}, 2) == "parallel.ep=2 needs experts to split: set moe.n_experts (or parallel.ep=1)");
  CHECK(error_of(with({"parallel.ep=2", "parallel.tp=2"}), 2) ==
        "parallel.ep=2 must divide parallel.dp=1 (expert parallel groups are made of data-parallel ranks)");
  CHECK(error_of(with({"parallel.ep=3"}), 3) ==
        "parallel.ep=3 must divide moe.n_experts=4 (each expert-parallel rank runs n_experts/ep experts)");
  CHECK(pt::config_from_json(tiny(), with({"parallel.ep=2"}), 2).parallel.ep == 2);
  // HSDP: an ep group lies within one replica.
  CHECK(error_of(with({"parallel.ep=2", "parallel.dp=4", "parallel.dp_replicate=4"}), 4) ==
        "parallel.ep=2 must divide dp_shard = parallel.dp/parallel.dp_replicate = 1 (an expert-parallel group lies "
        "within one HSDP replica)");
  CHECK(pt::config_from_json(tiny(), with({"parallel.ep=2", "parallel.dp=4", "parallel.dp_replicate=2", "batch.global_batch_tokens=2048"}), 4)
            .parallel.ep == 2);
}
