// The argument checks of CudaOps's ops (cuda_ops*.cpp only): a wrong dtype or a buffer too small
// throws before anything is launched, naming the op and the argument.
#pragma once
#include <initializer_list>
#include <string>

#include "core/common/error.h"
#include "core/tensor/tensor.h"

namespace pt::cuda_ops_args {

inline std::string where(const char* op) { return std::string("CudaOps::") + op; }

inline void need(const Tensor& t, size_t n, const char* op, const char* name) {
  check(t.data != nullptr || n == 0, where(op) + ": " + name + " is null");
  check(t.numel >= n, where(op) + ": " + name + " holds " + std::to_string(t.numel) + " elements, the shape needs " +
                          std::to_string(n));
}

inline void need(const Tensor& t, size_t n, DType dtype, const char* op, const char* name) {
  need(t, n, op, name);
  check(t.dtype == dtype || t.data == nullptr, where(op) + ": " + name + " is " + dtype_name(t.dtype) + ", expected " +
                                                   dtype_name(dtype));
}

// An activation tensor: f32 or bf16. Returns its dtype.
inline DType need_act(const Tensor& t, size_t n, const char* op, const char* name) {
  need(t, n, op, name);
  check(t.dtype == DType::f32 || t.dtype == DType::bf16,
        where(op) + ": " + name + " is " + dtype_name(t.dtype) + ", expected f32 or bf16");
  return t.dtype;
}

inline void check_dims(const char* op, std::initializer_list<long long> dims) {
  for (long long d : dims) check(d >= 0, where(op) + ": negative dimension " + std::to_string(d));
}

// Parameter gradients that travel together (dw and db) must share one dtype.
inline DType grad_dtype(const char* op, std::initializer_list<const Tensor*> grads, DType fallback) {
  DType d = fallback;
  bool found = false;
  for (const Tensor* g : grads) {
    if (!*g) continue;
    check(!found || g->dtype == d, where(op) + ": the parameter gradients have different dtypes");
    d = g->dtype;
    found = true;
  }
  return d;
}

inline bool overlap(const Tensor& a, const Tensor& b, size_t n) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return pa < pb + n * dtype_size(b.dtype) && pb < pa + n * dtype_size(a.dtype);
}

}  // namespace pt::cuda_ops_args
