#include "core/plan/hardware_profiles.h"

#include "core/common/error.h"

namespace pt {

// Sources (NVIDIA datasheets; their tensor-core figures are "with sparsity", halved here):
//   A100: "NVIDIA A100 Tensor Core GPU" datasheet (1758950-r4): BF16 312 TFLOPS dense, no FP8;
//         40GB HBM2 1,555 GB/s, 80GB HBM2e 2,039 GB/s (SXM); NVLink 3 600 GB/s (both ways).
//         DGX A100: one 200 Gb/s HDR InfiniBand NIC per GPU (25 GB/s).
//   H100: "NVIDIA H100 Tensor Core GPU" datasheet: SXM BF16 1,979 / FP8 3,958 TFLOPS sparse,
//         80GB HBM3 3.35 TB/s, NVLink 4 900 GB/s; PCIe BF16 1,513 / FP8 3,026 sparse, 80GB HBM2e
//         2 TB/s, PCIe Gen5 128 GB/s (both ways; the NVLink bridge joins pairs only, so a node's
//         GPUs talk over PCIe). DGX H100: one 400 Gb/s NDR NIC per GPU (50 GB/s).
//   H200: "NVIDIA H200 Tensor Core GPU" datasheet (SXM): the H100's tensor cores, 141GB HBM3e at
//         4.8 TB/s, NVLink 900 GB/s; 400 Gb/s per GPU as DGX H100.
//   B200: "NVIDIA HGX B200" datasheet (8 GPUs): FP8 72 PFLOPS, BF16 36 PFLOPS sparse, 1.44 TB
//         HBM3e at 64 TB/s, NVLink 5 1.8 TB/s per GPU; DGX B200: one 400 Gb/s NIC per GPU.
const std::vector<GpuProfile>& gpu_profiles() {
  static const std::vector<GpuProfile> profiles = {
      {"a100-40g", "NVIDIA A100 SXM4 40GB", 312, 0, 40, 1555, 300, 25},
      {"a100-80g", "NVIDIA A100 SXM4 80GB", 312, 0, 80, 2039, 300, 25},
      {"h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 1978.9, 80, 3350, 450, 50},
      {"h100-pcie", "NVIDIA H100 PCIe 80GB", 756, 1513, 80, 2000, 64, 50},
      {"h200", "NVIDIA H200 SXM 141GB", 989.4, 1978.9, 141, 4800, 450, 50},
      {"b200", "NVIDIA B200 (HGX) 180GB", 2250, 4500, 180, 8000, 900, 50},
  };
  return profiles;
}

std::string gpu_profile_names() {
  std::string out;
  for (const GpuProfile& g : gpu_profiles()) out += (out.empty() ? "" : ", ") + std::string(g.name);
  return out;
}

const GpuProfile& gpu_profile(const std::string& name) {
  for (const GpuProfile& g : gpu_profiles())
    if (name == g.name) return g;
  throw ConfigError("plan --gpu " + name + " is not a known GPU; choose one of " + gpu_profile_names() +
                    " (and override any field with --peak-tflops, --gpu-memory-gib, --hbm-gbps, --nvlink-gbps, "
                    "--network-gbps)");
}

Hardware hardware_of(const GpuProfile& gpu, int gpus_per_node) {
  Hardware hw;
  hw.gpu = gpu.name;
  hw.gpus_per_node = gpus_per_node;
  hw.peak_tflops = gpu.peak_bf16_tflops;
  hw.fp8_speedup = gpu.peak_fp8_tflops / gpu.peak_bf16_tflops;
  hw.gpu_memory_gib = gpu.memory_gib;
  hw.hbm_gbps = gpu.hbm_gbps;
  hw.nvlink_gbps = gpu.nvlink_gbps;
  hw.network_gbps = gpu.network_gbps;
  return hw;
}

}  // namespace pt
