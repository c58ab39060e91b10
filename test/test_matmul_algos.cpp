// precision.matmul_algos (core/ops/matmul_algos.h, core/train/trainer_matmul_algos.cpp): the
// file's format, the agreement over ranks, and the trainer's use of a backend that chooses
// algorithms, played here by CpuOps with the four hooks a GPU backend implements (the CUDA side,
// timing cuBLASLt's candidates, is checked by test/gpu_ops.cpp on a GPU).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "ckpt_test_support.h"
#include "core/ckpt/durable_io.h"
#include "core/common/error.h"
#include "core/cpu/cpu_ops.h"
#include "core/ops/matmul_algos.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

MatmulAlgos table(const std::string& library, std::map<std::string, std::string> chosen) {
  MatmulAlgos a;
  a.library = library;
  a.chosen = std::move(chosen);
  return a;
}

// CpuOps as a backend with algorithms to choose: "timing" finds `found`; every use is recorded.
class ChoosingOps : public CpuOps {
 public:
  std::string library = "cuBLASLt 1, Test GPU, sm_90, 132 SMs";
  MatmulAlgos found = table(library, {{"qkv", "0a0b"}, {"fc", "ff00"}});
  int timing_started = 0;
  std::vector<MatmulAlgos> used;
  std::string matmul_library() const override { return library; }
  void time_matmul_algos() override { timing_started++; }
  MatmulAlgos timed_matmul_algos() const override { return found; }
  void use_matmul_algos(const MatmulAlgos& a) override { used.push_back(a); }
};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("the matmul algorithm file: written and read back, malformed ones named", "[matmul_algos]") {
  MatmulAlgos a = table("cuBLASLt 130000, NVIDIA H200, sm_90, 132 SMs", {{"10 768 8192 768", "00ff10"}, {"01 3072", "ab"}});
  a.differs = 1;
  a.heuristic_us = 120.5;
  a.chosen_us = 100.25;
  const MatmulAlgos b = matmul_algos_from_json(matmul_algos_json(a), "f.json");
  CHECK(b.library == a.library);
  CHECK(b.chosen == a.chosen);
  CHECK(b.differs == 1);
  CHECK(b.heuristic_us == 120.5);
  CHECK(b.chosen_us == 100.25);

  CHECK_THROWS_WITH(matmul_algos_from_json("{", "f.json"), Contains("f.json: not a matmul algorithm file"));
  CHECK_THROWS_AS(matmul_algos_from_json("[1]", "f.json"), ConfigError);
  CHECK_THROWS_WITH(matmul_algos_from_json(R"({"format": 2, "library": "x", "chosen": {}})", "f.json"),
                    Contains("format 2, this build reads 1"));
  CHECK_THROWS_WITH(matmul_algos_from_json(R"({"format": 1, "library": "x", "chosen": {"p": "0g"}})", "f.json"),
                    Contains("product \"p\" has no algorithm in hex"));
  CHECK_THROWS_WITH(matmul_algos_from_json(R"({"format": 1, "library": "x", "chosen": {"p": "abc"}})", "f.json"),
                    Contains("product \"p\""));
  CHECK_THROWS_AS(matmul_algos_from_json(R"({"format": 1, "chosen": {}})", "f.json"), ConfigError);
}

TEST_CASE("agreement: every product gets the lowest rank's choice, of rank 0's library", "[matmul_algos]") {
  const std::string lib = "cuBLASLt 1, GPU A", other = "cuBLASLt 1, GPU B";
  MatmulAlgos r0 = table(lib, {{"shared", "00"}, {"only0", "01"}});
  r0.differs = 1;
  const MatmulAlgos r1 = table(lib, {{"shared", "10"}, {"only1", "11"}});
  const MatmulAlgos r2 = table(other, {{"shared", "20"}, {"only2", "21"}});
  const MatmulAlgos r3 = table(lib, {{"only1", "31"}, {"only3", "33"}});
  const MatmulAlgos agreed = agree_matmul_algos({r0, r1, r2, r3});
  CHECK(agreed.library == lib);
  CHECK(agreed.chosen == std::map<std::string, std::string>{{"shared", "00"}, {"only0", "01"}, {"only1", "11"},
                                                            {"only3", "33"}});
  CHECK(agreed.differs == 1);  // the counts are rank 0's
  // The order of the ranks decides, not the order of the products.
  CHECK(agree_matmul_algos({r1, r0}).chosen.at("shared") == "10");
  CHECK(agree_matmul_algos({}).chosen.empty());
}

