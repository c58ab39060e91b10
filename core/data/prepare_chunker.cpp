#include "core/data/prepare_chunker.h"

#include <algorithm>

namespace pt {

namespace {
// Bounds an item's piece list when documents are tiny or empty.
constexpr size_t kMaxPieces = 1 << 16;
}  // namespace

Chunker::Chunker(const Tokenizer& tok, size_t chunk_bytes, const uint64_t& disk_done,
                 std::function<void(WorkItem&&)> emit)
    : tok_(tok),
      chunk_bytes_(std::max<size_t>(chunk_bytes, 1)),
      prefix_units_(tok.document_prefix().size()),
      suffix_units_(tok.document_suffix().size()),
      disk_done_(disk_done),
      emit_(std::move(emit)) {}

void Chunker::begin_document() {
  item_.pieces.push_back({item_.text.size(), item_.text.size(), true, false});
  scan_from_ = 0;
}

void Chunker::text(std::string_view bytes) {
  item_.text.append(bytes);
  item_.pieces.back().end = item_.text.size();
  cut_long_document();
}

void Chunker::end_document() {
  item_.pieces.back().ends_document = true;
  // A document boundary is always a safe cut.
  if (item_.text.size() >= chunk_bytes_ || item_.pieces.size() >= kMaxPieces) emit_item();
}

void Chunker::finish() {
  if (!item_.pieces.empty()) emit_item();
}

void Chunker::cut_long_document() {
  while (item_.text.size() >= chunk_bytes_) {
    WorkItem::Piece& open = item_.pieces.back();
    const std::string_view doc = std::string_view(item_.text).substr(open.begin);
    // Aim for an item of chunk_bytes; never cut at the piece's first byte (that would leave it empty).
    const size_t aim = chunk_bytes_ > open.begin ? chunk_bytes_ - open.begin : 1;
    const size_t p = tok_.next_cut(doc, std::max({scan_from_, aim, size_t{1}}));
    if (p == std::string_view::npos) {
      // No cut yet: look again from here when more of the document arrives.
      scan_from_ = std::max<size_t>(doc.size(), 1);
      return;
    }
    std::string rest(doc.substr(p));
    item_.text.resize(open.begin + p);
    open.end = item_.text.size();
    emit_item();
    item_.text = std::move(rest);
    item_.pieces.push_back({0, item_.text.size(), false, false});
    scan_from_ = 0;
  }
}

void Chunker::emit_item() {
  uint64_t units = item_.text.size();
  for (const auto& p : item_.pieces)
    units += (p.starts_document ? prefix_units_ : 0) + (p.ends_document ? suffix_units_ : 0);
  item_.first_unit = next_unit_;
  item_.disk_done = disk_done_;
  next_unit_ += units;
  emit_(std::move(item_));
  item_ = WorkItem{};
}

}  // namespace pt
