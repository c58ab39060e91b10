// Multiple-choice evaluation (core/eval/): the HellaSwag JSONL reader and its errors, the rows'
// layout (truncation, skipping), the scoring rules, the trainer's per-row losses against the
// KV-cache decoder's independent forward, eval.task during training (metrics.jsonl) and the
// `picotrain eval` command's results and errors.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/config/run_config.h"
#include "core/cpu/cpu_ops.h"
#include "core/data/shard.h"
#include "core/eval/mc_score.h"
#include "core/eval/mc_task.h"
#include "core/model/kv_cache_decoder.h"
#include "core/tokenizer/tokenizer.h"
#include "core/train/trainer.h"
#include "run_test_support.h"

using namespace pt;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct TempDir {
  fs::path dir;
  explicit TempDir(const std::string& tag) {
    dir = fs::temp_directory_path() / ("picotrain_test_mc_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  }
};

std::string example_line(const std::string& ctx, const std::vector<std::string>& endings, int label) {
  return json{{"ctx", ctx}, {"endings", endings}, {"label", label}, {"ind", 7}}.dump() + "\n";
}

// `n` examples of English-like text, four endings each.
std::string small_task(int n) {
  const std::vector<std::string> words = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "off"};
  std::mt19937 rng(3);
  std::string out;
  auto phrase = [&](int len) {
    std::string s;
    for (int i = 0; i < len; i++) s += (i ? " " : "") + words[rng() % words.size()];
    return s;
  };
  for (int i = 0; i < n; i++)
    out += example_line("A man " + phrase(2 + i % 3) + ".", {phrase(1), phrase(2), phrase(1 + i % 2), phrase(3)},
                        static_cast<int>(rng() % 4));
  return out;
}

}  // namespace

TEST_CASE("the HellaSwag reader takes ctx, endings and label, and names the line of a malformed one", "[eval]") {
  TempDir tmp("reader");
  const std::string good = tmp.write("tiny_val.jsonl", example_line("Ctx one", {"a", "b", "c", "d"}, 2) + "\n" +
                                                           example_line("Ctx two", {"e", "f"}, 0));
  const std::vector<McExample> all = read_mc_task(good);
  REQUIRE(all.size() == 2);
  CHECK(all[0].context == "Ctx one");
  CHECK(all[0].endings == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(all[0].label == 2);
  CHECK(all[1].line == 3);  // the blank line is counted, not read
  CHECK(read_mc_task(good, 1).size() == 1);
  CHECK(mc_task_name(good) == "tiny");
  CHECK(mc_task_name("/x/HellaSwag.jsonl") == "hellaswag");

  const std::string first = example_line("c", {"a", "b"}, 0);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "line 2: not JSON"},
      {R"({"ctx": "c", "endings": ["a", "b"], "label": 2})", "line 2: \"label\" 2 is not an index of its 2 endings"},
      {R"({"ctx": "c", "endings": ["a"], "label": 0})", "line 2: \"endings\" must be an array of at least two"},
      {R"({"endings": ["a", "b"], "label": 0})", "line 2: \"ctx\" must be a string"},
      {R"({"ctx": "c", "endings": ["a", ""], "label": 0})", "line 2: every ending must be a non-empty string"},
      {R"({"ctx": "c", "endings": ["a", "b"], "label": "0"})", "line 2: \"label\" must be an integer"},
      {R"([1, 2])", "line 2: expected a JSON object"},
  };
  for (const auto& [line, message] : bad) {
    INFO(line);
    const std::string path = tmp.write("bad.jsonl", first + line + "\n");
    CHECK_THROWS_WITH(read_mc_task(path), Catch::Contains(message) && Catch::Contains("bad.jsonl"));
    CHECK_THROWS_AS(read_mc_task(path), ConfigError);
  }
  CHECK_THROWS_WITH(read_mc_task((tmp.dir / "none.jsonl").string()), Catch::Contains("cannot be read"));
  CHECK_THROWS_WITH(read_mc_task(tmp.write("empty.jsonl", "\n\n")), Catch::Contains("holds no example"));
}

