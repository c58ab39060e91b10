// The checkpoint format's building blocks: the checksum, the manifest's structure checks, and
// the reader assembling any element range from chunks written by some other layout.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/checkpoint_writer.h"
#include "core/ckpt/checksum.h"
#include "core/ckpt/llmc_model_file.h"

using namespace pt;
using namespace pt::ckpt;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("picotrain_ckpt_format_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

Manifest meta(int step) {
  Manifest m;
  m.step = step;
  m.model = {{"arch", "gpt2"}};
  m.layout = {{"world_size", 1}};
  m.config = nlohmann::json::object();
  return m;
}
}  // namespace

TEST_CASE("the checksum is stable and catches every single-bit error", "[ckpt]") {
  // Known answers (also reproduced by a 20-line Python transcription of checksum.h's
  // definition): the hash is part of the format; changing it breaks every checkpoint.
  CHECK(checksum_hex(checksum64("", 0)) == "506c352cc9731e95");
  CHECK(checksum_hex(checksum64("picotrain", 9)) == "49a247fcd37d4431");

  std::vector<unsigned char> data(203);  // not a multiple of 8 or 32: the tail is covered too
  std::iota(data.begin(), data.end(), 1);
  const uint64_t h = checksum64(data.data(), data.size());
  int missed = 0;
  for (size_t byte = 0; byte < data.size(); byte++)
    for (int bit = 0; bit < 8; bit++) {
      data[byte] ^= static_cast<unsigned char>(1 << bit);
      missed += checksum64(data.data(), data.size()) == h;
      data[byte] ^= static_cast<unsigned char>(1 << bit);
    }
  CHECK(missed == 0);
  // Length counts: a trailing zero byte is a different file.
  data.push_back(0);
  CHECK(checksum64(data.data(), data.size()) != h);
}

TEST_CASE("the reader assembles any range from chunks of another layout", "[ckpt]") {
  TempDir tmp;
  // A [10, 7] tensor written as three slices in two files (as ZeRO ranks would), plus a
  // replicated copy of [20, 40) in a third file.
  std::vector<float> full(70);
  std::iota(full.begin(), full.end(), 0.5f);
  const std::string path = write_checkpoint(tmp.path.string(), meta(5), [&](CheckpointWriter& w) {
    w.add_chunk("master/x", {10, 7}, "a.bin", 0, full.data(), 25);
    w.add_chunk("master/x", {10, 7}, "b.bin", 25, full.data() + 25, 25);
    w.add_chunk("master/x", {10, 7}, "a.bin", 50, full.data() + 50, 20);
    w.add_chunk("master/x", {10, 7}, "c.bin", 20, full.data() + 20, 20);
    w.add_chunk("master/gap", {10}, "c.bin", 0, full.data(), 4);
    w.add_chunk("master/gap", {10}, "c.bin", 6, full.data() + 6, 4);
  });
  CHECK(path == (tmp.path / "step_00000005").string());
  CHECK(scan_checkpoint_dir(tmp.path.string()).committed == std::vector<int>{5});

  CheckpointReader r(path);
  CHECK(r.manifest().step == 5);
  for (auto [b, e] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 70}, {23, 52}, {60, 61}, {25, 50}, {0, 1}, {69, 70}}) {
    INFO("range [" << b << ", " << e << ")");
    std::vector<float> out(e - b, -1.0f);
    r.read("master/x", b, e, out.data());
    CHECK(out == std::vector<float>(full.begin() + b, full.begin() + e));
  }
  std::vector<float> out(10);
  CHECK_THROWS_AS(r.read("master/gap", 0, 10, out.data()), CorruptCheckpoint);
  CHECK_THROWS_WITH(r.read("master/gap", 0, 10, out.data()), Contains("elements 4 onwards of tensor master/gap"));
  r.read("master/gap", 6, 10, out.data());  // a covered part reads fine
  CHECK_THROWS_WITH(r.read("master/none", 0, 1, out.data()), Contains("has no tensor master/none"));
}

TEST_CASE("malformed manifests are corrupt checkpoints naming the file", "[ckpt]") {
  TempDir tmp;
  std::vector<float> x(8, 1.0f);
  const std::string path = write_checkpoint(tmp.path.string(), meta(1), [&](CheckpointWriter& w) {
    w.add_chunk("master/x", {8}, "a.bin", 0, x.data(), 8);
  });
  const std::string mpath = path + "/manifest.json";
  const std::string good = [&] {
    std::ifstream in(mpath);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    return text;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with("\"end\": 8", "\"end\": 9"), "outside the tensor's 8 elements"},
      {with("\"bytes\": 32,", "\"bytes\": 28,"), "has 28 bytes"},
      {with("\"format_version\": 1", "\"format_version\": 7"), "format_version 7"},
      {with("\"checksum\": \"fnv1a64x4\"", "\"checksum\": \"md5\""), "checksum algorithm \"md5\""},
      {with("\"name\": \"a.bin\"", "\"name\": \"../a.bin\""), "not a plain file name"},
      {with("\"step\": 1", "\"step\": \"one\""), "field \"step\" has the wrong type"},
  };
  for (const auto& [text, says] : cases) {
    INFO(says);
    CHECK_THROWS_AS(manifest_from_json(text, mpath), CorruptCheckpoint);
    CHECK_THROWS_WITH(manifest_from_json(text, mpath), Contains(mpath) && Contains(says));
  }
}

TEST_CASE("bf16 conversion rounds to nearest even", "[ckpt]") {
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(-2.0f) == 0xc000);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to the even one (1.0);
  // 1 + 3*2^-8 is half-way too, and rounds up to the even 1 + 2^-6.
  CHECK(f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above half-way: up
  CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the top: inf
  const uint16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_f32(nan)));
  CHECK(bf16_to_f32(0x3f81) == 1.0f + 0x1p-7f);
}