TEST_CASE("a timed run times in its first step, uses the agreed choices after it and writes them; its resumed "
          "session reads them back and times nothing", "[matmul_algos]") {
  CkptFixture fx("matmul_algos");
  const World world;
  const auto file = fx.dir / "run" / "matmul_algos.json";
  const std::vector<std::string> timed = {"precision.matmul_algos=timed", "schedule.total_steps=4",
                                          "checkpoint.every_steps=2"};
  {
    ChoosingOps ops;
    Trainer t(fx.config(timed), world, ops);
    t.run();
    CHECK(ops.timing_started == 1);
    REQUIRE(ops.used.size() == 1);  // once, after the first step
    CHECK(ops.used[0].chosen == ops.found.chosen);
    REQUIRE(std::filesystem::exists(file));
    const MatmulAlgos written = matmul_algos_from_json(read_text(file), file.string());
    CHECK(written.library == ops.library);
    CHECK(written.chosen == ops.found.chosen);
  }
  {
    ChoosingOps ops;
    ops.found = table(ops.library, {{"qkv", "ffff"}});  // a second timing would choose otherwise
    Trainer t(fx.config(with(timed, {"schedule.total_steps=6", "checkpoint.resume=auto"})), world, ops);
    REQUIRE(t.steps_done() == 4);
    t.run();
    CHECK(ops.timing_started == 0);
    REQUIRE(ops.used.size() == 1);  // before the first step
    CHECK(ops.used[0].chosen == std::map<std::string, std::string>{{"qkv", "0a0b"}, {"fc", "ff00"}});
  }
  {
    // A fresh run in the same directory times again (and rewrites the file).
    std::filesystem::remove_all(fx.dir / "run" / "checkpoints");
    ChoosingOps ops;
    ops.found = table(ops.library, {{"qkv", "ffff"}});
    Trainer t(fx.config(timed), world, ops);
    t.run();
    CHECK(ops.timing_started == 1);
    CHECK(matmul_algos_from_json(read_text(file), file.string()).chosen == ops.found.chosen);
  }
}

TEST_CASE("a run given a file uses its choices from the first step; another GPU's are ignored; a missing file is "
          "a config error", "[matmul_algos]") {
  CkptFixture fx("matmul_algos_file");
  const World world;
  const std::string path = (fx.dir / "given.json").string();
  {
    ChoosingOps ops;
    ckpt::write_file_atomic(path, matmul_algos_json(table(ops.library, {{"lm_head", "1234"}})));
    Trainer t(fx.config({"precision.matmul_algos=" + path, "schedule.total_steps=3"}), world, ops);
    t.run();
    CHECK(ops.timing_started == 0);
    REQUIRE(ops.used.size() == 1);
    CHECK(ops.used[0].chosen == std::map<std::string, std::string>{{"lm_head", "1234"}});
    CHECK_FALSE(std::filesystem::exists(fx.dir / "run" / "matmul_algos.json"));  // nothing timed, nothing written
  }
  {
    ChoosingOps ops;
    ops.library = "cuBLASLt 2, Other GPU";
    Trainer t(fx.config({"precision.matmul_algos=" + path, "schedule.total_steps=3", "checkpoint.resume=none"},
                        "other"),
              world, ops);
    t.run();
    CHECK(ops.timing_started == 0);
    CHECK(ops.used.empty());  // the heuristic's choices
  }
  {
    ChoosingOps ops;
    Trainer t(fx.config({"precision.matmul_algos=" + path + ".missing", "schedule.total_steps=3"}, "missing"), world,
              ops);
    CHECK_THROWS_AS(t.run(), ConfigError);
  }
  {
    // The CPU backend has nothing to choose: timed and file runs train as heuristic ones do.
    CpuOps ops;
    Trainer t(fx.config({"precision.matmul_algos=timed", "schedule.total_steps=3"}, "cpu"), world, ops);
    t.run();
    CHECK_FALSE(std::filesystem::exists(fx.dir / "cpu" / "matmul_algos.json"));
  }
}
