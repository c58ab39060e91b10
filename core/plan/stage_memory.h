// The memory one rank of each pipeline stage needs under a resolved config's layout, from the
// shapes alone (nothing is allocated): the accounting the trainer prints at start-up
// (`memory | ...`) and `picotrain plan` lists for layouts it never runs. Both call this one
// function, so the two cannot disagree. It assembles the pieces of core/train/memory_plan.h:
// each stage's parameters (its pipeline chunks, its tensor-parallel piece) sharded by a
// ShardLayout over the ZeRO group, and the activations of the micro-batches its schedule holds
// in flight.
//
// Every rank of one stage holds the same bytes (ZeRO pads shards to equal sizes, tensor-parallel
// pieces are equal), so one entry per stage describes every rank.
#pragma once
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_table.h"
#include "core/tensor/tensor.h"
#include "core/train/memory_plan.h"

namespace pt {

struct StageMemory {
  int pp_rank = 0;
  // What the stage runs, e.g. "embeddings + layers 0-1, 2 micro-batch(es) in flight".
  std::string chunks;
  MemoryPlan plan;
};

// One entry per pipeline stage (parallel.pp of them). model: the whole model's ParamTable;
// compute: the dtype activations and parameters are held in (bf16 on GPUs, fp32 on the CPU).
std::vector<StageMemory> plan_stage_memory(const RunConfig& cfg, const ParamTable& model, DType compute);

}  // namespace pt
