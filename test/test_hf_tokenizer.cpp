// The tokenizer.json reader (core/tokenizer/hf_tokenizer.h): Llama 3's file and GPT-2's (written
// here from OpenAI's encoder.json and vocab.bpe, as Hugging Face's gpt2 tokenizer.json holds them)
// give exactly the ids of Hugging Face's own JavaScript reader (npm @huggingface/tokenizers, run
// under node) on a few hundred varied strings; decode(encode(x)) == x for any bytes; the cut points
// keep the tokens; tiny hand-written files check each accepted feature and each refused kind.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "core/ckpt/hf_tokenizer_files.h"
#include "core/common/error.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "test_tokenizer_support.h"
#include "tokenizer_cases.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// The ids Hugging Face's JavaScript reader gives for each text (valid UTF-8 only).
std::vector<Ids> hf_reference_ids(const std::string& tokenizer_json, const std::vector<std::string>& texts) {
  const std::string lib = std::string(PICOTRAIN_SOURCE_DIR) + "/data/tokenizers-js";
  if (!fs::exists(lib + "/dist/tokenizers.cjs"))
    FAIL(lib << "/dist/tokenizers.cjs is missing: run scripts/get_data.sh --tokenizer");
  return node_reference_ids("hf_reference.js", {lib, tokenizer_json}, texts);
}

// What Llama 3's pattern and its special tokens treat specially, beyond GPT-2's cases.
std::vector<std::string> llama3_cases() {
  return {
      // digits in groups of one to three, whatever surrounds them
      "1 12 123 1234 12345 123456 1234567", "3.14159265358979", "v1.2.3-rc10", "0xDEADBEEF 1e-10 -42",
      "١٢٣٤٥ ５６７８", "$1,000,000.00 and 99%", "abc1234def",
      // contractions in any case (Llama 3's are case-insensitive), and apostrophes that are not
      "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D", "It'S dOn'T", "'s's 'S'S", "rock'n'roll", "' 'tis",
      // a punctuation run takes the newlines after it; newline runs; whitespace before newlines
      "end.\n\nNext", "a,\r\n\r\nb", "x  \n\n  y", "\n\n\n", "\r\r\n", "line \t\nnext", " \n", "tabs\t\t\tx",
      // one non-letter, non-digit before a letter run joins it
      "(word) [x] {y} <z> #tag @user $var _private -dash +plus", "\"quoted\" 'single'", "\tindented",
      // code
      "int main(int argc, char** argv) {\n    return 0;\n}\n", "def f(x):\n\treturn x ** 2  # square\n",
      "for (size_t i = 0; i < n; ++i) a[i] += b[i] * 3;", "<div class=\"a\">x</div>", "SELECT * FROM t WHERE id=42;",
      "x = {'a': [1, 2, 3], \"b\": None}", "#!/usr/bin/env bash\nset -euo pipefail\n",
      // special tokens inside text, next to text, repeated, and near misses
      "<|begin_of_text|>Hello", "Hello<|end_of_text|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
      "a <|begin_of_text|> b", "<|begin_of_text|><|begin_of_text|>", "<|reserved_special_token_0|>x",
      "<|begin_of_text|", "<|begin_of_text>", "<|BEGIN_OF_TEXT|>", "<|endoftext|>", "<<|eot_id|>>",
      // words that are tokens merges cannot reach: ignore_merges makes them one token
      "Chúng tôi làm việc hợp tác nhiều điều ở Việt Nam, biết", "Je to jeho dům", "gelmektedir kitaplardan",
      "سفر به ایران",
      // whitespace is Unicode White_Space, as in Oniguruma (Hugging Face's Rust regex engine): NEL
      // (U+0085) is, BOM (U+FEFF) is not; Hugging Face's JavaScript reader translates \s the same way
      "a \u0085a", "a \uFEFFa", "x\u0085\u0085 y", "\uFEFF \uFEFFHello",
      // ASCII control characters
      std::string("nul\0byte", 8), "bell\a\b\x1b[0m",
  };
}

