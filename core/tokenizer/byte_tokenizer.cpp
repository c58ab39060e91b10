#include "core/tokenizer/byte_tokenizer.h"

#include "core/common/error.h"

namespace pt {

namespace {

class ByteEncoder final : public TokenEncoder {
 public:
  void encode(std::string_view text, std::vector<int32_t>& ids, std::vector<size_t>* starts) override {
    for (size_t i = 0; i < text.size(); ++i) {
      ids.push_back(static_cast<unsigned char>(text[i]));
      if (starts) starts->push_back(i);
    }
  }
};

}  // namespace

std::unique_ptr<TokenEncoder> ByteTokenizer::encoder() const { return std::make_unique<ByteEncoder>(); }

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id > 255) throw RuntimeError("bytes tokenizer: cannot decode token " + std::to_string(id) + " (vocabulary 256)");
    out.push_back(static_cast<char>(id));
  }
  return out;
}

std::vector<int32_t> ByteTokenizer::document_suffix() const {
  std::vector<int32_t> ids;
  for (const char* p = kByteDocumentSeparator; *p; ++p) ids.push_back(static_cast<unsigned char>(*p));
  return ids;
}

}  // namespace pt
