// `prepare`'s inputs: which files are read, in which order, and the documents in each.
//
// Inputs are files and directories. Directories are walked recursively, files in sorted
// (bytewise) path order; hidden files and directories (name starting with '.') are skipped, and so
// is the output directory, so a re-run never reads back its own shards. A file's name says how to
// read it:
//   *.jsonl, *.jsonl.gz  JSON Lines: one document per line, the string field "text" of a JSON
//                        object (other fields are ignored; blank lines are skipped)
//   *.gz                 gzip-compressed text: one document
//   anything else        text: one document (bytes as they are; no encoding is assumed)
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pt {

struct InputFile {
  std::filesystem::path path;
  bool jsonl = false;
  bool gzip = false;
  uint64_t disk_bytes = 0;  // size on disk (compressed for .gz)
};

// Every input file, in order: explicit files as given, directories expanded. Throws ConfigError for
// a missing input or the output directory given as input, RuntimeError for I/O failures.
std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs, const std::filesystem::path& out_dir);

// Receives documents as they are read: begin, any number of text pieces, end.
class DocumentSink {
 public:
  virtual ~DocumentSink() = default;
  virtual void begin_document() = 0;
  virtual void text(std::string_view bytes) = 0;
  virtual void end_document() = 0;
};

// What one file holds.
struct DocumentCount {
  uint64_t documents = 0;
  uint64_t text_bytes = 0;
  bool operator==(const DocumentCount&) const = default;
};

// Reads the documents of `file` into `sink` and returns their count. `on_disk` is called with the
// number of bytes read from disk each time it grows (for progress). Throws RuntimeError naming the
// file (and line, for JSONL) for unreadable, corrupt or malformed input.
DocumentCount read_documents(const InputFile& file, DocumentSink& sink,
                             const std::function<void(uint64_t disk_bytes)>& on_disk = {});

// The count without reading, when the file size alone gives it (a plain text file); else false.
bool count_from_size(const InputFile& file, DocumentCount& count);

}  // namespace pt