TEST_CASE("examples are tokenized as llm.c does: the context, then each ending after a space", "[eval]") {
  const auto bytes = make_tokenizer("bytes");
  McExample ex;
  ex.context = "Hi";
  ex.endings = {"yo", "x"};
  ex.label = 1;
  const std::vector<McTokens> t = tokenize_mc_task({ex}, *bytes);
  REQUIRE(t.size() == 1);
  CHECK(t[0].context == std::vector<int32_t>{'H', 'i'});
  CHECK(t[0].endings == std::vector<std::vector<int32_t>>{{' ', 'y', 'o'}, {' ', 'x'}});
  CHECK(t[0].label == 1);
}

TEST_CASE("rows: the ending's tokens are the only targets; long contexts are cut from the left, too long endings skip",
          "[eval]") {
  McTokens fits{{1, 2, 3}, {{4, 5}, {6}}, 0};
  McTokens cut{{1, 2, 3, 4, 5, 6}, {{7, 8, 9}, {10}}, 1};  // 6 + 3 = 9 tokens > T + 1 = 6: 3 cut
  McTokens skip{{1, 2}, {{3, 4, 5, 6, 7, 8}, {9}}, 0};     // an ending of 6 > T = 5 tokens
  const McLayout l = layout_mc_rows({fits, cut, skip}, 5);
  CHECK(l.skipped == 1);
  CHECK(l.truncated == 1);
  REQUIRE(l.rows.size() == 4);
  CHECK(l.example == std::vector<int64_t>{0, 1});
  CHECK(l.rows[2].tokens == std::vector<int32_t>{4, 5, 6, 7, 8, 9});  // both endings after the same 3 tokens
  CHECK(l.rows[3].tokens == std::vector<int32_t>{4, 5, 6, 10});
  CHECK(l.rows[2].scored() == 3);

  std::vector<int32_t> in(3 * 5), tg(3 * 5);
  fill_mc_batch(l, 2, 3, 5, in.data(), tg.data());  // rows 2, 3 and one past the end
  CHECK(in == std::vector<int32_t>{4, 5, 6, 7, 8, /**/ 4, 5, 6, 0, 0, /**/ 0, 0, 0, 0, 0});
  CHECK(tg == std::vector<int32_t>{-1, -1, 7, 8, 9, /**/ -1, -1, 10, -1, -1, /**/ -1, -1, -1, -1, -1});
}

TEST_CASE("scoring: acc by the summed loss, acc_norm by the mean per token, ties to the lower index", "[eval]") {
  // Example 0: ending 0 has 1 token, ending 1 has 4: summed 2.0 vs 4.0 (acc picks 0), mean 2.0 vs
  // 1.0 (acc_norm picks 1). Example 1: a tie picks ending 0.
  McTokens a{{1}, {{2}, {3, 4, 5, 6}}, 1};
  McTokens b{{1}, {{2}, {3}}, 0};
  const McLayout l = layout_mc_rows({a, b}, 8);
  const McScores s = score_mc(l, {2.0, 4.0, 0.5, 0.5});
  REQUIRE(s.count() == 2);
  CHECK(s.examples[0].pred == 0);
  CHECK(s.examples[0].pred_norm == 1);
  CHECK(s.examples[0].loss_mean == std::vector<double>{2.0, 1.0});
  CHECK(s.examples[1].pred == 0);
  CHECK(s.correct == 1);       // example 1
  CHECK(s.correct_norm == 2);  // both
  CHECK(s.acc() == 0.5);
  CHECK(s.acc_norm() == 1.0);
  CHECK_THROWS(score_mc(l, {1.0}));
}

