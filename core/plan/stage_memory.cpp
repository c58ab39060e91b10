#include "core/plan/stage_memory.h"

#include "core/model/expert_split.h"
#include "core/model/model_parallel.h"
#include "core/model/pipeline_stages.h"
#include "core/model/shard_layout.h"
#include "core/train/param_gather.h"
#include "core/train/pipeline_executor.h"
#include "core/train/pp_schedule.h"

namespace pt {

std::vector<StageMemory> plan_stage_memory(const RunConfig& cfg, const ParamTable& model, DType compute) {
  const auto& m = cfg.model;
  const auto& par = cfg.parallel;
  const auto& b = cfg.batch;
  const Recompute recompute = parse_recompute(cfg.recompute.mode);
  const Fp8Recipe fp8 = fp8_recipe(cfg.precision);
  const PipeSchedule kind = parse_pipe_schedule(par.pp_schedule);
  // ZeRO shards over the dp_shard x cp ranks of one HSDP replica (ShardLayout takes 1 under ZeRO-0).
  const int shards = par.dp / par.dp_replicate * par.cp;
  const size_t bucket_cap = bucket_cap_elements(par.grad_bucket_mb);
  const StageDims dims = StageDims::make(m, b.micro_batch_size, b.seq_len, par.tp, par.sequence_parallel, par.cp, par.ep,
                                         par.dp * par.cp);
  // ZeRO-3's FP8 weight gather's buffers (ParamGather::enable_fp8), counted with the gathered layers.
  const auto fp8_gather_bytes = [&](const ShardLayout& layout, const ParamTable& table) {
    return ParamGather::fp8_scratch_bytes(layout, table, fp8_gathered_params(table, cfg), compute, par.tp);
  };
  std::vector<StageMemory> out;
  for (int r = 0; r < par.pp; r++) {
    const std::vector<StageLayers> chunks = pipeline_chunks(m, par, r);
    const ParamTable stage = tensor_parallel_table(stage_param_table(model, chunks, m.n_layers), par.tp, 0);
    const std::vector<StageSlots> slots =
        pipeline_slots(shared_pipeline_schedule(kind, par.pp, par.pp_virtual_stages, b.grad_accum_steps)[size_t(r)],
                       par.pp_virtual_stages);
    StageMemory s;
    s.pp_rank = r;
    size_t activations =
        pipeline_step_buffer_bytes(chunks, b.grad_accum_steps, size_t(b.micro_batch_size) * (b.seq_len / par.cp));
    for (size_t c = 0; c < chunks.size(); c++) {
      activations +=
          decoder_activation_bytes(dims, parse_cp_impl(par.cp_impl), compute, chunks[c], slots[c], recompute, fp8);
      s.chunks += (c ? "; " : "") + chunks[c].describe() + ", " + std::to_string(slots[c].activations) +
                  " micro-batch(es) in flight";
    }
    if (par.ep > 1) {
      // Expert parallel: the dense part as above, and 1/ep of the routed experts sharded over the
      // ranks holding the same ones (expert_split.h).
      const ExpertSplit split = split_expert_parallel(stage, m.moe.n_experts, par.ep, 0);
      const ShardLayout dense(split.dense, par.zero_stage, shards, 0, bucket_cap);
      s.plan = plan_memory(dense, compute, activations);
      s.plan.params_working += fp8_gather_bytes(dense, split.dense);
      add_expert_memory(s.plan, ShardLayout(split.experts, par.zero_stage, shards / par.ep, 0, bucket_cap), compute);
    } else {
      const ShardLayout layout(stage, par.zero_stage, shards, 0, bucket_cap);
      s.plan = plan_memory(layout, compute, activations);
      s.plan.params_working += fp8_gather_bytes(layout, stage);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace pt
