// Every numeric flag of every subcommand rejects a bad value with a message in words
// ("--gpus must be >= 1, got 0"), exit code 2, and no number spelled out to hundreds of digits.
// The flags are read from each subcommand's --help (CLI11 prints INT, UINT or FLOAT after a
// numeric flag), so a numeric flag added later without a case here fails this test.
#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "run_test_support.h"

using pt::test::Launch;
using pt::test::run_command;

namespace {

const std::string kBin = PICOTRAIN_BIN;
const std::string kConfig = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/tiny.json";

// What a subcommand needs besides the flag under test (valid values: the flag is what fails).
const std::map<std::string, std::string> kRequired = {
    {"prepare", "--input /nonexistent --out /tmp/picotrain_cli_numbers"},
    {"sample", "--checkpoint /tmp"},
    {"eval", "--checkpoint /tmp"},
    {"plan", "--config " + kConfig},
};

// The numeric flags a subcommand's help lists: "  -n,--gpus INT:>= 1 REQUIRED  GPUs ...".
std::set<std::string> numeric_flags(const std::string& sub) {
  const Launch help = run_command(kBin + " " + sub + " --help");
  REQUIRE(help.exit_code == 0);
  std::set<std::string> flags;
  const std::regex option(R"(^\s+(?:-\w,)?(--[\w-]+)(?:,-\w)?\s+(INT|UINT|FLOAT)\b)");
  std::istringstream in(help.output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, option)) flags.insert(m[1]);
  }
  return flags;
}

struct Case {
  std::string sub, flag, value, message;
};

}  // namespace

TEST_CASE("every numeric flag says in words what it accepts", "[cli]") {
  const std::vector<Case> cases = {
      {"prepare", "--val-fraction", "0.7", "--val-fraction must be between 0 and 0.5, got 0.7"},
      {"prepare", "--val-fraction", "abc", "--val-fraction must be a number between 0 and 0.5, got 'abc'"},
      {"prepare", "--shard-tokens", "0", "--shard-tokens must be >= 1, got 0"},
      {"prepare", "--shard-tokens", "1.5", "--shard-tokens must be a whole number >= 1, got '1.5'"},
      {"prepare", "--threads", "-1", "--threads must be >= 0, got -1 (0: one per core)"},
      {"sample", "--tokens", "-3", "--tokens must be >= 0, got -3 (0: print the prompt alone)"},
      {"sample", "--temperature", "-0.5", "--temperature must be >= 0, got -0.5 (0: greedy)"},
      {"sample", "--top-k", "-1", "--top-k must be >= 0, got -1 (0: all tokens)"},
      {"sample", "--seed", "x", "--seed must be a whole number >= 0, got 'x'"},
      {"plan", "--gpus", "0", "--gpus must be >= 1, got 0"},
      {"plan", "--gpus-per-node", "0", "--gpus-per-node must be >= 1, got 0"},
      {"plan", "--gpu-memory-gib", "0", "--gpu-memory-gib must be > 0, got 0"},
      {"plan", "--nvlink-gbps", "-1", "--nvlink-gbps must be > 0, got -1"},
      {"plan", "--network-gbps", "0", "--network-gbps must be > 0, got 0"},
      {"plan", "--peak-tflops", "0", "--peak-tflops must be > 0, got 0"},
      {"plan", "--hbm-gbps", "0", "--hbm-gbps must be > 0, got 0"},
      {"eval", "--tokens", "-1", "--tokens must be >= 0, got -1 (0: all)"},
      {"eval", "--max-examples", "2.5", "--max-examples must be a whole number >= 0, got '2.5'"},
      {"plan", "--mfu", "2", "--mfu must be > 0 and <= 1, got 2"},
      {"plan", "--mfu", "0", "--mfu must be > 0 and <= 1, got 0"},
  };
  std::map<std::string, std::set<std::string>> covered;
  for (const Case& c : cases) {
    std::string args = kRequired.at(c.sub);
    if (c.sub == "plan" && c.flag != "--gpus") args += " --gpus 8";
    const Launch l = run_command(kBin + " " + c.sub + " " + args + " " + c.flag + " " + c.value);
    INFO(c.sub << " " << c.flag << " " << c.value << ":\n" << l.output);
    CHECK(l.exit_code == 2);
    CHECK(l.output == "error: " + c.message + "\n");
    CHECK_FALSE(std::regex_search(l.output, std::regex("[0-9]{12}")));  // no DBL_MAX spelled out
    covered[c.sub].insert(c.flag);
  }
  for (const auto& [sub, required] : kRequired) {
    const std::set<std::string> flags = numeric_flags(sub);
    CHECK(!flags.empty());
    for (const std::string& flag : flags) {
      INFO("picotrain " << sub << " " << flag << " is numeric: give it a case above");
      CHECK(covered[sub].count(flag) == 1);
    }
  }
}

TEST_CASE("good numeric values pass the checks", "[cli]") {
  // The planner runs with every numeric flag given a valid value (the upper ends included).
  const Launch l = run_command(kBin + " plan --config " + kConfig +
                               " --gpus 8 --gpus-per-node 8 --gpu-memory-gib 80 --nvlink-gbps 450 "
                               "--network-gbps 50 --peak-tflops 989.4 --hbm-gbps 3350 --mfu 1");
  INFO(l.output);
  CHECK(l.exit_code == 0);
}
