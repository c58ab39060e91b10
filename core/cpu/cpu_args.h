// Argument checks shared by the CpuOps files: every op turns its Tensor arguments into raw
// pointers through these, so a wrong dtype or a buffer too small for the stated shape is a
// RuntimeError naming the op and the argument, not a silent out-of-bounds write.
// Checks run on the calling thread before any OpenMP region (an exception must never leave one).
#pragma once
#include <cstddef>
#include <initializer_list>
#include <string>

#include "core/tensor/tensor.h"

namespace pt::cpu {

// Shape arguments are ints (as in llm.c); a negative one would wrap to a huge size_t below.
inline void check_dims(const char* op, std::initializer_list<long long> dims) {
  for (long long d : dims) check(d >= 0, std::string("CpuOps::") + op + ": negative dimension " + std::to_string(d));
}

inline void check_size(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.numel >= n, std::string("CpuOps::") + op + ": " + name + " holds " + std::to_string(t.numel) +
                          " elements, the shape needs " + std::to_string(n));
}

// A required f32 tensor of at least n elements.
inline float* f32_arg(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.data != nullptr || n == 0, std::string("CpuOps::") + op + ": " + name + " is null");
  check(t.dtype == DType::f32,
        std::string("CpuOps::") + op + ": " + name + " is " + dtype_name(t.dtype) + ", expected f32");
  check_size(t, n, op, name);
  return static_cast<float*>(t.data);
}

// An optional f32 tensor (gradients, bias): nullptr when t is null ("not needed").
inline float* optional_f32_arg(const Tensor& t, size_t n, const char* op, const char* name) {
  if (!t) return nullptr;
  return f32_arg(t, n, op, name);
}

// A required i32 tensor (token ids, targets, positions) of at least n elements.
inline const int32_t* i32_arg(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.data != nullptr || n == 0, std::string("CpuOps::") + op + ": " + name + " is null");
  check(t.dtype == DType::i32,
        std::string("CpuOps::") + op + ": " + name + " is " + dtype_name(t.dtype) + ", expected i32");
  check_size(t, n, op, name);
  return static_cast<const int32_t*>(t.data);
}

}  // namespace pt::cpu
