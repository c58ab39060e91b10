// `picotrain prepare` with the byte, GPT-2 and Llama 3 tokenizers on text, .gz, JSONL and .jsonl.gz
// inputs: the shards (uint16, or uint32 for Llama 3) hold exactly each document's tokens with the
// separator ids, in input order, the same for any thread count and chunk size; the val split
// follows prepare.h's unit rule; bad input is a clear error naming the file (and line).
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/data/prepare.h"
#include "core/data/shard.h"
#include "core/tokenizer/gpt2_tokenizer.h"
#include "test_tokenizer_support.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

void write_gz(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string jsonl(const std::vector<std::string>& texts) {
  std::string out;
  for (const auto& t : texts) out += nlohmann::json{{"text", t}, {"id", out.size()}}.dump() + "\n";
  return out;
}

// The input corpus, and its documents in the order prepare must read them.
struct Corpus {
  std::string dir;
  std::vector<std::string> documents;
};

Corpus make_corpus(const TempDir& tmp) {
  Corpus c;
  c.dir = tmp.file("corpus");
  const std::string a = "Hello world.\nSecond line, with it's contractions and   spaces.\n\n";
  const std::string b = "A compressed document. The text <|endoftext|> inside it is ordinary text.\n";
  const std::vector<std::string> c_docs = {"first JSON document", "second: ünïcode 中文 😀 — \"quoted\"\nnew line",
                                           "", "fourth\tone"};
  const std::vector<std::string> d_docs = {"gzipped JSONL one", std::string(3000, 'x') + " long " + std::string(200, ' ')};
  std::string e;  // a longer text document, cut into many chunks
  for (int i = 0; i < 300; ++i) e += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
  write_file(c.dir + "/a.txt", a);
  write_gz(c.dir + "/b.txt.gz", b);
  write_file(c.dir + "/c.jsonl", jsonl({c_docs[0], c_docs[1]}) + "\n  \n" + jsonl({c_docs[2]}) +
                                     nlohmann::json{{"text", c_docs[3]}}.dump());  // no final newline
  write_gz(c.dir + "/d.jsonl.gz", jsonl(d_docs));
  write_file(c.dir + "/e/long.txt", e);
  write_file(c.dir + "/.hidden.jsonl", jsonl({"SKIP"}));
  c.documents = {a, b};
  c.documents.insert(c.documents.end(), c_docs.begin(), c_docs.end());
  c.documents.insert(c.documents.end(), d_docs.begin(), d_docs.end());
  c.documents.push_back(e);
  return c;
}

std::vector<uint16_t> read_all(const std::vector<std::string>& files, const std::string& split) {
  std::vector<uint16_t> all;
  for (const auto& f : files) {
    if (f.find("_" + split + "_") == std::string::npos) continue;
    TokenShard shard(f, 65536);
    all.insert(all.end(), shard.tokens().begin(), shard.tokens().end());
  }
  return all;
}

std::string files_bytes(const std::vector<std::string>& files) {
  std::string all;
  for (const auto& f : files) all += slurp(f);
  return all;
}

}  // namespace

TEST_CASE("prepare gpt2: <|endoftext|> then each document's tokens, from every input kind", "[tokenizer][prepare]") {
  const Gpt2Tokenizer& tok = gpt2();
  TempDir tmp;
  const Corpus corpus = make_corpus(tmp);

  // The expected stream, and each token's unit (see prepare.h) for the val rule.
  std::vector<uint16_t> expected;
  std::vector<uint64_t> unit_of;
  uint64_t units = 0;
  auto enc = tok.encoder();
  for (const auto& doc : corpus.documents) {
    expected.push_back(50256);
    unit_of.push_back(units++);
    std::vector<int32_t> ids;
    std::vector<size_t> starts;
    enc->encode(doc, ids, &starts);
    for (size_t i = 0; i < ids.size(); ++i) {
      expected.push_back(static_cast<uint16_t>(ids[i]));
      unit_of.push_back(units + starts[i]);
    }
    units += doc.size();
  }

  PrepareOptions opts;
  opts.tokenizer = "gpt2";
  opts.tokenizer_dir = gpt2_dir();
  opts.inputs = {corpus.dir};
  opts.out_dir = tmp.file("out");
  opts.name = "tiny";
  opts.shard_tokens = 700;
  opts.threads = 1;

  SECTION("no val split: train is the whole stream, the literal marker is text") {
    opts.val_fraction = 0;
    const PrepareResult r = prepare_dataset(opts);
    CHECK(r.documents == corpus.documents.size());
    CHECK(r.val_tokens == 0);
    CHECK(r.train_tokens == expected.size());
    const auto got = read_all(r.files, "train");
    REQUIRE(got == expected);
    CHECK(std::count(got.begin(), got.end(), 50256) == static_cast<long>(corpus.documents.size()));
    for (const auto& f : r.files) CHECK(TokenShard(f, 50257).size() <= opts.shard_tokens);
  }
  SECTION("val takes the tokens of the first V units; the output does not depend on threads or chunks") {
    opts.val_fraction = 0.3;
    const PrepareResult r = prepare_dataset(opts);
    const auto v = static_cast<uint64_t>(std::ceil(0.3 * static_cast<double>(units)));  // above the 1025 minimum
    REQUIRE(v > kMinValTokens);
    const auto val_count = static_cast<uint64_t>(std::count_if(unit_of.begin(), unit_of.end(), [&](uint64_t u) { return u < v; }));
    CHECK(r.val_tokens == val_count);
    CHECK(r.train_tokens == expected.size() - val_count);
    std::vector<uint16_t> both = read_all(r.files, "val");
    CHECK(both.size() == val_count);
    const auto train = read_all(r.files, "train");
    both.insert(both.end(), train.begin(), train.end());
    CHECK(both == expected);
    CHECK(r.files.front().find("tiny_val_000000.bin") != std::string::npos);

    const std::string reference = files_bytes(r.files);
    for (int threads : {2, 3}) {
      for (size_t chunk : {size_t{1}, size_t{7}, size_t{100}, size_t{4096}}) {
        INFO("threads " << threads << ", chunk_bytes " << chunk);
        PrepareOptions o = opts;
        o.threads = threads;
        o.chunk_bytes = chunk;
        o.out_dir = tmp.file("out_" + std::to_string(threads) + "_" + std::to_string(chunk));
        const PrepareResult r2 = prepare_dataset(o);
        CHECK(r2.val_tokens == r.val_tokens);
        CHECK(files_bytes(r2.files) == reference);
      }
    }
  }
}

