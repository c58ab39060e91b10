// The CUDA backend's entry points, as seen from host code compiled by g++ (no CUDA headers
// here, so core/ can include it without nvcc).
#pragma once
#include <memory>
#include <string>

#include "core/ops/ops.h"

namespace pt {

// Number of visible CUDA devices; 0 on any error (no driver, no device): a machine without a
// GPU reports cudaErrorInsufficientDriver, which is "no GPU", not a failure.
int cuda_device_count();
// One line saying why there is no device (the CUDA error string), or the device name.
std::string cuda_status_message();
// The CUDA Ops backend on the current device, computing in `compute_dtype` (f32 or bf16).
std::unique_ptr<Ops> make_cuda_ops(DType compute_dtype = DType::bf16);

}  // namespace pt
