// Writes one checkpoint with the commit protocol (after torchtitan/DCP's commit-by-rename):
//   1. data files and manifest.json go into <dir>/.tmp_step_N_<pid>/, each fsynced;
//   2. the temporary directory is fsynced and renamed to <dir>/step_N; <dir> is fsynced;
//   3. `latest` is pointed at step_N (temp file + rename + fsync).
// A crash before 2 leaves only a .tmp_ directory (never loaded); between 2 and 3 a step
// directory newer than `latest` (ignored, see checkpoint_dir.h). Only after 3 is it committed.
//
// Several ranks: rank 0's writer creates the temporary directory; every other rank that holds
// state joins it, writes its own files and hands its part (files and chunks) to rank 0, which
// merges the parts and commits alone (see Checkpointer::save).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ckpt/durable_io.h"
#include "core/ckpt/manifest.h"

namespace pt::ckpt {

class CheckpointWriter {
 public:
  // Creates `dir` if needed and the temporary directory inside it.
  CheckpointWriter(std::string dir, int step);
  // Joins `temp_dir`, the temporary directory another rank's writer of the same step created.
  CheckpointWriter(std::string dir, int step, std::string temp_dir);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends elements [begin, begin + n) of the flattened global tensor `name` (of global
  // shape `shape`, dtype f32) to the data file `file`, as one checksummed chunk.
  void add_chunk(const std::string& name, const std::vector<int64_t>& shape, const std::string& file,
                 uint64_t begin, const float* data, size_t n);
  // The same for n elements (a multiple of run) that lie in runs of `run` global elements,
  // `stride` apart, the first at `begin`: one strided chunk (manifest.h). run 0, or a single
  // run, is a contiguous chunk.
  void add_strided_chunk(const std::string& name, const std::vector<int64_t>& shape, const std::string& file,
                         uint64_t begin, uint64_t run, uint64_t stride, const float* data, size_t n);

  // Steps 1-3 above with `meta` (its files and tensors are filled in here; its `copies` are copied
  // in first). Returns step_N's path.
  std::string commit(Manifest meta);
  // A joined writer's part: fsyncs and closes its files and returns them and their chunks.
  Manifest finish_part();
  // Adds the files and chunks another rank's writer put into the temporary directory.
  void merge_part(const Manifest& part);
  // Removes the temporary directory (a failed save); never throws.
  void abandon() noexcept;

  const std::string& temp_dir() const { return tmp_; }

 private:
  std::string dir_, tmp_, final_;
  int step_;
  std::map<std::string, std::unique_ptr<FileWriter>> files_;  // by file name, in name order
  std::vector<TensorEntry> tensors_;
  std::vector<FileEntry> merged_files_;  // written (and fsynced) by other ranks
};

// Runs `fill` on a new writer and commits. Any std::exception removes the temporary directory
// and propagates (the previous checkpoints are untouched); a write failure names the path and
// the errno text.
std::string write_checkpoint(const std::string& dir, const Manifest& meta,
                             const std::function<void(CheckpointWriter&)>& fill);

}  // namespace pt::ckpt