TEST_CASE("prepare llama3: version-7 uint32 shards, <|begin_of_text|> before each document", "[tokenizer][prepare]") {
  const HfTokenizer& tok = llama3();
  TempDir tmp;
  const Corpus corpus = make_corpus(tmp);
  std::vector<uint32_t> expected;
  std::string text;  // what the tokens decode to
  for (const auto& doc : corpus.documents) {
    expected.push_back(128000);
    for (int32_t id : tok.encode(doc)) expected.push_back(static_cast<uint32_t>(id));
    text += "<|begin_of_text|>" + doc;
  }
  REQUIRE(*std::max_element(expected.begin(), expected.end()) == 128000);  // past uint16

  PrepareOptions opts;
  opts.tokenizer = "llama3";
  opts.tokenizer_dir = llama3_dir();
  opts.inputs = {corpus.dir};
  opts.out_dir = tmp.file("out");
  opts.shard_tokens = 500;
  opts.val_fraction = 0.3;
  opts.threads = 1;
  const PrepareResult r = prepare_dataset(opts);
  CHECK(r.documents == corpus.documents.size());
  CHECK(r.val_tokens > 0);
  std::vector<uint32_t> got;
  for (const auto& f : r.files) {
    TokenShard shard(f, tok.vocab_size());
    CHECK(shard.version() == kShardVersion32);
    CHECK(shard.size() <= opts.shard_tokens);
    got.insert(got.end(), shard.tokens32().begin(), shard.tokens32().end());
  }
  REQUIRE(got == expected);
  CHECK(tok.decode(std::vector<int32_t>(got.begin(), got.end())) == text);

  // The same bytes for any thread count and chunk size: the Llama 3 pattern's cuts keep the tokens.
  const std::string reference = files_bytes(r.files);
  for (int threads : {2, 3}) {
    for (size_t chunk : {size_t{1}, size_t{100}}) {
      INFO("threads " << threads << ", chunk_bytes " << chunk);
      PrepareOptions o = opts;
      o.threads = threads;
      o.chunk_bytes = chunk;
      o.out_dir = tmp.file("out_" + std::to_string(threads) + "_" + std::to_string(chunk));
      CHECK(files_bytes(prepare_dataset(o).files) == reference);
    }
  }

  // On the command line, by the path of the tokenizer.json.
  const std::string cmd = "'" + std::string(PICOTRAIN_BIN) + "' prepare --tokenizer '" + llama3_dir() +
                          "/tokenizer.json' --input '" + corpus.dir + "/a.txt' --out '" + tmp.file("cli") +
                          "' --val-fraction 0 > '" + tmp.file("log") + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  TokenShard shard(tmp.file("cli") + "/corpus_train_000000.bin", tok.vocab_size());
  CHECK(shard.version() == kShardVersion32);
  CHECK(tok.decode(std::vector<int32_t>(shard.tokens32().begin(), shard.tokens32().end())) ==
        "<|begin_of_text|>" + corpus.documents[0]);
}

