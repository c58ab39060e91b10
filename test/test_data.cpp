// The data layer: llm.c token shards, the multi-shard stream, the cursor-driven loader, and
// `picotrain prepare`'s back end.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/data/data_loader.h"
#include "core/data/prepare.h"
#include "core/data/shard.h"
#include "core/data/token_stream.h"

namespace fs = std::filesystem;
using namespace pt;
using Catch::Matchers::Contains;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "picotrain_data_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<uint16_t> iota_tokens(size_t n, uint16_t first = 0) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A valid shard's bytes with one header int replaced (or the file cut/extended).
void patch_header(const std::string& path, int index, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}

// The error message of whatever `fn` throws as RuntimeError.
template <class Fn>
std::string runtime_error_of(Fn fn) {
  try {
    fn();
  } catch (const RuntimeError& e) {
    return e.what();
  }
  FAIL("expected a pt::RuntimeError");
  return {};
}

}  // namespace

TEST_CASE("shard round trip", "[data][shard]") {
  TempDir dir;
  const std::string path = dir.file("x_train_000000.bin");
  const std::vector<uint16_t> tokens = {0, 1, 2, 50256, 65535, 7, 7, 42};
  write_shard(path, tokens);
  CHECK(fs::file_size(path) == kShardHeaderBytes + 2 * tokens.size());
  CHECK_FALSE(fs::exists(path + ".tmp"));

  TokenShard shard(path, 65536);
  CHECK(shard.path() == path);
  REQUIRE(shard.size() == tokens.size());
  CHECK(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()) == tokens);

  std::vector<int32_t> out(3);
  shard.read(3, 3, out.data());
  CHECK(out == std::vector<int32_t>{50256, 65535, 7});

  SECTION("an empty shard is valid") {
    write_shard(path, std::span<const uint16_t>{});
    CHECK(TokenShard(path, 256).size() == 0);
  }
  SECTION("a moved shard keeps its mapping") {
    TokenShard moved = std::move(shard);
    CHECK(moved.tokens()[3] == 50256);
  }
}

TEST_CASE("malformed shards name the file and the problem", "[data][shard]") {
  TempDir dir;
  const std::string path = dir.file("x_train_000000.bin");
  write_shard(path, iota_tokens(1000));

  SECTION("bad magic") {
    patch_header(path, 0, 1234);
    const std::string msg = runtime_error_of([&] { TokenShard(path, 50257); });
    CHECK_THAT(msg, Contains(path) && Contains("bad magic 1234") && Contains("expected 20240520"));
  }
  SECTION("unknown version") {
    patch_header(path, 1, 2);
    const std::string msg = runtime_error_of([&] { TokenShard(path, 50257); });
    CHECK_THAT(msg, Contains(path) && Contains("unsupported shard version 2") && Contains("uint32"));
  }
  SECTION("uint16 tokens labelled version 7 (uint32) are too few bytes") {
    patch_header(path, 1, kShardVersion32);
    CHECK_THAT(runtime_error_of([&] { TokenShard(path, 50257); }),
               Contains(path) && Contains("truncated") && Contains("header says 1000 tokens (5024 bytes)"));
  }
  SECTION("truncated file") {
    fs::resize_file(path, 1500);
    const std::string msg = runtime_error_of([&] { TokenShard(path, 50257); });
    CHECK_THAT(msg, Contains(path) && Contains("truncated") && Contains("header says 1000 tokens (3024 bytes)") &&
                        Contains("the file has 1500 bytes"));
  }
  SECTION("shorter than the header") {
    fs::resize_file(path, 10);
    CHECK_THAT(runtime_error_of([&] { TokenShard(path, 50257); }), Contains(path) && Contains("truncated"));
  }
  SECTION("trailing bytes") {
    fs::resize_file(path, 3030);
    CHECK_THAT(runtime_error_of([&] { TokenShard(path, 50257); }), Contains(path) && Contains("too long"));
  }
  SECTION("token out of range is caught when read") {
    TokenShard shard(path, 256);  // tokens are 0..999; 256 is at index 256
    std::vector<int32_t> out(300);
    shard.read(0, 256, out.data());  // all in range
    const std::string msg = runtime_error_of([&] { shard.read(200, 100, out.data()); });
    CHECK_THAT(msg, Contains(path) && Contains("token 256 at index 256 is >= model.vocab_size=256"));
  }
  SECTION("missing file") {
    CHECK_THAT(runtime_error_of([&] { TokenShard(dir.file("nope.bin"), 256); }),
               Contains("nope.bin") && Contains("cannot open"));
  }
}