namespace {

// A tiny byte-level GPT-2 and a run directory with a shard of random bytes.
struct TinyRun {
  TempDir tmp{"run"};
  RunConfig config(int micro_batch, const std::string& task = "", int every = 0) const {
    json j = {
        {"run", {{"name", "t"}, {"out_dir", (tmp.dir / "run").string()}, {"seed", 9}}},
        {"model", {{"n_layers", 2}, {"d_model", 32}, {"n_heads", 2}, {"vocab_size", 256}, {"max_seq_len", 64}}},
        {"batch", {{"micro_batch_size", micro_batch}, {"seq_len", 32}}},
        {"optim", {{"lr", 3e-3}}},
        {"schedule", {{"total_steps", 3}, {"warmup_steps", 0}}},
        {"data", {{"train", (tmp.dir / "d_train_*.bin").string()}}},
        {"eval", {{"task", task}, {"every_steps", every}}},
        {"checkpoint", {{"dir", (tmp.dir / "ckpt").string()}}},
        {"logging", {{"peak_tflops", 1.0}}},
    };
    return config_from_json(j, {}, 1);
  }
  TinyRun() {
    std::mt19937 rng(5);
    std::vector<uint16_t> tokens(4000);
    for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 256);
    write_shard((tmp.dir / "d_train_000000.bin").string(), tokens);
  }
};

// The summed loss of each row through the KV-cache decoder (the sampler's forward, not the
// trainer's), in double.
std::vector<double> decoder_row_losses(const McLayout& l, KvCacheDecoder& dec) {
  std::vector<double> out;
  for (const McRow& row : l.rows) {
    double sum = 0;
    std::span<const float> logits = dec.prime(std::span(row.tokens.data(), row.context));
    for (size_t t = row.context; t < row.tokens.size(); t++) {
      double m = -1e30, z = 0;
      for (float x : logits) m = std::max(m, double(x));
      for (float x : logits) z += std::exp(double(x) - m);
      sum += std::log(z) + m - logits[static_cast<size_t>(row.tokens[t])];
      if (t + 1 < row.tokens.size()) logits = dec.push(row.tokens[t]);
    }
    out.push_back(sum);
  }
  return out;
}

}  // namespace

TEST_CASE("the trainer's per-row losses are the model's, whatever the micro-batch", "[eval]") {
  TinyRun run;
  const auto bytes = make_tokenizer("bytes");
  const std::string path = run.tmp.write("tiny.jsonl", small_task(5));
  const McLayout l = layout_mc_rows(tokenize_mc_task(read_mc_task(path), *bytes), 32);
  REQUIRE(l.rows.size() == 20);
  World world;
  CpuOps ops1, ops3;
  Trainer one(run.config(1), world, ops1), three(run.config(3), world, ops3);
  const std::vector<double> a = one.mc_row_losses(l), b = three.mc_row_losses(l);
  KvCacheDecoder dec(run.config(1).model, one.params(), ops1);
  const std::vector<double> want = decoder_row_losses(l, dec);
  REQUIRE(a.size() == want.size());
  for (size_t r = 0; r < a.size(); r++) {
    INFO("row " << r);
    CHECK(a[r] > 0);
    CHECK(a[r] == Approx(want[r]).epsilon(1e-5));
    CHECK(b[r] == Approx(a[r]).epsilon(1e-6));
  }
}

