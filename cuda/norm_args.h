// Argument checks shared by the row-normalisation launchers (layernorm.cu, rmsnorm.cu): one
// message for a bad shape or a missing tensor, thrown before anything is launched.
#pragma once
#include <initializer_list>
#include <string>

#include "core/common/error.h"

namespace pt::gpu {

// N rows of C channels; every pointer in `required` must be set unless there are no rows.
inline void check_norm_args(const char* op, int N, int C, std::initializer_list<const void*> required) {
  check(N >= 0, std::string(op) + ": negative row count N=" + std::to_string(N));
  check(C > 0, std::string(op) + ": channel count C=" + std::to_string(C) + " must be positive");
  for (const void* p : required)
    check(p != nullptr || N == 0, std::string(op) + ": a required device pointer is null");
}

}  // namespace pt::gpu
