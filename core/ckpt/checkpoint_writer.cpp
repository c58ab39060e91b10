#include "core/ckpt/checkpoint_writer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checksum.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

CheckpointWriter::CheckpointWriter(std::string dir, int step) : dir_(std::move(dir)), step_(step) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw RuntimeError("cannot create the checkpoint directory " + dir_ + ": " + ec.message());
  const std::string name = step_dir_name(step);
  tmp_ = (fs::path(dir_) / (".tmp_" + name + "_" + std::to_string(::getpid()))).string();
  final_ = (fs::path(dir_) / name).string();
  remove_tree(tmp_);  // a leftover of an earlier process that had our pid
  make_dir(tmp_);
}

CheckpointWriter::CheckpointWriter(std::string dir, int step, std::string temp_dir)
    : dir_(std::move(dir)), tmp_(std::move(temp_dir)), step_(step) {
  final_ = (fs::path(dir_) / step_dir_name(step)).string();
}

Manifest CheckpointWriter::finish_part() {
  Manifest part;
  for (auto& [name, f] : files_) {
    part.files.push_back(FileEntry{name, f->offset()});
    f->sync_and_close();
  }
  files_.clear();
  part.tensors = tensors_;
  return part;
}

void CheckpointWriter::merge_part(const Manifest& part) {
  merged_files_.insert(merged_files_.end(), part.files.begin(), part.files.end());
  for (const TensorEntry& other : part.tensors) {
    TensorEntry* t = nullptr;
    for (auto& e : tensors_)
      if (e.name == other.name) t = &e;
    if (!t) {
      tensors_.push_back(TensorEntry{other.name, other.shape, other.dtype, {}});
      t = &tensors_.back();
    }
    check(t->shape == other.shape, "checkpoint tensor " + other.name + " was given two different shapes");
    t->chunks.insert(t->chunks.end(), other.chunks.begin(), other.chunks.end());
  }
}

void CheckpointWriter::add_chunk(const std::string& name, const std::vector<int64_t>& shape, const std::string& file,
                                 uint64_t begin, const float* data, size_t n) {
  add_strided_chunk(name, shape, file, begin, 0, 0, data, n);
}

void CheckpointWriter::add_strided_chunk(const std::string& name, const std::vector<int64_t>& shape,
                                         const std::string& file, uint64_t begin, uint64_t run, uint64_t stride,
                                         const float* data, size_t n) {
  check(n > 0, "checkpoint chunk of " + name + " is empty");
  if (run == n) run = 0;  // one run: written as the plain range it is
  check(run == 0 || (n % run == 0 && stride >= run),
        "checkpoint chunk of " + name + ": " + std::to_string(n) + " elements are not runs of " +
            std::to_string(run) + " every " + std::to_string(stride));
  auto& f = files_[file];
  if (!f) f = std::make_unique<FileWriter>((fs::path(tmp_) / file).string());
  TensorEntry* t = nullptr;
  for (auto& e : tensors_)
    if (e.name == name) t = &e;
  if (!t) {
    tensors_.push_back(TensorEntry{name, shape, "f32", {}});
    t = &tensors_.back();
  }
  check(t->shape == shape, "checkpoint tensor " + name + " was given two different shapes");
  Chunk c;
  c.file = file;
  c.offset = f->offset();
  c.bytes = n * sizeof(float);
  c.begin = begin;
  c.end = run == 0 ? begin + n : begin + (n / run - 1) * stride + run;
  c.run = run;
  c.stride = run == 0 ? 0 : stride;
  c.checksum = checksum64(data, c.bytes);
  check(c.end <= t->numel(), "checkpoint chunk of " + name + " runs past the tensor's end");
  f->write(data, c.bytes);
  t->chunks.push_back(std::move(c));
}

std::string CheckpointWriter::commit(Manifest meta) {
  for (const auto& [name, source] : meta.copies) {
    auto& f = files_[name];
    check(!f, "checkpoint file " + name + " is written twice");
    f = std::make_unique<FileWriter>((fs::path(tmp_) / name).string());
    const std::string bytes = read_small_file(source);
    f->write(bytes.data(), bytes.size());
  }
  meta.files.clear();
  for (auto& [name, f] : files_) {
    meta.files.push_back(FileEntry{name, f->offset()});
    f->sync_and_close();
  }
  // Other ranks' files and chunks, in a stable order: files by name, chunks by position.
  meta.files.insert(meta.files.end(), merged_files_.begin(), merged_files_.end());
  std::sort(meta.files.begin(), meta.files.end(), [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });
  for (auto& t : tensors_)
    std::sort(t.chunks.begin(), t.chunks.end(), [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  meta.tensors = tensors_;
  {
    const std::string text = manifest_to_json(meta).dump(1) + "\n";
    FileWriter m((fs::path(tmp_) / kManifestFile).string());
    m.write(text.data(), text.size());
    m.sync_and_close();
  }
  fsync_dir(tmp_);

  // A step directory already under this name was never committed by this run (see
  // checkpoint_dir.h); move it aside first, since rename() cannot replace a non-empty directory.
  std::error_code ec;
  std::string trash;
  if (fs::exists(final_, ec)) {
    trash = (fs::path(dir_) / (".trash_" + step_dir_name(step_) + "_" + std::to_string(::getpid()))).string();
    remove_tree(trash);
    rename_path(final_, trash);
  }
  rename_path(tmp_, final_);
  fsync_dir(dir_);
  write_latest(dir_, step_);
  if (!trash.empty()) remove_tree(trash);
  return final_;
}

void CheckpointWriter::abandon() noexcept {
  files_.clear();  // close the descriptors before removing the files
  remove_tree(tmp_);
}

std::string write_checkpoint(const std::string& dir, const Manifest& meta,
                             const std::function<void(CheckpointWriter&)>& fill) {
  CheckpointWriter w(dir, meta.step);
  try {
    fill(w);
    return w.commit(meta);
  } catch (const std::exception&) {
    w.abandon();
    throw;
  }
}

}  // namespace pt::ckpt
