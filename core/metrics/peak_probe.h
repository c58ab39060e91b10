// Measures a backend's matmul throughput, used as the MFU peak when none is configured and
// the device is not in the GPU table (the CPU backend): a square fp32 matmul called repeatedly
// for about a quarter of a second after one warm-up call; the fastest call gives the peak.
#pragma once
#include "core/ops/ops.h"

namespace pt {

struct PeakProbe {
  double tflops = 0;
  int size = 0;  // the matmul was size x size x size
};

PeakProbe measure_matmul_peak(Ops& ops);

}  // namespace pt
