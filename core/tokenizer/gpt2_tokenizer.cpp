#include "core/tokenizer/gpt2_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/common/error.h"

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

}  // namespace

// The per-thread half: the regex state and the piece encoder.
class Gpt2Encoder final : public TokenEncoder {
 public:
  explicit Gpt2Encoder(const Gpt2Tokenizer& tok) : splitter_(tok.pattern_), pieces_(*tok.model_) {}

  void encode(std::string_view text, std::vector<int32_t>& ids, std::vector<size_t>* starts) override {
    splitter_.reset(text);
    size_t begin = 0, end = 0;
    while (splitter_.next(begin, end)) {
      const size_t before = ids.size();
      pieces_.encode(text.substr(begin, end - begin), ids);
      if (starts) starts->insert(starts->end(), ids.size() - before, begin);
    }
  }

 private:
  RegexSplitter splitter_;
  BpePieceEncoder pieces_;
};

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : dir_(dir) {
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
  model_ = std::make_unique<BpeModel>(enc, "GPT-2 tokenizer: " + enc_path);
  const std::optional<int32_t> eot = model_->find(kEndOfText);
  if (!eot) throw ConfigError("GPT-2 tokenizer: " + enc_path + " has no " + kEndOfText + " token");
  eot_ = *eot;

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, rank = line order.
  std::istringstream lines(bpe_text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::string where = "GPT-2 tokenizer: " + bpe_path + ":" + std::to_string(line_no) + ": ";
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw ConfigError(where + "expected two tokens separated by one space, got \"" + line + "\"");
    model_->add_merge(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1), where);
  }
  if (model_->merge_count() == 0) throw ConfigError("GPT-2 tokenizer: " + bpe_path + " holds no merges");
}

std::unique_ptr<TokenEncoder> Gpt2Tokenizer::encoder() const { return std::make_unique<Gpt2Encoder>(*this); }

}  // namespace pt
