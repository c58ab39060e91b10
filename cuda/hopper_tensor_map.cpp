// TMA tensor maps for the Hopper flash attention kernels (hopper_tensor_map.h).
#include "cuda/hopper_tensor_map.h"

#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <string>

#include "cuda/cuda_common.h"

namespace pt::gpu {

namespace {

// cuTensorMapEncodeTiled is a driver function: found through the runtime, so that picotrain links
// no libcuda of its own.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    check(found == cudaDriverEntryPointSuccess && p != nullptr,
          "flash attention (sm_90a): the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap rows_tensor_map(const void* base, int B, int T, size_t W, int box_rows) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const cuuint64_t dims[3] = {W, static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[2] = {W * sizeof(__nv_bfloat16), static_cast<cuuint64_t>(T) * W * sizeof(__nv_bfloat16)};
  const cuuint32_t box[3] = {kTmaBoxCols, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                                          strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, "flash attention (sm_90a): cuTensorMapEncodeTiled failed with CUresult " +
                               std::to_string(static_cast<int>(r)));
  return map;
}

}  // namespace pt::gpu