TEST_CASE("prepare bytes: .gz and JSONL documents, each followed by the separator", "[tokenizer][prepare]") {
  TempDir tmp;
  const Corpus corpus = make_corpus(tmp);
  std::string stream;
  for (const auto& doc : corpus.documents) stream += doc + kDocumentSeparator;

  PrepareOptions opts;
  opts.inputs = {corpus.dir};
  opts.out_dir = tmp.file("out");
  opts.val_fraction = 0.25;
  opts.shard_tokens = 5000;
  opts.threads = 2;
  opts.chunk_bytes = 64;
  const PrepareResult r = prepare_dataset(opts);
  // Units are tokens with the byte tokenizer: val is exactly ceil(0.25 * N) tokens.
  const auto v = static_cast<uint64_t>(std::ceil(0.25 * static_cast<double>(stream.size())));
  CHECK(r.val_tokens == v);
  CHECK(r.train_tokens == stream.size() - v);
  std::string got;
  for (const char* split : {"val", "train"})
    for (uint16_t t : read_all(r.files, split)) got.push_back(static_cast<char>(t));
  CHECK(got == stream);
}

TEST_CASE("prepare: malformed inputs and missing tokenizer files are clear errors", "[tokenizer][prepare]") {
  TempDir tmp;
  PrepareOptions opts;
  opts.out_dir = tmp.file("out");
  auto error_of = [&](const std::string& input) -> std::string {
    opts.inputs = {input};
    try {
      prepare_dataset(opts);
    } catch (const std::exception& e) {
      return e.what();
    }
    FAIL("expected an error for " << input);
    return {};
  };

  write_file(tmp.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": broken}\n");
  CHECK_THAT(error_of(tmp.file("bad.jsonl")), Contains("bad.jsonl:2") && Contains("not valid JSON"));
  write_file(tmp.file("notext.jsonl"), "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n");
  CHECK_THAT(error_of(tmp.file("notext.jsonl")), Contains("notext.jsonl:3") && Contains("string field \"text\""));
  write_file(tmp.file("number.jsonl"), "{\"text\": 5}\n");
  CHECK_THAT(error_of(tmp.file("number.jsonl")), Contains("number.jsonl:1"));

  // A gzip file cut short.
  write_gz(tmp.file("whole.txt.gz"), std::string(100000, 'a') + "some more text to compress");
  const std::string gz = slurp(tmp.file("whole.txt.gz"));
  write_file(tmp.file("cut.txt.gz"), gz.substr(0, gz.size() / 2));
  CHECK_THAT(error_of(tmp.file("cut.txt.gz")), Contains("cut.txt.gz") && Contains("decompress"));

  // Empty documents only.
  write_file(tmp.file("empty.jsonl"), jsonl({"", ""}));
  CHECK_THAT(error_of(tmp.file("empty.jsonl")), Contains("no text"));
  opts.val_fraction = 0;  // no first pass: found at the end
  CHECK_THAT(error_of(tmp.file("empty.jsonl")), Contains("no text"));

  opts.tokenizer = "gpt2";
  opts.tokenizer_dir = tmp.file("no_such_dir");
  write_file(tmp.file("ok.txt"), "text");
  try {
    opts.inputs = {tmp.file("ok.txt")};
    prepare_dataset(opts);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Contains(tmp.file("no_such_dir")) && Contains("scripts/get_data.sh"));
  }
}

TEST_CASE("picotrain prepare --tokenizer gpt2 on the command line", "[tokenizer][prepare]") {
  TempDir tmp;
  write_file(tmp.file("in/doc.jsonl"), jsonl({"Hello world, the quick brown fox.", "Second document."}));
  const std::string bin = PICOTRAIN_BIN;
  const std::string out = tmp.file("out");
  const std::string cmd = "'" + bin + "' prepare --tokenizer gpt2 --tokenizer-dir '" + gpt2_dir() + "' --input '" +
                          tmp.file("in") + "' --out '" + out + "' --val-fraction 0 --threads 2 > '" +
                          tmp.file("log") + "' 2>&1";
  (void)gpt2();  // fails with the fetch command when the files are missing
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK_THAT(slurp(tmp.file("log")), Contains("prepared 13 train and 0 val tokens") && Contains("2 documents"));
  TokenShard shard(out + "/corpus_train_000000.bin", 50257);
  CHECK(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()) ==
        std::vector<uint16_t>{50256, 15496, 995, 11, 262, 2068, 7586, 21831, 13, 50256, 12211, 3188, 13});

  const std::string bad = "'" + bin + "' prepare --tokenizer gpt2 --tokenizer-dir '" + tmp.file("nope") +
                          "' --input '" + tmp.file("in") + "' --out '" + out + "' > '" + tmp.file("log") + "' 2>&1";
  const int rc = std::system(bad.c_str());
  CHECK(WEXITSTATUS(rc) == 2);
  CHECK_THAT(slurp(tmp.file("log")), Contains("error: ") && Contains("scripts/get_data.sh --tokenizer"));
}
