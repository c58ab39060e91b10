#include "core/tokenizer/hf_tokenizer.h"

#include "core/common/error.h"
#include "core/tokenizer/hf_tokenizer_json.h"

namespace pt {

// The per-thread half: one regex state per stage and the piece encoder.
class HfEncoder final : public TokenEncoder {
 public:
  explicit HfEncoder(const HfTokenizer& tok) : tok_(tok), pieces_(*tok.model_) {
    for (const auto& s : tok.stages_) splitters_.push_back(std::make_unique<RegexSplitter>(*s.pattern));
  }

  void encode(std::string_view text, std::vector<int32_t>& ids, std::vector<size_t>* starts) override {
    text_ = text;
    ids_ = &ids;
    starts_ = starts;
    for (size_t pos = 0; pos < text.size();) {
      const std::optional<AddedTokens::Match> m = tok_.added_.find(text, pos);
      const size_t end = m ? m->begin : text.size();
      if (end > pos) split(0, pos, end);
      if (!m) break;
      ids.push_back(m->id);
      if (starts) starts->push_back(m->begin);
      pos = m->end;
    }
  }

 private:
  // Cuts text_[begin, end) with stage `stage` and the ones after it; encodes the final pieces.
  void split(size_t stage, size_t begin, size_t end) {
    if (stage == splitters_.size()) {
      const size_t before = ids_->size();
      pieces_.encode(text_.substr(begin, end - begin), *ids_);
      if (starts_) starts_->insert(starts_->end(), ids_->size() - before, begin);
      return;
    }
    const HfTokenizer::Stage& s = tok_.stages_[stage];
    RegexSplitter& splitter = *splitters_[stage];
    splitter.reset(text_.substr(begin, end - begin));
    size_t b = 0, e = 0;
    bool matched = false;
    while (splitter.next(b, e, matched))
      if (matched ? s.keep_matches : s.keep_gaps) split(stage + 1, begin + b, begin + e);
  }

  const HfTokenizer& tok_;
  std::vector<std::unique_ptr<RegexSplitter>> splitters_;
  BpePieceEncoder pieces_;
  std::string_view text_;
  std::vector<int32_t>* ids_ = nullptr;
  std::vector<size_t>* starts_ = nullptr;
};

HfTokenizer::HfTokenizer(const std::string& path, std::string name) : name_(std::move(name)) {
  HfTokenizerFile f = read_hf_tokenizer_file(path);
  path_ = f.path;
  const std::string where = "tokenizer.json reader: " + f.path;
  model_ = std::make_unique<BpeModel>(f.vocab, where + ": model.vocab");
  model_->set_ignore_merges(f.ignore_merges);
  for (const auto& [left, right] : f.merges) model_->add_merge(left, right, where + ": model.merges: ");
  for (const auto& t : f.added) {
    model_->set_token(t.id, t.content);
    added_.add(t.content, t.id);
  }
  for (const auto& s : f.splits)
    stages_.push_back({std::make_unique<RegexPattern>(s.pattern, where), s.keep_matches, s.keep_gaps});
  // Only the first stage decides where text may be cut (the later ones work inside its pieces),
  // and only when it keeps every byte and no added token can straddle the cut.
  if (!stages_.empty() && f.splits[0].keep_matches && f.splits[0].keep_gaps && !added_.any_holds_ascii_space())
    cut_ = cut_rule_for(f.splits[0].pattern);
  marker_ = f.document_marker_id;
}

std::vector<int32_t> HfTokenizer::document_prefix() const {
  if (marker_ < 0)
    throw ConfigError("tokenizer " + name_ + " (" + path_ +
                      ") names no token to start documents with: give tokenizer_config.json a bos_token that is one "
                      "of its added_tokens");
  return {marker_};
}

std::unique_ptr<TokenEncoder> HfTokenizer::encoder() const { return std::make_unique<HfEncoder>(*this); }

}  // namespace pt
