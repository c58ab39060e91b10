// run.cuda_graphs: which runs record their forwards and backwards as CUDA graphs
// (PipelineExecutor::use_graphs), and why the others do not.
#pragma once
#include <string>

#include "core/config/run_config.h"
#include "core/ops/ops.h"

namespace pt {

// Why `cfg` on `device` runs op by op although run.cuda_graphs asks for graphs ("" when nothing
// stands in the way; the recording itself may still fail, and says why then):
//  - the CPU backend runs each op as it is called;
//  - a layout over more than one GPU issues collectives inside forward and backward (tensor,
//    context and expert parallel, ZeRO-3's gathers, the overlapped gradient reductions) and the
//    pipeline's messages between them, none of which a recording of one GPU's stream holds;
//  - delayed FP8 scaling moves each step's amaxes into a history the host indexes.
std::string cuda_graphs_blocker(const RunConfig& cfg, Device device);

}  // namespace pt
