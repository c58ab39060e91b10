#include "core/data/prepare_inputs.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/common/error.h"

namespace pt {

namespace fs = std::filesystem;

namespace {

bool is_hidden(const fs::path& p) { return p.filename().string().starts_with('.'); }

InputFile describe(const fs::path& path) {
  InputFile f;
  f.path = path;
  const std::string name = path.filename().string();
  f.gzip = name.ends_with(".gz");
  f.jsonl = name.ends_with(".jsonl") || name.ends_with(".jsonl.gz");
  std::error_code ec;
  f.disk_bytes = fs::file_size(path, ec);
  if (ec) throw RuntimeError("prepare: cannot stat " + path.string() + ": " + ec.message());
  return f;
}

// The documents under one directory, sorted; hidden entries and the output directory are skipped.
std::vector<fs::path> walk_directory(const fs::path& dir, const fs::path& out_dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  while (!ec && it != end) {
    // An entry we cannot stat (a dangling link) is neither a directory nor a file: skipped.
    std::error_code ignored;
    if (it->is_directory(ignored)) {
      if (is_hidden(it->path()) || fs::equivalent(it->path(), out_dir, ignored)) it.disable_recursion_pending();
    } else if (!is_hidden(it->path()) && it->is_regular_file(ignored)) {
      found.push_back(it->path());
    }
    it.increment(ec);
  }
  if (ec) throw RuntimeError("prepare: cannot read directory " + dir.string() + ": " + ec.message());
  std::sort(found.begin(), found.end());
  return found;
}

// A file's bytes as they are, or inflated when it is gzip.
class ByteReader {
 public:
  explicit ByteReader(const InputFile& f) : path_(f.path.string()) {
    if (f.gzip) {
      gz_ = gzopen(path_.c_str(), "rb");
      if (gz_ == nullptr) throw RuntimeError("prepare: cannot open " + path_ + ": " + std::strerror(errno));
      gzbuffer(gz_, 1 << 18);
    } else {
      plain_.open(f.path, std::ios::binary);
      if (!plain_) throw RuntimeError("prepare: cannot open " + path_ + ": " + std::strerror(errno));
    }
  }
  ~ByteReader() {
    if (gz_ != nullptr) gzclose(gz_);
  }
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  // Up to n bytes; 0 at the end.
  size_t read(char* buf, size_t n) {
    if (gz_ != nullptr) {
      const int got = gzread(gz_, buf, static_cast<unsigned>(n));
      if (got < 0) {
        int code = 0;
        throw RuntimeError("prepare: " + path_ + ": cannot decompress: " + gzerror(gz_, &code));
      }
      // zlib reports a file cut short only through gzerror, with a count of 0 or less than asked.
      int code = Z_OK;
      gzerror(gz_, &code);
      if (code != Z_OK && code != Z_STREAM_END)
        throw RuntimeError("prepare: " + path_ + ": cannot decompress: " + gzerror(gz_, &code) +
                           " (truncated or corrupt gzip file?)");
      return static_cast<size_t>(got);
    }
    plain_.read(buf, static_cast<std::streamsize>(n));
    if (plain_.bad()) throw RuntimeError("prepare: read error in " + path_);
    return static_cast<size_t>(plain_.gcount());
  }

  // Bytes consumed from the file on disk so far.
  uint64_t disk_offset() {
    if (gz_ != nullptr) return static_cast<uint64_t>(std::max<z_off_t>(gzoffset(gz_), 0));
    const auto pos = plain_.tellg();
    return pos < 0 ? 0 : static_cast<uint64_t>(pos);
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  std::ifstream plain_;
};

constexpr size_t kReadBlock = 1 << 20;

DocumentCount read_text(const InputFile& f, ByteReader& in, DocumentSink& sink,
                        const std::function<void(uint64_t)>& on_disk) {
  std::vector<char> block(kReadBlock);
  DocumentCount count{1, 0};
  sink.begin_document();
  while (const size_t n = in.read(block.data(), block.size())) {
    sink.text(std::string_view(block.data(), n));
    count.text_bytes += n;
    if (on_disk) on_disk(in.disk_offset());
  }
  sink.end_document();
  return count;
}

// One JSONL line: a document, or nothing for a blank line.
void read_jsonl_line(std::string_view line, const std::string& where, DocumentSink& sink, DocumentCount& count) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) return;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError("prepare: " + where + ": not valid JSON: " + e.what());
  }
  const auto text = doc.is_object() ? doc.find("text") : doc.end();
  if (!doc.is_object() || text == doc.end() || !text->is_string())
    throw RuntimeError("prepare: " + where + ": expected a JSON object with a string field \"text\"");
  const auto& s = text->get_ref<const std::string&>();
  sink.begin_document();
  sink.text(s);
  sink.end_document();
  ++count.documents;
  count.text_bytes += s.size();
}

DocumentCount read_jsonl(const InputFile& f, ByteReader& in, DocumentSink& sink,
                         const std::function<void(uint64_t)>& on_disk) {
  std::vector<char> block(kReadBlock);
  std::string partial;  // a line cut by the end of a block
  DocumentCount count;
  uint64_t line_no = 0;
  auto where = [&] { return f.path.string() + ":" + std::to_string(line_no); };
  while (const size_t n = in.read(block.data(), block.size())) {
    std::string_view data(block.data(), n);
    for (size_t nl; (nl = data.find('\n')) != std::string_view::npos; data.remove_prefix(nl + 1)) {
      ++line_no;
      if (partial.empty()) {
        read_jsonl_line(data.substr(0, nl), where(), sink, count);
      } else {
        partial.append(data.substr(0, nl));
        read_jsonl_line(partial, where(), sink, count);
        partial.clear();
      }
    }
    partial.append(data);
    if (on_disk) on_disk(in.disk_offset());
  }
  if (!partial.empty()) {  // a last line without '\n'
    ++line_no;
    read_jsonl_line(partial, where(), sink, count);
  }
  return count;
}

}  // namespace

std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs, const fs::path& out_dir) {
  std::vector<InputFile> files;
  for (const auto& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    if (!fs::exists(st)) throw ConfigError("prepare: input '" + input + "' does not exist");
    if (fs::is_directory(st)) {
      if (fs::equivalent(input, out_dir, ec))
        throw ConfigError("prepare: input '" + input + "' is the output directory; write the shards elsewhere");
      for (const auto& p : walk_directory(input, out_dir)) files.push_back(describe(p));
    } else if (fs::is_regular_file(st)) {
      files.push_back(describe(input));
    } else {
      throw ConfigError("prepare: input '" + input + "' is neither a regular file nor a directory");
    }
  }
  return files;
}

DocumentCount read_documents(const InputFile& file, DocumentSink& sink, const std::function<void(uint64_t)>& on_disk) {
  ByteReader in(file);
  return file.jsonl ? read_jsonl(file, in, sink, on_disk) : read_text(file, in, sink, on_disk);
}

bool count_from_size(const InputFile& file, DocumentCount& count) {
  if (file.jsonl || file.gzip) return false;
  count = {1, file.disk_bytes};
  return true;
}

}  // namespace pt