// Random mixes over Llama 3's own specials, digits and code characters.
std::vector<std::string> llama3_random_cases(size_t count, uint32_t seed) {
  const std::vector<std::string> pool = {
      "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<|", "|>", "0", "12", "345", "6789", "'S", "'ll", "'RE",
      " ", "  ", "\n", "\r\n", "\t", "{", "}", "(", ")", ";", "=", "==", "->", "::", "x", "Word", "ün", "中文", "😀",
      ".", ",", "\n\n", " \n", "Ⅻ", "½", "\u00A0", "_", "#", "//", "/*", "*/", "'", "\""};
  std::mt19937 gen(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t len = 1 + gen() % 30;
    for (size_t j = 0; j < len; ++j) s += pool[gen() % pool.size()];
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> all_cases() {
  std::vector<std::string> texts = named_cases();
  for (auto list : {random_cases(300, 20261127), llama3_cases(), llama3_random_cases(200, 33)})
    texts.insert(texts.end(), list.begin(), list.end());
  texts.push_back("");
  texts.push_back(std::string(3000, ' ') + "x");
  texts.push_back(std::string(2000, '!'));
  texts.push_back(std::string(1500, 'a'));
  texts.push_back(std::string(1000, '7'));
  // Real text, when the offline corpus is there (scripts/get_data.sh): 40 KB from each file.
  for (const char* name : {"brown.txt", "austen.txt", "kjv.txt"}) {
    const std::string path = std::string(PICOTRAIN_SOURCE_DIR) + "/data/raw/" + name;
    if (fs::exists(path)) texts.push_back(slurp(path).substr(0, 40000));
  }
  return texts;
}

bool has_nel_or_bom(const std::string& s) {
  return s.find("\u0085") != std::string::npos || s.find("\uFEFF") != std::string::npos;
}

// `skip_nel_bom`: the reference's ByteLevel pre-tokenizer runs GPT-2's regex with JavaScript's \s
// (U+FEFF, no U+0085), unlike Hugging Face's Rust and OpenAI's encoder.py; those texts are
// checked against GPT-2's own reader instead, whose ids for them come from encoder.py.
void check_against_reference(const Tokenizer& tok, const std::string& tokenizer_json, bool skip_nel_bom) {
  const std::vector<std::string> texts = all_cases();
  const auto expected = hf_reference_ids(tokenizer_json, texts);
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (skip_nel_bom && has_nel_or_bom(texts[i])) continue;
    INFO("case " << i << ": \"" << texts[i].substr(0, 200) << "\"");
    const Ids got = tok.encode(texts[i]);
    REQUIRE(ids_text(got) == ids_text(expected[i]));
    CHECK(tok.decode(got) == texts[i]);
    tokens += got.size();
  }
  CHECK(texts.size() > 500);
  CHECK(tokens > 10000);
}

std::string load_error(const std::string& path) {
  try {
    HfTokenizer tok(path, "test");
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError for " << path);
  return {};
}

}  // namespace

TEST_CASE("llama3: the files load and give Llama 3's known ids", "[tokenizer][llama3]") {
  const HfTokenizer& tok = llama3();
  CHECK(tok.vocab_size() == 128256);
  CHECK(tok.merge_count() == 280147);
  CHECK(tok.name() == "llama3");
  CHECK(tok.encode("Hello World") == Ids{9906, 4435});
  CHECK(tok.encode("12345678") == Ids{4513, 10961, 2495});  // 123 456 78
  CHECK(tok.encode("").empty());
  CHECK(tok.document_prefix() == Ids{128000});  // tokenizer_config.json's bos_token
  CHECK(tok.document_suffix().empty());
  CHECK(tok.encode("<|begin_of_text|>hi<|end_of_text|>") == Ids{128000, 6151, 128001});
  CHECK(tok.decode(Ids{128000, 9906, 4435, 128009}) == "<|begin_of_text|>Hello World<|eot_id|>");
  CHECK_THROWS_AS(tok.decode(Ids{128256}), RuntimeError);
  CHECK_THROWS_AS(tok.decode(Ids{-1}), RuntimeError);
  // make_tokenizer: by name, by folder, by file.
  CHECK(make_tokenizer("llama3", llama3_dir())->vocab_size() == 128256);
  const auto by_file = make_tokenizer(llama3_dir() + "/tokenizer.json");
  CHECK(by_file->name() == llama3_dir() + "/tokenizer.json");
  CHECK(by_file->encode("Hello World") == Ids{9906, 4435});
}

TEST_CASE("llama3: ids match the reference encoder (@huggingface/tokenizers under node)", "[tokenizer][llama3]") {
  check_against_reference(llama3(), llama3_dir() + "/tokenizer.json", false);
}

TEST_CASE("gpt2 tokenizer.json: ids match the reference encoder, and GPT-2's own files", "[tokenizer][gpt2]") {
  TempDir dir;
  const std::string path = write_json(dir, "gpt2", json(ckpt::gpt2_tokenizer_json(gpt2_dir())));
  const HfTokenizer tok(path, "gpt2-json");
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.merge_count() == 50000);
  CHECK(tok.document_prefix() == Ids{50256});  // no tokenizer_config.json: the known <|endoftext|>
  check_against_reference(tok, path, true);
  // The same ids as the encoder.json + vocab.bpe reader, except where the text spells the special
  // token (ordinary text there, the special token here, as in transformers).
  const Gpt2Tokenizer& files = gpt2();
  for (const std::string& text : all_cases()) {
    INFO("\"" << text.substr(0, 200) << "\"");
    if (text.find("<|endoftext|>") == std::string::npos) REQUIRE(ids_text(tok.encode(text)) == ids_text(files.encode(text)));
  }
  CHECK(tok.encode("a<|endoftext|>b") == Ids{64, 50256, 65});
  CHECK(tok.encode("a \u0085a") == Ids{64, 220, 126, 227, 64});  // OpenAI's encoder.py (test_tokenizer)
}

