// safetensors: Hugging Face's tensor file, the weights of a transformers model folder.
//
// Layout: an 8-byte little-endian unsigned header length N; N bytes of JSON,
//   {"name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt"}}
// padded with spaces so that 8 + N is a multiple of 8 (the data then starts aligned); then the
// data: each tensor's raw little-endian elements, row-major, at [begin, end) counted from the
// end of the header. Tensors are packed: sorted by begin, the first starts at 0, each starts
// where the previous ends and the last ends at the end of the file (the reference library
// refuses anything else, so this reader does too).
//
// The writer writes F32 and BF16 (what picotrain exports). The reader validates the whole
// header before any data is read and converts F32, BF16 and F16 to fp32 (exact); every failure
// is a RuntimeError naming the file and, where there is one, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ckpt/durable_io.h"

namespace pt::ckpt {

inline constexpr const char* kStF32 = "F32";
inline constexpr const char* kStBf16 = "BF16";
inline constexpr const char* kStF16 = "F16";

struct StTensor {
  std::string name;
  std::string dtype = kStF32;  // a safetensors dtype name: F32, BF16, F16, I64, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes, relative to the end of the header
  uint64_t numel() const;
};

// Bytes per element of a safetensors dtype name; 0 when the format has no such dtype.
size_t st_dtype_bytes(const std::string& dtype);

// "[2, 3]": shapes in messages.
std::string shape_text(const std::vector<int64_t>& shape);

// The header for `tensors` in the given order, packed (their begin/end are filled in), with
// `metadata` as __metadata__: the JSON padded with spaces to make 8 + its length a multiple of
// 8, preceded by that length (8 bytes, little-endian). Exposed for tests that check the bytes.
std::string safetensors_header(std::vector<StTensor>& tensors, const std::map<std::string, std::string>& metadata);

// Writes one file the way checkpoint files are written: to path + ".tmp", then fsync, rename
// over `path` and fsync of the directory, so a reader sees the old file or the whole new one.
// The header is written first, which is why every tensor is declared up front; then each
// tensor's bytes, in declared order. Destroyed before commit(): the temporary file is removed.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<StTensor> tensors,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor's data: `name` and `bytes` must be its own (a mismatch is a bug).
  void write(const std::string& name, const void* data, size_t bytes);
  void commit();  // every tensor written; makes the file durable under its name
  const std::vector<StTensor>& tensors() const { return tensors_; }

 private:
  std::string path_, tmp_;
  std::vector<StTensor> tensors_;
  std::unique_ptr<FileWriter> out_;
  size_t next_ = 0;
  bool committed_ = false;
};

// Reads one file: the constructor validates the header (length, JSON, dtypes, shapes, offsets,
// packing) against the file's size; read_f32 then reads a tensor, checking it is there and has
// the shape the caller's model expects.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return file_.path(); }
  const std::vector<StTensor>& tensors() const { return tensors_; }  // in data order
  const StTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t data_start() const { return data_start_; }  // 8 + header length

  // Tensor `name` as fp32 (F32, BF16, F16 convert exactly). Throws when the file has no such
  // tensor, or its shape is not `shape`.
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  FileReader file_;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  uint64_t data_start_ = 0;
};

}  // namespace pt::ckpt
