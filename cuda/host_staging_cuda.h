// The CUDA HostStaging (core/dist/host_staging.h): device tensors reach MPI through one pinned
// host buffer, copied on the CudaOps stream so a copy down sees every op queued before it.
// No CUDA headers here.
#pragma once
#include <memory>

#include "core/dist/host_staging.h"
#include "core/ops/ops.h"

namespace pt {

// `ops` must be the CudaOps whose tensors will be staged; it must outlive the staging.
std::shared_ptr<HostStaging> make_cuda_host_staging(Ops& ops);

}  // namespace pt