TEST_CASE("a glob that matches nothing names the pattern", "[data][stream]") {
  TempDir dir;
  const std::string pattern = dir.file("missing_train_*.bin");
  CHECK_THAT(runtime_error_of([&] { expand_glob(pattern); }), Contains(pattern) && Contains("no files match"));
  CHECK_THAT(runtime_error_of([&] { DataLoader(pattern, 256, 1, 4); }), Contains(pattern));
}

TEST_CASE("glob expansion is sorted", "[data][stream]") {
  TempDir dir;
  for (const char* n : {"d_002.bin", "d_000.bin", "d_010.bin", "d_001.bin"}) write_shard(dir.file(n), iota_tokens(1));
  const auto files = expand_glob(dir.file("d_*.bin"));
  CHECK(files == std::vector<std::string>{dir.file("d_000.bin"), dir.file("d_001.bin"), dir.file("d_002.bin"),
                                          dir.file("d_010.bin")});
}

TEST_CASE("the stream concatenates shards and wraps around", "[data][stream]") {
  TempDir dir;
  // Stream = 0..9 | (empty) | 10..14 | 15..29
  write_shard(dir.file("s_000.bin"), iota_tokens(10, 0));
  write_shard(dir.file("s_001.bin"), std::span<const uint16_t>{});
  write_shard(dir.file("s_002.bin"), iota_tokens(5, 10));
  write_shard(dir.file("s_003.bin"), iota_tokens(15, 15));
  TokenStream stream(dir.file("s_*.bin"), 256);
  REQUIRE(stream.total_tokens() == 30);
  CHECK(stream.files().size() == 4);

  std::vector<int32_t> out(70);
  stream.read(8, 10, out.data());  // crosses two shard boundaries and the empty shard
  for (int i = 0; i < 10; ++i) CHECK(out[i] == 8 + i);

  stream.read(27, 70, out.data());  // wraps more than twice
  for (int i = 0; i < 70; ++i) CHECK(out[i] == (27 + i) % 30);

  stream.read(30 * 1000 + 3, 1, out.data());  // positions are taken modulo the total
  CHECK(out[0] == 3);
}

TEST_CASE("loader: targets are inputs shifted by one, sequences follow the cursor", "[data][loader]") {
  TempDir dir;
  write_shard(dir.file("t_000.bin"), iota_tokens(100));
  const int B = 3, T = 8;
  DataLoader loader(dir.file("t_*.bin"), 256, B, T);
  CHECK(loader.total_tokens() == 100);
  CHECK(loader.files() == std::vector<std::string>{dir.file("t_000.bin")});

  std::vector<int32_t> x(B * T), y(B * T);
  loader.load(/*cursor=*/5, /*first_sequence=*/2, x.data(), y.data());
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int pos = 5 + (2 + b) * T + t;  // sequence s starts at cursor + s*T
      CHECK(x[b * T + t] == pos);
      CHECK(y[b * T + t] == pos + 1);
    }
  }
}

TEST_CASE("loader: wrap-around at the end of the stream", "[data][loader]") {
  TempDir dir;
  write_shard(dir.file("t_000.bin"), iota_tokens(20));
  const int B = 2, T = 4;
  DataLoader loader(dir.file("t_*.bin"), 256, B, T);
  std::vector<int32_t> x(B * T), y(B * T);
  loader.load(/*cursor=*/14, 0, x.data(), y.data());  // tokens 14..22 -> 14..19, 0..2
  CHECK(x == std::vector<int32_t>{14, 15, 16, 17, 18, 19, 0, 1});
  CHECK(y == std::vector<int32_t>{15, 16, 17, 18, 19, 0, 1, 2});

  // A cursor many epochs in gives the same batch as its remainder.
  std::vector<int32_t> x2(B * T), y2(B * T);
  loader.load(14 + 20ull * 1'000'000'000'000ull, 0, x2.data(), y2.data());
  CHECK(x2 == x);
  CHECK(y2 == y);
}

TEST_CASE("version-7 shards hold uint32 tokens (Llama 3's vocabulary): written, read and checked", "[data][shard]") {
  TempDir dir;
  const std::string path = dir.file("l_train_000000.bin");
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128000, 128255, 7};
  write_shard(path, tokens);
  CHECK(fs::file_size(path) == kShardHeaderBytes + 4 * tokens.size());
  TokenShard shard(path, 128256);
  CHECK(shard.version() == kShardVersion32);
  REQUIRE(shard.size() == tokens.size());
  CHECK(std::vector<uint32_t>(shard.tokens32().begin(), shard.tokens32().end()) == tokens);
  CHECK_THROWS(shard.tokens());  // not uint16
  std::vector<int32_t> out(3);
  shard.read(2, 3, out.data());
  CHECK(out == std::vector<int32_t>{65536, 128000, 128255});
  // An id past the model's vocabulary is refused, naming the file, the id and its index.
  CHECK_THAT(runtime_error_of([&] { TokenShard(path, 128000).read(0, 6, std::vector<int32_t>(6).data()); }),
             Contains(path) && Contains("token 128000 at index 3") && Contains("model.vocab_size=128000"));
}

