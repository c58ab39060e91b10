// A non-owning view of a buffer that lives on one backend's device (host memory for the CPU
// backend, GPU memory for CUDA). It knows its element type and count, nothing about shape:
// shapes are passed to each op explicitly, as in llm.c, so every kernel states its dimensions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/common/error.h"

namespace pt {

// f8e4m3 / f8e5m2: FP8 codes, one byte each (core/common/fp8.h), for the FP8 matmuls' operands.
enum class DType : uint8_t { f32, bf16, i32, f8e4m3, f8e5m2 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::f8e4m3: return 1;
    case DType::f8e5m2: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "?";
}

struct Tensor {
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::f32;

  explicit operator bool() const { return data != nullptr; }
  size_t bytes() const { return numel * dtype_size(dtype); }

  // A sub-range [offset, offset+n) of the same buffer, same dtype.
  Tensor slice(size_t offset, size_t n) const {
    check(offset + n <= numel, "Tensor::slice out of range");
    return Tensor{static_cast<char*>(data) + offset * dtype_size(dtype), n, dtype};
  }

  // Typed access for host-side backends; throws if the dtype does not match.
  float* f32() const {
    check(dtype == DType::f32 || !data, std::string("tensor is ") + dtype_name(dtype) + ", expected f32");
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    check(dtype == DType::i32 || !data, std::string("tensor is ") + dtype_name(dtype) + ", expected i32");
    return static_cast<int32_t*>(data);
  }
};

}  // namespace pt