TEST_CASE("llama3: decode(encode(x)) == x for any bytes, invalid UTF-8 included", "[tokenizer][llama3]") {
  const HfTokenizer& tok = llama3();
  auto roundtrip = [&](const std::string& s) {
    INFO("bytes: " << ids_text(Ids(s.begin(), s.end())));
    REQUIRE(tok.decode(tok.encode(s)) == s);
  };
  for (const auto& s : all_cases()) roundtrip(s);
  for (const std::string s : {"\xff", "abc\x80" "def", "\xe2\x82", "price: 5\xe2\x82 each", "\xc0\xaf", "\xed\xa0\x80",
                              "a \xff b", "caf\xe9", "\x80\x80\x80 \n\xbf", "<|eot_id|>\xff<|eot_id|>", "12\xff" "34"})
    roundtrip(s);
  std::mt19937 gen(11);
  for (int i = 0; i < 2000; ++i) {
    std::string s(gen() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(gen() % 256);
    roundtrip(s);
  }
  for (const auto& s : llama3_random_cases(300, 5)) {
    std::string t = s;
    t.insert(gen() % (t.size() + 1), 1, static_cast<char>(0x80 + gen() % 0x80));
    roundtrip(t);
  }
  // An invalid byte ends a piece, as the end of the text would (regex_splitter.h).
  const Ids a = tok.encode("12"), mid = tok.encode("\xff"), b = tok.encode("34");
  Ids joined = a;
  joined.insert(joined.end(), mid.begin(), mid.end());
  joined.insert(joined.end(), b.begin(), b.end());
  CHECK(tok.encode("12\xff" "34") == joined);
}

TEST_CASE("llama3: cutting at next_cut keeps the tokens of the whole", "[tokenizer][llama3]") {
  const HfTokenizer& tok = llama3();
  std::vector<std::string> texts = llama3_random_cases(300, 17);
  for (const auto& list : {named_cases(), llama3_cases()}) texts.insert(texts.end(), list.begin(), list.end());
  CHECK(check_cuts_keep_tokens(tok, texts) > 200);
  CHECK(tok.next_cut("ab cd", 0) == 2);
  CHECK(tok.next_cut("ab.\ncd", 0) == std::string::npos);  // ".\n" is one piece: not a cut
}

TEST_CASE("llama3: starts give each token's piece offset, added tokens included", "[tokenizer][llama3]") {
  auto enc = llama3().encoder();
  Ids ids;
  std::vector<size_t> starts;
  enc->encode("Hello<|eot_id|> World", ids, &starts);
  CHECK(ids == Ids{9906, 128009, 4435});
  CHECK(starts == std::vector<size_t>{0, 5, 15});
}

TEST_CASE("tokenizer.json: a tiny file's merges, ignore_merges, Split behaviours and added tokens", "[tokenizer]") {
  TempDir dir;
  // Tokens 256.. : "ab", "abc", "xyz" (never reachable by merges).
  const json merges = json::array({"a b", json::array({"ab", "c"})});
  const std::vector<std::string> extra = {"ab", "abc", "xyz"};
  auto load = [&](const std::string& name, const json& j) { return HfTokenizer(write_json(dir, name, j), name); };

  const HfTokenizer plain = load("plain", tiny_tokenizer(extra, merges, kByteLevelNoRegex));
  CHECK(plain.encode("abcab") == Ids{257, 256});
  CHECK(plain.encode("xyz") == Ids{'x', 'y', 'z'});
  CHECK(plain.next_cut("ab cd", 0) == std::string::npos);  // no regex: one piece, no cut

  json ignoring = tiny_tokenizer(extra, merges, kByteLevelNoRegex);
  ignoring["model"]["ignore_merges"] = true;
  CHECK(load("ignoring", ignoring).encode("xyz") == Ids{258});  // a piece that is a token is that token

  // Split on spaces, Isolated: the space is a piece of its own, BPE never merges across it.
  auto split = [&](const std::string& behavior, bool invert) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", behavior}, {"invert", invert}},
                  kByteLevelNoRegex}}};
  };
  const HfTokenizer isolated = load("isolated", tiny_tokenizer(extra, merges, split("Isolated", false)));
  CHECK(isolated.encode("ab c") == Ids{256, ' ', 'c'});
  const HfTokenizer removed = load("removed", tiny_tokenizer(extra, merges, split("Removed", false)));
  CHECK(removed.encode("ab  c ab") == Ids{256, 'c', 256});  // the spaces are gone
  const HfTokenizer kept = load("kept", tiny_tokenizer(extra, merges, split("Removed", true)));
  CHECK(kept.encode("ab  c ab") == Ids{' ', ' ', ' '});  // invert: only the spaces stay

  // A pattern that matches the empty string: empty matches cut nothing (Oniguruma's find-all skips
  // them), the "b"s are pieces and so are the "a"s between them.
  const json empty_matches = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"}, {"pattern", {{"Regex", "b*"}}}, {"behavior", "Isolated"}},
                                kByteLevelNoRegex}}};
  CHECK(load("empty", tiny_tokenizer(extra, merges, empty_matches)).encode("abab") == Ids{'a', 'b', 'a', 'b'});

  // A Regex Split before a ByteLevel with GPT-2's regex: both stages cut.
  const json two_stages = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"}, {"pattern", {{"Regex", "\\d"}}}, {"behavior", "Isolated"}},
                             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  CHECK(load("stages", tiny_tokenizer(extra, merges, two_stages)).encode("ab1abc") == Ids{256, '1', 257});

  // Added tokens: leftmost, then longest; decoded as their content; not a document marker.
  const json added = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                  {{"id", 301}, {"content", "<s>x"}, {"special", false}}});
  const HfTokenizer with_added = load("added", tiny_tokenizer(extra, merges, kByteLevelNoRegex, added));
  CHECK(with_added.vocab_size() == 302);
  CHECK(with_added.encode("ab<s>xab<s>") == Ids{256, 301, 256, 300});
  CHECK(with_added.decode(Ids{300, 301}) == "<s><s>x");
  CHECK_THROWS_AS(with_added.decode(Ids{280}), RuntimeError);  // a hole between the vocabulary and the added ids
  CHECK_THROWS_WITH(with_added.document_prefix(), Contains("bos_token"));
  // tokenizer_config.json's bos_token ({"content": ...} form) names the marker.
  std::ofstream((dir.path / "added" / "tokenizer_config.json").string()) << R"({"bos_token": {"content": "<s>"}})";
  CHECK(load("added", tiny_tokenizer(extra, merges, kByteLevelNoRegex, added)).document_prefix() == Ids{300});
}