TEST_CASE("loader: a data set may mix version-1 and version-7 shards", "[data][loader]") {
  TempDir dir;
  write_shard(dir.file("v_train_000000.bin"), iota_tokens(7, 0));
  const std::vector<uint32_t> wide = {7, 8, 9, 70000, 11, 12};
  write_shard(dir.file("v_train_000001.bin"), wide);
  DataLoader loader(dir.file("v_train_*.bin"), 128256, 1, 12);
  REQUIRE(loader.total_tokens() == 13);
  std::vector<int32_t> x(12), y(12);
  loader.load(0, 0, x.data(), y.data());
  const std::vector<int32_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 70000, 11, 12};
  CHECK(x == std::vector<int32_t>(all.begin(), all.begin() + 12));
  CHECK(y == std::vector<int32_t>(all.begin() + 1, all.end()));
}

TEST_CASE("loader: multi-shard concatenation", "[data][loader]") {
  TempDir dir;
  write_shard(dir.file("m_train_000000.bin"), iota_tokens(7, 0));
  write_shard(dir.file("m_train_000001.bin"), iota_tokens(6, 7));
  write_shard(dir.file("m_train_000002.bin"), iota_tokens(9, 13));
  const int B = 4, T = 5;
  DataLoader loader(dir.file("m_train_*.bin"), 256, B, T);
  REQUIRE(loader.total_tokens() == 22);
  std::vector<int32_t> x(B * T), y(B * T);
  loader.load(1, 0, x.data(), y.data());
  for (int i = 0; i < B * T; ++i) {
    CHECK(x[i] == (1 + i) % 22);
    CHECK(y[i] == (2 + i) % 22);
  }
}

TEST_CASE("loader: one call for sequences [0,4) equals two calls for [0,2) and [2,4)", "[data][loader]") {
  // What data parallelism relies on: rank d of micro-step m reads first_sequence = (m*dp + d)*B.
  TempDir dir;
  std::vector<uint16_t> tokens(301);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 251);
  write_shard(dir.file("p_000.bin"), tokens);
  const int T = 16;
  DataLoader whole(dir.file("p_*.bin"), 256, 4, T);
  DataLoader half(dir.file("p_*.bin"), 256, 2, T);
  for (uint64_t cursor : {0ull, 37ull, 290ull}) {
    std::vector<int32_t> x4(4 * T), y4(4 * T), x2(4 * T), y2(4 * T);
    whole.load(cursor, 0, x4.data(), y4.data());
    half.load(cursor, 0, x2.data(), y2.data());
    half.load(cursor, 2, x2.data() + 2 * T, y2.data() + 2 * T);
    CHECK(x4 == x2);
    CHECK(y4 == y2);
  }
}

TEST_CASE("loader: too little data and bad tokens are clear errors", "[data][loader]") {
  TempDir dir;
  write_shard(dir.file("small_000.bin"), iota_tokens(8));
  CHECK_THAT(runtime_error_of([&] { DataLoader(dir.file("small_*.bin"), 256, 1, 8); }),
             Contains("hold 8 tokens") && Contains("seq_len + 1 = 9"));
  DataLoader ok(dir.file("small_*.bin"), 256, 1, 7);  // exactly T+1 tokens is enough

  write_shard(dir.file("big_000.bin"), iota_tokens(300));
  DataLoader loader(dir.file("big_*.bin"), 256, 1, 16);
  std::vector<int32_t> x(16), y(16);
  loader.load(0, 0, x.data(), y.data());
  CHECK_THAT(runtime_error_of([&] { loader.load(250, 0, x.data(), y.data()); }),
             Contains("big_000.bin") && Contains("token 256 at index 256"));
}

