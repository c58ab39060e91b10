// run.cuda_graphs: which runs record their forwards and backwards as CUDA graphs
// (PipelineExecutor::use_graphs), and why the others do not.
#pragma once
#include <string>

#include "core/config/run_config.h"
#include "core/ops/ops.h"

namespace pt {

// Why `cfg` on `device` runs op by op although run.cuda_graphs asks for graphs ("" when nothing
// stands in the way; the recording itself may still fail, and says why then). A recording holds
// one GPU's stream and no collective, so:
//  - the CPU backend runs each op as it is called;
//  - tensor, context and expert parallel talk to other ranks inside forward and backward;
//  - ZeRO-2 and 3 over several ranks reduce (and ZeRO-3 gathers) each layer in every micro-step;
//  - data parallel with one micro-batch a step: the gradient reductions start inside its
//    backward (with more, the earlier micro-batches are recorded and the last runs op by op);
//  - delayed FP8 scaling moves each step's amaxes into a history the host indexes.
// Pipeline parallel records each stage's forwards and backwards; its messages run between them.
std::string cuda_graphs_blocker(const RunConfig& cfg, Device device);

}  // namespace pt
