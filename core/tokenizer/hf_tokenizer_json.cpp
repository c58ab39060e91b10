#include "core/tokenizer/hf_tokenizer_json.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common/error.h"
#include "core/tokenizer/split_patterns.h"

namespace pt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kOnlyByteLevelBpe =
    "picotrain reads byte-level BPE tokenizers only (GPT-2, Llama 3 and the like); SentencePiece/Unigram, "
    "WordPiece and other kinds are refused";

json parse_file(const fs::path& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required) return json();
    throw ConfigError("tokenizer.json reader: cannot read " + path.string() +
                      "; fetch Llama 3's with scripts/get_data.sh --tokenizer llama3 (into data/llama3/), or pass "
                      "--tokenizer with a tokenizer.json or a folder holding one");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw ConfigError("tokenizer.json reader: " + path.string() + " is not valid JSON: " + e.what());
  }
}

// Reads the parts of one tokenizer.json; `fail` throws with the file named.
class Reader {
 public:
  // Moves the vocabulary out of `root` rather than copying 128,000 entries.
  Reader(json& root, HfTokenizerFile& out) : root_(root), out_(out) {}

  void read() {
    if (!root_.is_object()) fail("must hold a JSON object");
    field(root_, "model");  // throws when missing
    model(root_.at("model"));
    normalizer(root_.value("normalizer", json()));
    const json pre = root_.value("pre_tokenizer", json());
    if (pre.is_null()) fail("has no pre_tokenizer, so it is not a byte-level tokenizer; " + std::string(kOnlyByteLevelBpe));
    pre_tokenizer(pre);
    if (!byte_level_)
      fail("has no ByteLevel pre-tokenizer, so it is not a byte-level tokenizer; " + std::string(kOnlyByteLevelBpe));
    decoder(root_.value("decoder", json()));
    added_tokens(root_.value("added_tokens", json::array()));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("tokenizer.json reader: " + out_.path + " " + why);
  }
  const json& field(const json& j, const char* key) const {
    if (!j.is_object() || !j.contains(key)) fail(std::string("has no \"") + key + "\"");
    return j.at(key);
  }
  std::string type_of(const json& j, const char* what) const {
    if (!j.is_object() || !j.contains("type") || !j.at("type").is_string())
      fail(std::string("has a ") + what + " without a \"type\"");
    return j.at("type").get<std::string>();
  }
  static bool set(const json& j, const char* key) {  // present and neither null, false, 0 nor ""
    if (!j.contains(key)) return false;
    const json& v = j.at(key);
    return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0) ||
             (v.is_string() && v.get<std::string>().empty()));
  }

  void model(json& m) {
    // Older files leave out the type; only BPE has merges.
    const std::string type = m.is_object() && m.contains("type") ? type_of(m, "model")
                             : m.is_object() && m.contains("merges") ? "BPE" : "unknown";
    if (type != "BPE") fail("has model type " + type + ", which is not supported: " + kOnlyByteLevelBpe);
    if (set(m, "byte_fallback"))
      fail("has a BPE model with byte_fallback (SentencePiece-style BPE, as Llama 2's), which is not supported: " +
           std::string(kOnlyByteLevelBpe));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
      if (set(m, key)) fail(std::string("has a BPE model with ") + key + ", which is not supported: " + kOnlyByteLevelBpe);
    field(m, "vocab");
    out_.vocab = std::move(m.at("vocab"));
    out_.ignore_merges = m.value("ignore_merges", false);
    const json& merges = field(m, "merges");
    if (!merges.is_array()) fail("has model.merges that is not an array");
    out_.merges.reserve(merges.size());
    for (const json& merge : merges) {
      if (merge.is_string()) {  // "left right": spellings never hold a space (byte-level spells it Ġ)
        const std::string& s = merge.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
          fail("has the merge \"" + s + "\", not two tokens separated by one space");
        out_.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        out_.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      } else {
        fail("has the merge " + merge.dump() + ", neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }

  void normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = type_of(n, "normalizer");
    if (type == "Sequence" && n.value("normalizers", json::array()).empty()) return;
    fail("has the normalizer " + type + ", which is not supported (picotrain encodes the raw text: byte-level "
         "BPE tokenizers have no normalizer)");
  }

  void pre_tokenizer(const json& p) {
    const std::string type = type_of(p, "pre_tokenizer");
    if (type == "Sequence") {
      for (const json& each : field(p, "pretokenizers")) pre_tokenizer(each);
    } else if (type == "ByteLevel") {
      // add_prefix_space puts a space before each piece: text decode could not give back.
      if (p.value("add_prefix_space", false))
        fail("has a ByteLevel pre-tokenizer with add_prefix_space, which is not supported (decoding would not "
             "give back the text)");
      if (p.value("use_regex", true)) out_.splits.push_back({std::string(kGpt2SplitPattern), true, true});
      byte_level_ = true;
    } else if (type == "Split") {
      // After ByteLevel the text is spelled in byte characters; a regex written for that is not supported.
      if (byte_level_) fail("has a Split pre-tokenizer after its ByteLevel one, which is not supported");
      split(p);
    } else {
      fail("has the pre-tokenizer " + type + ", which is not supported: " + kOnlyByteLevelBpe);
    }
  }

  void split(const json& p) {
    const json& pattern = field(p, "pattern");
    HfTokenizerFile::Split s;
    if (pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      s.pattern = pattern.at("Regex").get<std::string>();
    } else if (pattern.contains("String") && pattern.at("String").is_string()) {
      for (char c : pattern.at("String").get<std::string>()) {  // literal: escape every ASCII punctuation
        if (std::ispunct(static_cast<unsigned char>(c))) s.pattern += '\\';
        s.pattern += c;
      }
    } else {
      fail("has a Split pre-tokenizer whose pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const std::string behavior = p.value("behavior", "");
    const bool invert = p.value("invert", false);
    if (behavior == "Removed") {  // keep what is not removed; invert swaps the two
      s.keep_matches = invert;
      s.keep_gaps = !invert;
    } else if (behavior != "Isolated") {
      fail("has a Split pre-tokenizer with behavior \"" + behavior + "\", which is not supported (Isolated and "
           "Removed are)");
    }
    out_.splits.push_back(std::move(s));
  }

  void decoder(const json& d) {
    if (d.is_null()) return;
    const std::string type = type_of(d, "decoder");
    if (type != "ByteLevel") fail("has the decoder " + type + ", which is not supported: " + kOnlyByteLevelBpe);
  }

  void added_tokens(const json& list) {
    if (!list.is_array()) fail("has added_tokens that is not an array");
    for (const json& t : list) {
      if (!t.is_object() || !t.contains("id") || !t.at("id").is_number_integer() || t.at("id").get<int64_t>() < 0 ||
          t.at("id").get<int64_t>() > INT32_MAX || !t.contains("content") || !t.at("content").is_string() ||
          t.at("content").get<std::string>().empty())
        fail("has the added token " + t.dump() + " without an id in [0, 2^31) and a non-empty content");
      const std::string content = t.at("content").get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (t.value(key, false)) fail("has the added token \"" + content + "\" with " + key + ", which is not supported");
      out_.added.push_back({t.at("id").get<int32_t>(), content});
    }
  }

  json& root_;
  HfTokenizerFile& out_;
  bool byte_level_ = false;
};

// The token that starts each document (hf_tokenizer.h): tokenizer_config.json's bos_token (a string
// or {"content": ...}) when it is an added token, as llm.c starts each Llama 3 document with
// <|begin_of_text|>; add_bos_token is not consulted, since the marker separates documents in
// training data whatever a chat template does. Without one, the known markers among the added
// tokens: Llama 3's <|begin_of_text|>, then GPT-2's <|endoftext|> (as GPT-2 data starts each
// document with it).
int32_t document_marker(const json& config, const std::vector<HfTokenizerFile::AddedToken>& added) {
  auto added_id = [&](const std::string& s) {
    for (const auto& t : added)
      if (t.content == s) return t.id;
    return -1;
  };
  if (config.is_object() && config.contains("bos_token")) {
    const json& bos = config.at("bos_token");
    const json content = bos.is_object() ? bos.value("content", json()) : bos;
    if (content.is_string())
      if (const int32_t id = added_id(content.get<std::string>()); id >= 0) return id;
  }
  for (const char* known : {"<|begin_of_text|>", "<|endoftext|>"})
    if (const int32_t id = added_id(known); id >= 0) return id;
  return -1;
}

}  // namespace

HfTokenizerFile read_hf_tokenizer_file(const std::string& path) {
  fs::path file(path);
  if (fs::is_directory(file)) file /= "tokenizer.json";
  HfTokenizerFile out;
  out.path = file.string();
  json root = parse_file(file, true);
  Reader(root, out).read();
  out.document_marker_id = document_marker(parse_file(file.parent_path() / "tokenizer_config.json", false), out.added);
  return out;
}

}  // namespace pt
