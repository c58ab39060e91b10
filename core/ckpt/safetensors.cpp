#include "core/ckpt/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/ckpt/llmc_model_file.h"
#include "core/common/error.h"

namespace pt::ckpt {

// The format is little-endian and so are the buffers written and read here as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses larger headers; a corrupt length must not make us
// allocate gigabytes before the JSON is even looked at.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// IEEE half -> float, exact (every half is a float).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));        // inf, NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));  // normal
  const float v = std::ldexp(static_cast<float>(mant), -24);                              // subnormal, zero
  return sign ? -v : v;
}

uint64_t shape_numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string tensor_text(const StTensor& t) {
  return t.name + " [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
}

// One header entry, checked field by field; `fail` prefixes the file and the tensor.
StTensor parse_entry(const std::string& name, const nlohmann::json& e, uint64_t data_bytes, const std::string& path) {
  auto fail = [&](const std::string& why) -> RuntimeError {
    return RuntimeError(path + ": tensor " + name + ": " + why);
  };
  if (!e.is_object()) throw fail("its header entry is not an object: " + e.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) throw fail(std::string("its header entry has no \"") + key + "\"");
  StTensor t;
  t.name = name;
  if (!e["dtype"].is_string()) throw fail("dtype " + e["dtype"].dump() + " is not a string");
  t.dtype = e["dtype"].get<std::string>();
  const size_t elem = st_dtype_bytes(t.dtype);
  if (elem == 0) throw fail("unknown dtype \"" + t.dtype + "\"");
  const nlohmann::json& shape = e["shape"];
  if (!shape.is_array()) throw fail("shape " + shape.dump() + " is not a list");
  uint64_t numel = 1;
  for (const auto& d : shape) {
    // Non-negative integers parse as unsigned; anything else is no dimension.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      throw fail("shape " + shape.dump() + " has a dimension that is not a whole number >= 0");
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    if (__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel)) throw fail("shape " + shape.dump() + " overflows");
  }
  const nlohmann::json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw fail("data_offsets " + off.dump() + " is not [begin, end] with whole numbers >= 0");
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  if (t.begin > t.end || t.end > data_bytes)
    throw fail("data_offsets " + off.dump() + " are out of range: the data section holds " +
               std::to_string(data_bytes) + " bytes");
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, uint64_t(elem), &want) || t.end - t.begin != want)
    throw fail("data_offsets " + off.dump() + " hold " + std::to_string(t.end - t.begin) + " bytes, but shape " +
               shape_text(t.shape) + " of " + t.dtype + " needs " + std::to_string(numel) + " x " +
               std::to_string(elem));
  return t;
}

}  // namespace

uint64_t StTensor::numel() const { return shape_numel(shape); }

size_t st_dtype_bytes(const std::string& dtype) {
  // Every dtype the format defines, so a valid file of other dtypes still parses (and only
  // the tensor we cannot convert is refused, by name).
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string safetensors_header(std::vector<StTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (StTensor& t : tensors) {
    const size_t elem = st_dtype_bytes(t.dtype);
    check(elem > 0, "safetensors_header: unknown dtype " + t.dtype + " for " + t.name);
    check(t.name != "__metadata__" && !j.contains(t.name), "safetensors_header: duplicate tensor name " + t.name);
    t.begin = offset;
    t.end = offset + t.numel() * elem;
    offset = t.end;
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  j["__metadata__"] = metadata;
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

// ---- writer -------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<StTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), tensors_(std::move(tensors)) {
  const std::string header = safetensors_header(tensors_, metadata);
  out_ = std::make_unique<FileWriter>(tmp_);
  out_->write(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (committed_) return;
  out_.reset();  // closes without syncing
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  check(next_ < tensors_.size() && tensors_[next_].name == name,
        "SafetensorsWriter: " + name + " written out of the declared order");
  const StTensor& t = tensors_[next_];
  check(bytes == t.end - t.begin, "SafetensorsWriter: " + name + " is " + std::to_string(bytes) + " bytes, declared " +
                                      std::to_string(t.end - t.begin));
  out_->write(data, bytes);
  next_++;
}

void SafetensorsWriter::commit() {
  check(next_ == tensors_.size(), "SafetensorsWriter: committed before " +
                                      (next_ < tensors_.size() ? tensors_[next_].name : std::string()) +
                                      " was written");
  out_->sync_and_close();
  rename_path(tmp_, path_);
  committed_ = true;
  const std::string parent = std::filesystem::path(path_).parent_path().string();
  fsync_dir(parent.empty() ? "." : parent);
}

// ---- reader -------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : file_(std::move(path)) {
  const std::string& p = file_.path();
  const uint64_t size = file_.size();
  if (size < 8)
    throw RuntimeError(p + " is " + std::to_string(size) + " bytes: truncated, not even a safetensors header length");
  uint64_t n = 0;
  file_.read(0, &n, 8);
  if (n > size - 8)
    throw RuntimeError(p + ": the safetensors header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(size) + " bytes): truncated or not a safetensors file");
  if (n > kMaxHeaderBytes)
    throw RuntimeError(p + ": the safetensors header length " + std::to_string(n) + " is over the format's limit of " +
                       std::to_string(kMaxHeaderBytes) + " bytes");
  std::string text(n, '\0');
  file_.read(8, text.data(), n);
  data_start_ = 8 + n;
  const uint64_t data_bytes = size - data_start_;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(p + ": the safetensors header is not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw RuntimeError(p + ": the safetensors header is not a JSON object");
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) throw RuntimeError(p + ": __metadata__ is not an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) throw RuntimeError(p + ": __metadata__ entry \"" + k + "\" is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(name, e, data_bytes, p));
  }

  // Packed: sorted by start, each beginning where the previous ends, the last at the end.
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const StTensor* prev = nullptr;
  for (const StTensor& t : tensors_) {
    if (t.begin < at) throw RuntimeError(p + ": tensors " + tensor_text(*prev) + " and " + tensor_text(t) + " overlap");
    if (t.begin > at)
      throw RuntimeError(p + ": " + std::to_string(t.begin - at) + " bytes before tensor " + tensor_text(t) +
                         " belong to no tensor (safetensors data is packed)");
    at = t.end;
    prev = &t;
  }
  if (at != data_bytes)
    throw RuntimeError(p + ": the tensors end at data byte " + std::to_string(at) + " but the file has " +
                       std::to_string(data_bytes) + " (" + std::to_string(data_bytes - at) +
                       " bytes belong to no tensor)");
  for (size_t i = 0; i < tensors_.size(); i++) index_[tensors_[i].name] = i;
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  const StTensor* t = find(name);
  if (!t) throw RuntimeError(path() + " has no tensor " + name);
  if (t->shape != shape)
    throw RuntimeError(path() + ": tensor " + name + " has shape " + shape_text(t->shape) + ", expected " +
                       shape_text(shape));
  std::vector<float> out(t->numel());
  const uint64_t at = data_start_ + t->begin;
  if (t->dtype == kStF32) {
    file_.read(at, out.data(), out.size() * sizeof(float));
  } else if (t->dtype == kStBf16 || t->dtype == kStF16) {
    std::vector<uint16_t> half(out.size());
    file_.read(at, half.data(), half.size() * sizeof(uint16_t));
    const bool bf16 = t->dtype == kStBf16;
    for (size_t i = 0; i < half.size(); i++) out[i] = bf16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
  } else {
    throw RuntimeError(path() + ": tensor " + name + " is " + t->dtype + "; picotrain reads F32, BF16 and F16");
  }
  return out;
}

}  // namespace pt::ckpt
