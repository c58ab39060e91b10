// Cuts the document stream into work items of about chunk_bytes of text for parallel encoding.
//
// Small documents are batched into one item; a long one is cut where its tokenizer says a cut
// cannot change the tokens (Tokenizer::next_cut), so the tokens of the items, concatenated, are
// exactly those of the documents: the output does not depend on chunk_bytes or the thread count.
//
// Every item knows its place in the stream of units (see prepare.h: a unit is a byte of text or an
// id the tokenizer puts around a document), which is how the val split is found inside items.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/data/prepare_inputs.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

struct WorkItem {
  // A run of one document's text; begin/end are offsets into `text`.
  struct Piece {
    size_t begin = 0, end = 0;
    bool starts_document = false;  // the document's prefix ids come before it
    bool ends_document = false;    // and its suffix ids after it
  };
  uint64_t first_unit = 0;  // the stream position of the item's first unit
  uint64_t disk_done = 0;   // input bytes read from disk when the item was cut (for progress)
  std::string text;
  std::vector<Piece> pieces;
};

class Chunker final : public DocumentSink {
 public:
  // `disk_done` is read when an item is cut; `emit` receives each item in stream order.
  Chunker(const Tokenizer& tok, size_t chunk_bytes, const uint64_t& disk_done, std::function<void(WorkItem&&)> emit);

  void begin_document() override;
  void text(std::string_view bytes) override;
  void end_document() override;
  // Emits what is left. Call once, after the last document.
  void finish();

 private:
  void cut_long_document();
  void emit_item();

  const Tokenizer& tok_;
  const size_t chunk_bytes_;
  const uint64_t prefix_units_, suffix_units_;
  const uint64_t& disk_done_;
  std::function<void(WorkItem&&)> emit_;
  WorkItem item_;
  uint64_t next_unit_ = 0;
  size_t scan_from_ = 0;  // where to look for the next cut, relative to the open piece
};

}  // namespace pt