TEST_CASE("tokenizer.json: kinds that are not byte-level BPE are refused, naming the kind", "[tokenizer]") {
  TempDir dir;
  const json base = tiny_tokenizer({}, json::array(), kByteLevelNoRegex);
  auto refused = [&](const std::string& name, const json& j) { return load_error(write_json(dir, name, j)); };

  json unigram = base;
  unigram["model"] = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", {{"<unk>", 0.0}, {"a", -1.0}}}};
  unigram["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  CHECK_THAT(refused("unigram", unigram), Contains("model type Unigram") && Contains("SentencePiece/Unigram"));

  json wordpiece = base;
  wordpiece["model"] = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"a", 1}}}};
  wordpiece["normalizer"] = {{"type", "BertNormalizer"}};
  CHECK_THAT(refused("wordpiece", wordpiece), Contains("model type WordPiece") && Contains("tokenizer.json"));

  json sentencepiece_bpe = base;  // Llama 2's kind: BPE over "▁"-spelled text with byte fallback
  sentencepiece_bpe["model"]["byte_fallback"] = true;
  CHECK_THAT(refused("byte_fallback", sentencepiece_bpe), Contains("byte_fallback"));

  json metaspace = base;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
  CHECK_THAT(refused("metaspace", metaspace), Contains("pre-tokenizer Metaspace"));

  json no_byte_level = base;
  no_byte_level["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Isolated"}};
  CHECK_THAT(refused("no_byte_level", no_byte_level), Contains("no ByteLevel pre-tokenizer"));

  json nfc = base;
  nfc["normalizer"] = {{"type", "NFC"}};
  CHECK_THAT(refused("nfc", nfc), Contains("normalizer NFC"));

  json digits = base;
  digits["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}, kByteLevelNoRegex}}};
  CHECK_THAT(refused("digits", digits), Contains("pre-tokenizer Digits"));

  json merged = base;
  merged["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers",
                              {{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}},
                               kByteLevelNoRegex}}};
  CHECK_THAT(refused("merged", merged), Contains("MergedWithPrevious"));

  json lstrip = base;
  lstrip["added_tokens"] = {{{"id", 256}, {"content", "<mask>"}, {"lstrip", true}}};
  CHECK_THAT(refused("lstrip", lstrip), Contains("<mask>") && Contains("lstrip"));

  json prefix_space = base;
  prefix_space["pre_tokenizer"]["add_prefix_space"] = true;
  CHECK_THAT(refused("prefix_space", prefix_space), Contains("add_prefix_space"));

  json wordpiece_decoder = base;
  wordpiece_decoder["decoder"] = {{"type", "WordPiece"}};
  CHECK_THAT(refused("decoder", wordpiece_decoder), Contains("decoder WordPiece"));

  CHECK_THAT(load_error(dir.file("missing")), Contains("cannot read") && Contains("scripts/get_data.sh --tokenizer"));
  std::ofstream(dir.file("broken.json")) << "{not json";
  CHECK_THAT(load_error(dir.file("broken.json")), Contains("not valid JSON"));
  CHECK_THROWS_WITH(make_tokenizer("llama4"), Contains("unknown tokenizer 'llama4'") && Contains("tokenizer.json"));
}
