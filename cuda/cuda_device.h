// Which GPU this process uses: choosing it by local rank, and naming it so ranks can tell whether
// they share one. No CUDA headers here.
#pragma once
#include <string>

namespace pt {

// Makes device `device` (0 .. cuda_device_count()-1) current for this process; throws
// RuntimeError with CUDA's message when it cannot.
void cuda_use_device(int device);
// The current device's UUID ("GPU-xxxxxxxx-..."), the same in every process that sees that GPU
// whatever its CUDA_VISIBLE_DEVICES numbering; "" when it cannot be read.
std::string cuda_device_uuid();

}  // namespace pt
