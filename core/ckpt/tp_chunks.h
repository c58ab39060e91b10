// Checkpoint chunks of tensor-parallel pieces. A checkpoint addresses every tensor by its
// GLOBAL elements (manifest.h); a tensor-parallel rank holds its piece of a parameter as a
// local tensor whose elements lie in runs of the global one (TpSlice, core/model/tp_slice.h).
// These map a range of local elements to the chunks that store it, and read it back.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ckpt/checkpoint_reader.h"
#include "core/model/tp_slice.h"

namespace pt::ckpt {

// Local elements [local_begin, local_begin + numel) of a piece, stored as global elements from
// global_begin on: contiguous (run 0), or runs of `run` elements `stride` apart.
struct GlobalSpan {
  size_t local_begin = 0, numel = 0;
  uint64_t global_begin = 0;
  uint64_t run = 0, stride = 0;
};

// Local [begin, end) of `tp`'s piece as at most three spans, in local order: the rest of a run
// it starts inside of, one strided span of the whole runs, the start of the run it ends inside
// of. (One span per run would make a row-parallel matrix thousands of chunks.) A replicated
// parameter is one contiguous span.
std::vector<GlobalSpan> global_spans(const TpSlice& tp, size_t begin, size_t end);

// Fills out[0, end - begin) with local elements [begin, end) of `tp`'s piece of tensor `name`.
// The piece's runs are gathered from ONE read of the global extent that covers them (a read per
// run would read and verify the same chunks over and over).
void read_local(CheckpointReader& r, const std::string& name, const TpSlice& tp, size_t begin, size_t end,
                float* out);

}  // namespace pt::ckpt
