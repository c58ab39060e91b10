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
#include "core/ckpt/tp_chunks.h"

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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Occurrences of `what` in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

// The local elements of a tensor-parallel piece of `full`.
std::vector<float> piece_of(const std::vector<float>& full, const TpSlice& t, size_t numel) {
  std::vector<float> out(numel);
  for (size_t i = 0; i < numel; i++) out[i] = full[t.global_index(i)];
  return out;
}

Manifest meta(int step) {
  Manifest m;
  m.step = step;
  m.model = {{"arch", "gpt2"}};
  m.layout = {{"world_size", 1}};
  m.config = nlohmann::json::object();
  return m;
}
// `text` with the first `from` replaced by `to` (which must be there).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  return text;
}

// Each (manifest text, what the error says) is a CorruptCheckpoint naming `mpath` and saying it.
void check_corrupt(const std::vector<std::pair<std::string, std::string>>& cases, const std::string& mpath) {
  for (const auto& [text, says] : cases) {
    INFO(says);
    CHECK_THROWS_AS(manifest_from_json(text, mpath), CorruptCheckpoint);
    CHECK_THROWS_WITH(manifest_from_json(text, mpath), Contains(mpath) && Contains(says));
  }
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

TEST_CASE("strided chunks of several tp ranks read back in any range, mixed with contiguous ones", "[ckpt]") {
  TempDir tmp;
  // A row-parallel [6, 8] matrix over 2 tp ranks (4 columns each). Rank 0 writes its piece as one
  // strided chunk; rank 1 as three ZeRO-like pieces, local [0, 3), [3, 22) and [22, 24), each
  // mapped to at most three spans (a partial run, whole runs, a partial run); a replicated copy
  // of the last row lies in a third file.
  std::vector<float> full(48);
  std::iota(full.begin(), full.end(), 0.25f);
  const TpSlice r0{6, 8, 1, 2, 0}, r1{6, 8, 1, 2, 1};
  const std::vector<float> p0 = piece_of(full, r0, 24), p1 = piece_of(full, r1, 24);
  size_t strided = 0;
  const std::string path = write_checkpoint(tmp.path.string(), meta(3), [&](CheckpointWriter& w) {
    w.add_strided_chunk("master/y", {6, 8}, "r0.bin", 0, 4, 8, p0.data(), 24);
    strided++;
    for (auto [b, e] : {std::pair<size_t, size_t>{0, 3}, {3, 22}, {22, 24}})
      for (const GlobalSpan& g : global_spans(r1, b, e)) {
        w.add_strided_chunk("master/y", {6, 8}, "r1.bin", g.global_begin, g.run, g.stride, p1.data() + g.local_begin,
                            g.numel);
        strided += g.run != 0;
      }
    w.add_chunk("master/y", {6, 8}, "c.bin", 40, full.data() + 40, 8);
  });
  // "run" and "stride" are written for the strided chunks only.
  CHECK(strided == 2);
  const std::string text = read_text(path + "/manifest.json");
  CHECK(count(text, "\"run\"") == strided);
  CHECK(count(text, "\"stride\"") == strided);

  CheckpointReader r(path);
  const TensorEntry* y = r.manifest().find("master/y");
  REQUIRE(y);
  // Rank 0's one; rank 1's [0, 3) and [22, 24) as one (partial) run each, [3, 22) as a partial
  // run, whole runs and a partial run; the copy.
  CHECK(y->chunks.size() == 7);
  for (uint64_t b = 0; b <= 48; b++)
    for (uint64_t e = b; e <= 48; e++) {
      INFO("range [" << b << ", " << e << ")");
      std::vector<float> out(e - b, -1.0f);
      r.read("master/y", b, e, out.data());
      CHECK(out == std::vector<float>(full.begin() + b, full.begin() + e));
    }
  // Each rank's local elements, from one read of the extent they span.
  for (const auto& [slice, piece] : {std::pair{r0, p0}, std::pair{r1, p1}})
    for (size_t b = 0; b <= 24; b++)
      for (size_t e = b; e <= 24; e++) {
        INFO("rank " << slice.rank << " local [" << b << ", " << e << ")");
        std::vector<float> out(e - b, -1.0f);
        read_local(r, "master/y", slice, b, e, out.data());
        CHECK(out == std::vector<float>(piece.begin() + b, piece.begin() + e));
      }
}

TEST_CASE("a tensor missing a tp rank's runs reports the first missing element", "[ckpt]") {
  TempDir tmp;
  // A row-parallel [4, 4] over 2 ranks: rank 0's runs all there, rank 1's only the first.
  std::vector<float> full(16);
  std::iota(full.begin(), full.end(), 1.0f);
  const TpSlice r0{4, 4, 1, 2, 0};
  const std::vector<float> p0 = piece_of(full, r0, 8);
  const std::string path = write_checkpoint(tmp.path.string(), meta(2), [&](CheckpointWriter& w) {
    w.add_strided_chunk("master/g", {4, 4}, "a.bin", 0, 2, 4, p0.data(), 8);
    w.add_chunk("master/g", {4, 4}, "b.bin", 2, full.data() + 2, 2);
  });
  CheckpointReader r(path);
  std::vector<float> out(16);
  CHECK_THROWS_AS(r.read("master/g", 0, 16, out.data()), CorruptCheckpoint);
  CHECK_THROWS_WITH(r.read("master/g", 0, 16, out.data()), Contains("elements 6 onwards of tensor master/g"));
  CHECK_THROWS_WITH(r.read("master/g", 9, 11, out.data()), Contains("elements 10 onwards of tensor master/g"));
  r.read("master/g", 0, 6, out.data());  // covered parts read fine, also between two runs
  CHECK(std::vector<float>(out.begin(), out.begin() + 6) == std::vector<float>(full.begin(), full.begin() + 6));
  r.read("master/g", 8, 10, out.data());
  CHECK((out[0] == full[8] && out[1] == full[9]));
  // A piece is read as the global extent it spans, so the other rank's runs inside that extent
  // must be there too (in a complete checkpoint they are): rank 0's whole piece [0, 14) is not,
  // its first run alone is.
  std::vector<float> local(8);
  CHECK_THROWS_WITH(read_local(r, "master/g", r0, 0, 8, local.data()), Contains("elements 6 onwards"));
  read_local(r, "master/g", r0, 0, 2, local.data());
  CHECK((local[0] == p0[0] && local[1] == p0[1]));
}

TEST_CASE("malformed strided chunks are corrupt checkpoints naming the file", "[ckpt]") {
  TempDir tmp;
  // A [4, 6] tensor's elements 1-2, 7-8, 13-14, 19-20: 4 runs of 2 every 6, extent [1, 21).
  std::vector<float> x(8, 1.0f);
  const std::string path = write_checkpoint(tmp.path.string(), meta(1), [&](CheckpointWriter& w) {
    w.add_strided_chunk("master/x", {4, 6}, "a.bin", 1, 2, 6, x.data(), 8);
  });
  const std::string mpath = path + "/manifest.json";
  const std::string good = read_text(mpath);
  auto with = [&](const std::string& from, const std::string& to) { return replaced(good, from, to); };
  const Manifest m = manifest_from_json(good, mpath);
  REQUIRE(m.tensors.at(0).chunks.size() == 1);
  const Chunk& c = m.tensors[0].chunks[0];
  CHECK((c.begin == 1 && c.end == 21 && c.run == 2 && c.stride == 6 && c.runs() == 4 && c.numel() == 8));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with("\"run\": 2", "\"run\": 0"), "has run 0 and stride 6"},
      {with("\"stride\": 6", "\"stride\": 1"), "needs 0 < run <= stride"},
      {with("\"end\": 21", "\"end\": 20"), "is not whole runs of 2 elements every 6"},
      {with("\"end\": 21", "\"end\": 27"), "outside the tensor's 24 elements"},
      {with("\"end\": 21", "\"end\": 15"), "chunk of 6 elements has 32 bytes"},
      {with("\"bytes\": 32,", "\"bytes\": 40,"), "chunk of 8 elements has 40 bytes"},
      {with("\"stride\": 6,", ""), "missing field \"stride\""},
      {with("\"run\": 2,", ""), "missing field \"run\""},
  };
  check_corrupt(cases, mpath);
}

TEST_CASE("malformed manifests are corrupt checkpoints naming the file", "[ckpt]") {
  TempDir tmp;
  std::vector<float> x(8, 1.0f);
  const std::string path = write_checkpoint(tmp.path.string(), meta(1), [&](CheckpointWriter& w) {
    w.add_chunk("master/x", {8}, "a.bin", 0, x.data(), 8);
  });
  const std::string mpath = path + "/manifest.json";
  const std::string good = read_text(mpath);
  auto with = [&](const std::string& from, const std::string& to) { return replaced(good, from, to); };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with("\"end\": 8", "\"end\": 9"), "outside the tensor's 8 elements"},
      {with("\"bytes\": 32,", "\"bytes\": 28,"), "has 28 bytes"},
      {with("\"format_version\": 1", "\"format_version\": 7"), "format_version 7"},
      {with("\"checksum\": \"fnv1a64x4\"", "\"checksum\": \"md5\""), "checksum algorithm \"md5\""},
      {with("\"name\": \"a.bin\"", "\"name\": \"../a.bin\""), "not a plain file name"},
      {with("\"step\": 1", "\"step\": \"one\""), "field \"step\" has the wrong type"},
  };
  check_corrupt(cases, mpath);
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