TEST_CASE("prepare_dataset: shards hold the input bytes plus separators", "[data][prepare]") {
  TempDir dir;
  const fs::path in = dir.path / "text";
  write_bytes((in / "b.txt").string(), "world\n");
  write_bytes((in / "a.txt").string(), "hello");
  write_bytes((in / "sub" / "c.txt").string(), std::string("bin\0ary\xff", 8));
  write_bytes((in / ".hidden").string(), "SKIP");
  write_bytes((in / ".git" / "d.txt").string(), "SKIP");
  write_bytes((in / "sub" / ".e.txt").string(), "SKIP");
  const std::string extra = dir.file("extra.txt");
  write_bytes(extra, "last");

  const std::string sep = kDocumentSeparator;
  const std::string expected = "hello" + sep + "world\n" + sep + std::string("bin\0ary\xff", 8) + sep + "last" + sep;

  PrepareOptions opts;
  opts.inputs = {in.string(), extra};
  opts.out_dir = (in / "shards").string();  // inside the input: must not be read back on a re-run
  opts.name = "tiny";
  opts.val_fraction = 0.1;
  opts.shard_tokens = 8;

  auto check_output = [&](const PrepareResult& r) {
    // 31 tokens; 10% is 4, raised toward 1025 but capped at half the data: 15 val, 16 train.
    REQUIRE(expected.size() == 31);
    CHECK(r.val_tokens == 15);
    CHECK(r.train_tokens == 16);
    const std::string out = opts.out_dir + "/";
    CHECK(r.files == std::vector<std::string>{out + "tiny_val_000000.bin", out + "tiny_val_000001.bin",
                                              out + "tiny_train_000000.bin", out + "tiny_train_000001.bin"});
    std::string all;
    for (const auto& f : r.files) {
      TokenShard shard(f, 256);
      CHECK(shard.size() <= opts.shard_tokens);
      for (uint16_t t : shard.tokens()) all.push_back(static_cast<char>(t));
    }
    CHECK(all == expected);
    // The loader reads the same stream back.
    DataLoader loader(out + "tiny_train_*.bin", 256, 1, 13);
    std::vector<int32_t> x(13), y(13);
    loader.load(0, 0, x.data(), y.data());
    for (int i = 0; i < 13; ++i) CHECK(x[i] == static_cast<unsigned char>(expected[15 + i]));
  };

  check_output(prepare_dataset(opts));
  SECTION("a re-run gives the same shards and removes stale ones") {
    write_shard(opts.out_dir + "/tiny_train_000007.bin", iota_tokens(2));
    write_shard(opts.out_dir + "/other_train_000007.bin", iota_tokens(2));  // another name: kept
    check_output(prepare_dataset(opts));
    CHECK_FALSE(fs::exists(opts.out_dir + "/tiny_train_000007.bin"));
    CHECK(fs::exists(opts.out_dir + "/other_train_000007.bin"));
  }
  SECTION("val_fraction 0 writes no val shard") {
    opts.val_fraction = 0;
    opts.shard_tokens = 100;
    const PrepareResult r = prepare_dataset(opts);
    CHECK(r.val_tokens == 0);
    CHECK(r.train_tokens == expected.size());
    CHECK(r.files == std::vector<std::string>{opts.out_dir + "/tiny_train_000000.bin"});
    CHECK_FALSE(fs::exists(opts.out_dir + "/tiny_val_000000.bin"));  // the earlier run's val was removed
  }
}

TEST_CASE("prepare_dataset: the val split takes at least one sequence when the data allows", "[data][prepare]") {
  TempDir dir;
  write_bytes(dir.file("in/big.txt"), std::string(10000, 'a'));
  PrepareOptions opts;
  opts.inputs = {dir.file("in")};
  opts.out_dir = dir.file("out");
  const PrepareResult r = prepare_dataset(opts);  // 0.5% of 10002 is 51 tokens: raised to 1025
  CHECK(r.val_tokens == kMinValTokens);
  CHECK(r.train_tokens == 10002 - kMinValTokens);
  CHECK(read_bytes(dir.file("out/corpus_val_000000.bin")).size() == kShardHeaderBytes + 2 * kMinValTokens);
}

TEST_CASE("prepare_dataset: bad options and empty input", "[data][prepare]") {
  TempDir dir;
  write_bytes(dir.file("in/a.txt"), "text");
  PrepareOptions opts;
  opts.inputs = {dir.file("in")};
  opts.out_dir = dir.file("out");

  auto config_error_of = [](const PrepareOptions& o) -> std::string {
    try {
      prepare_dataset(o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    FAIL("expected a pt::ConfigError");
    return {};
  };
  PrepareOptions o = opts;
  o.tokenizer = "gpt3";
  CHECK_THAT(config_error_of(o), Contains("unknown tokenizer 'gpt3'"));
  o = opts;
  o.inputs = {dir.file("nope")};
  CHECK_THAT(config_error_of(o), Contains("nope") && Contains("does not exist"));
  o = opts;
  o.val_fraction = 1.0;
  CHECK_THAT(config_error_of(o), Contains("val_fraction"));
  o = opts;
  o.shard_tokens = 0;
  CHECK_THAT(config_error_of(o), Contains("shard_tokens"));
  o = opts;
  o.inputs = {dir.file("empty")};
  fs::create_directories(dir.file("empty/sub"));
  write_bytes(dir.file("empty/sub/zero.txt"), "");
  CHECK_THAT(config_error_of(o), Contains("no text"));
  o = opts;
  o.inputs = {dir.file("in")};
  o.out_dir = dir.file("in");
  CHECK_THAT(config_error_of(o), Contains("is the output directory"));
}