TEST_CASE("eval.task during training logs <name>_acc and _acc_norm at its steps and the last", "[eval]") {
  TinyRun run;
  const std::string path = run.tmp.write("tiny_val.jsonl", small_task(6));
  World world;
  CpuOps ops;
  Trainer t(run.config(2, path, 2), world, ops);
  CHECK(t.eval_task_name() == "tiny");
  t.run();
  std::ifstream report(run.tmp.dir / "run" / "report.md");
  const std::string report_text((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  if (report_text.find("loss.png") != std::string::npos) CHECK_THAT(report_text, Catch::Contains("task.png"));
  std::ifstream in(run.tmp.dir / "run" / "metrics.jsonl");
  std::vector<json> records;
  for (std::string line; std::getline(in, line);) records.push_back(json::parse(line));
  REQUIRE(records.size() == 3);
  CHECK_FALSE(records[0].contains("tiny_acc"));
  for (int i : {1, 2}) {
    INFO("step " << records[i]["step"]);
    REQUIRE(records[i].contains("tiny_acc"));
    REQUIRE(records[i].contains("tiny_acc_norm"));
    const double acc = records[i]["tiny_acc"], norm = records[i]["tiny_acc_norm"];
    CHECK(acc >= 0.0);
    CHECK(acc <= 1.0);
    CHECK(std::round(acc * 6) == Approx(acc * 6));  // a count of 6 examples
    CHECK(norm >= 0.0);
  }
  const McScores now = *t.score_eval_task();  // the final weights: the last record's
  CHECK(records[2]["tiny_acc"].get<double>() == now.acc());
  CHECK(records[2]["tiny_acc_norm"].get<double>() == now.acc_norm());

  CHECK_THROWS_WITH(Trainer(run.config(2, (run.tmp.dir / "missing.jsonl").string()), world, ops),
                    Catch::Contains("cannot be read"));
  json bad = config_to_json(run.config(2));
  bad["eval"]["every_steps"] = -1;
  CHECK_THROWS_WITH(config_from_json(bad, {}, 1), Catch::Contains("eval.every_steps=-1"));
}

TEST_CASE("picotrain eval scores a checkpoint on shards and a task, and explains its errors", "[eval]") {
  TinyRun run;
  World world;
  CpuOps ops;
  const std::string task = run.tmp.write("tiny.jsonl", small_task(7));
  const auto bytes = make_tokenizer("bytes");
  const McLayout layout = layout_mc_rows(tokenize_mc_task(read_mc_task(task), *bytes), 32);
  std::string ckpt;
  std::vector<double> want;  // the checkpoint's row losses, computed in this process
  {
    Trainer t(run.config(2), world, ops);
    t.step();
    ckpt = t.save_checkpoint();
    want = t.mc_row_losses(layout);
  }
  const std::string bin = PICOTRAIN_BIN;
  const std::string scores = (run.tmp.dir / "scores.jsonl").string();
  const test::Launch ok = test::run_command(bin + " eval --checkpoint " + ckpt + " --task " + task + " --scores " +
                                            scores + " --shards '" + (run.tmp.dir / "d_train_*.bin").string() +
                                            "' --tokens 1024 --set batch.micro_batch_size=2 --set batch.seq_len=32");
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("7 examples scored, 0 skipped"));
  CHECK_THAT(ok.output, Catch::Contains("1024 tokens: loss"));
  CHECK_THAT(ok.output, Catch::Contains("perplexity"));
  std::ifstream in(scores);
  size_t lines = 0, row = 0;
  for (std::string line; std::getline(in, line); lines++) {
    const json j = json::parse(line);
    REQUIRE(j["loss_sum"].size() == 4);
    CHECK(j["endings"].size() == 4);
    CHECK(j["example"].get<size_t>() == lines);
    for (const json& loss : j["loss_sum"]) CHECK(loss.get<double>() == Approx(want.at(row++)).epsilon(1e-6));
  }
  CHECK(lines == 7);

  const test::Launch nothing = test::run_command(bin + " eval --checkpoint " + ckpt);
  CHECK(nothing.exit_code == 2);
  CHECK_THAT(nothing.output, Catch::Contains("nothing to score"));
  const std::string broken = run.tmp.write("broken.jsonl", example_line("c", {"a", "b"}, 0) + "{\"ctx\": 1}\n");
  const test::Launch bad = test::run_command(bin + " eval --checkpoint " + ckpt + " --task " + broken);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("broken.jsonl line 2: \"ctx\" must be a string"));
  const std::string long_ending = run.tmp.write("long.jsonl", example_line("c", {std::string(40, 'x'), "b"}, 0) +
                                                                  example_line("c", {"a", "b"}, 1));
  const test::Launch skip =
      test::run_command(bin + " eval --checkpoint " + ckpt + " --task " + long_ending + " --set batch.seq_len=16");
  CHECK(skip.exit_code == 0);
  CHECK_THAT(skip.output, Catch::Contains("1 examples scored, 1 skipped (an ending longer than batch.seq_len=16)"));
}
