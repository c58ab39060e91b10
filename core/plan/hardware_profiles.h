// The GPUs `picotrain plan --gpu NAME` knows: each one's datasheet numbers, which fill Hardware
// (core/plan/step_time.h) before any --peak-tflops, --gpu-memory-gib, --hbm-gbps, --nvlink-gbps
// or --network-gbps flag overrides a field. Peaks are dense (no 2:4 sparsity), per GPU;
// bandwidths per GPU, one direction; the network is the usual one NIC per GPU of that
// generation's reference system (DGX/HGX).
#pragma once
#include <string>
#include <vector>

#include "core/plan/step_time.h"

namespace pt {

struct GpuProfile {
  const char* name;          // the --gpu value
  const char* description;   // the datasheet's name of the part
  double peak_bf16_tflops;   // dense
  double peak_fp8_tflops;    // dense; 0: no fp8 tensor cores (precision.fp8 cannot be planned)
  double memory_gib;         // HBM as the datasheet counts it
  double hbm_gbps;
  double nvlink_gbps;        // inside a node
  double network_gbps;       // between nodes
};

const std::vector<GpuProfile>& gpu_profiles();

// "a100-40g, a100-80g, ..." for help and errors.
std::string gpu_profile_names();

// The profile called `name`; ConfigError naming --gpu and the known names otherwise.
const GpuProfile& gpu_profile(const std::string& name);

// The profile's numbers as Hardware (gpus_per_node stays as given).
Hardware hardware_of(const GpuProfile& gpu, int gpus_per_node);

}  // namespace pt
