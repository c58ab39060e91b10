#include "core/tokenizer/gpt2_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/common/error.h"
#include "core/tokenizer/byte_unicode.h"
#include "core/tokenizer/piece_cache.h"

namespace pt {

namespace fs = std::filesystem;

namespace {

std::string read_tokenizer_file(const fs::path& dir, const char* name) {
  const fs::path path = dir / name;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError("GPT-2 tokenizer: cannot read " + path.string() +
                      "; fetch encoder.json and vocab.bpe with scripts/get_data.sh --tokenizer (into data/gpt2/), "
                      "or pass --tokenizer-dir DIR with a folder that holds them");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A hash that also takes string_view, so that lookups need not build a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

// The per-thread half: the regex state, the BPE scratch space and the piece cache.
class Gpt2Encoder final : public TokenEncoder {
 public:
  explicit Gpt2Encoder(const Gpt2Tokenizer& tok) : tok_(tok), splitter_(tok.pattern_) {}

  void encode(std::string_view text, std::vector<int32_t>& ids, std::vector<size_t>* starts) override {
    splitter_.reset(text);
    size_t begin = 0, end = 0;
    while (splitter_.next(begin, end)) {
      const size_t before = ids.size();
      encode_piece(text.substr(begin, end - begin), ids);
      if (starts) starts->insert(starts->end(), ids.size() - before, begin);
    }
  }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) {
    if (piece.size() == 1) {  // nothing to merge
      ids.push_back(tok_.byte_ids_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (const std::span<const int32_t> hit = cache_.find(piece); !hit.empty()) {
      ids.insert(ids.end(), hit.begin(), hit.end());
      return;
    }
    symbols_.clear();
    for (char c : piece) symbols_.push_back(tok_.byte_ids_[static_cast<unsigned char>(c)]);
    bpe_merge(tok_.merges_, symbols_, scratch_);
    ids.insert(ids.end(), symbols_.begin(), symbols_.end());
    cache_.insert(piece, symbols_);
  }

  const Gpt2Tokenizer& tok_;
  Gpt2Splitter splitter_;
  BpeScratch scratch_;
  std::vector<int32_t> symbols_;
  PieceCache cache_;
};

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) {
  const fs::path root(dir);
  const std::string enc_path = (root / "encoder.json").string();
  const std::string bpe_path = (root / "vocab.bpe").string();
  const std::string enc_text = read_tokenizer_file(root, "encoder.json");
  const std::string bpe_text = read_tokenizer_file(root, "vocab.bpe");

  // encoder.json: {"spelling": id, ...} with ids exactly 0..n-1.
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("GPT-2 tokenizer: " + enc_path + " is not valid JSON: " + e.what());
  }
  if (!enc.is_object() || enc.empty())
    throw ConfigError("GPT-2 tokenizer: " + enc_path + " must be a JSON object mapping tokens to ids");
  const size_t n = enc.size();
  id_bytes_.assign(n, {});
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_to_id;
  bytes_to_id.reserve(n);
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    const std::string& spelled = it.key();
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= int64_t(n))
      throw ConfigError("GPT-2 tokenizer: " + enc_path + ": the id of \"" + spelled + "\" must be an integer in [0, " +
                        std::to_string(n) + ")");
    const auto id = it.value().get<int32_t>();
    if (seen[id]) throw ConfigError("GPT-2 tokenizer: " + enc_path + ": id " + std::to_string(id) + " is used twice");
    seen[id] = true;
    // Special tokens such as <|endoftext|> are plain printable ASCII, which maps to itself.
    std::optional<std::string> bytes = gpt2_unicode_to_bytes(spelled);
    if (!bytes)
      throw ConfigError("GPT-2 tokenizer: " + enc_path + ": \"" + spelled +
                        "\" is not spelled in GPT-2's byte characters");
    id_bytes_[id] = *bytes;
    bytes_to_id.emplace(*bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    auto it = bytes_to_id.find(std::string_view(&byte, 1));
    if (it == bytes_to_id.end())
      throw ConfigError("GPT-2 tokenizer: " + enc_path + " has no token for byte " + std::to_string(b));
    byte_ids_[b] = it->second;
  }
  auto eot = bytes_to_id.find(std::string_view(kEndOfText));
  if (eot == bytes_to_id.end()) throw ConfigError("GPT-2 tokenizer: " + enc_path + " has no " + kEndOfText + " token");
  eot_ = eot->second;

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, rank = line order.
  std::istringstream lines(bpe_text);
  std::string line;
  int line_no = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    auto where = [&] { return "GPT-2 tokenizer: " + bpe_path + ":" + std::to_string(line_no) + ": "; };
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw ConfigError(where() + "expected two tokens separated by one space, got \"" + line + "\"");
    auto id_of = [&](std::string_view spelled) {
      std::optional<std::string> bytes = gpt2_unicode_to_bytes(spelled);
      auto it = bytes ? bytes_to_id.find(*bytes) : bytes_to_id.end();
      if (it == bytes_to_id.end())
        throw ConfigError(where() + "\"" + std::string(spelled) + "\" is not a token of encoder.json");
      return it->second;
    };
    const std::string_view left = std::string_view(line).substr(0, space);
    const std::string_view right = std::string_view(line).substr(space + 1);
    merges_.add(id_of(left), id_of(right), id_of(line.substr(0, space) + line.substr(space + 1)), rank++);
  }
  if (merges_.size() == 0) throw ConfigError("GPT-2 tokenizer: " + bpe_path + " holds no merges");
}

std::unique_ptr<TokenEncoder> Gpt2Tokenizer::encoder() const { return std::make_unique<Gpt2Encoder>(*this); }

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw RuntimeError("GPT-2 tokenizer: cannot decode token " + std::to_string(id) + " (vocabulary " +
                         std::to_string(vocab_size()) + ")");
    out += id_bytes_[id];
  }
  return out;
}

}  // namespace pt
