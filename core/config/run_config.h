// RunConfig: the only place that knows JSON run configs. A config is read from a file,
// `--set section.key=value` overrides are applied, every rule is checked (before anything is
// allocated), derived values are filled in, and the resolved config can be written back out.
//
// Every key, its default and its rule are listed once, in config_keys.cpp, and explained in
// config_reference_text.cpp (`picotrain keys --markdown` writes docs/configuration.md from both).
// A failure throws ConfigError naming the key, the value and the rule, e.g.
//   "batch.global_batch_tokens=1000 must be a multiple of micro_batch_size*seq_len*dp=512".
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pt {

struct RunSection {
  std::string name = "picotrain";
  std::string out_dir;  // default: runs/<name>
  uint64_t seed = 1337;
  // Seconds without progress after which a rank ends itself (core/train/progress_watchdog.h);
  // 0: never; -1: 600 when the run has several ranks, never for one.
  double hang_timeout_s = -1;
  // The run's guards (core/train/run_guard.h). A step whose loss or gradient norm is not finite
  // is skipped (nothing updated); this many skipped in a row end the run. 0: the guard is off.
  int max_skipped_steps = 5;
  // Loss-spike rollback (PaLM's recipe), 0: off. A loss this many standard deviations above the
  // mean of the last spike_window losses reloads the newest checkpoint and skips the batches
  // from it up to the spike and spike_skip_steps more; spike_max_rollbacks ends the run.
  double spike = 0;
  int spike_window = 100;
  int spike_skip_steps = 200;
  int spike_max_rollbacks = 3;
  // Corruption check, 0: off. Every replay_every_steps steps each rank runs its first
  // micro-batch's forward again and compares the bits; a mismatch ends the run ("stop") or is
  // logged and counted ("warn").
  int replay_every_steps = 0;
  std::string replay_mismatch = "stop";
  // Record each micro-batch's forward and backward as CUDA graphs once and replay them
  // (PipelineExecutor::use_graphs; core/train/cuda_graphs.h says which layouts can).
  bool cuda_graphs = false;
};

// arch "gpt2" (OpenAI GPT-2 exactly) or "llama" (Hugging Face's LlamaForCausalLM exactly). The
// keys after max_seq_len shape the Llama family; 0 (unset for tie_embeddings) means "the
// architecture's value", filled in by the rules (config_rules.cpp), which also reject a value a
// GPT-2 cannot have (GPT-2 is multi-head, 4x GELU MLP, LayerNorm eps 1e-5, learned positions, tied).
// Mixture of experts (the config's "moe" section; the model's shape, so it lives in ModelSection
// where every consumer of the shape reads it). n_experts 0: a dense model.
struct MoeSection {
  int n_experts = 0;         // routed SwiGLU experts per sparse block; 0: dense
  int top_k = 2;             // experts each token is routed to
  int expert_hidden = 0;     // each expert's hidden width; 0: model.ffn_hidden
  int every = 1;             // block l is sparse when (l + 1) % every == 0 (1: every block)
  int n_shared_experts = 0;  // always-on experts of a sparse block: one SwiGLU of n_shared_experts x expert_hidden
  double aux_loss_coef = 0.01;  // the load-balancing loss's weight in the objective
  bool enabled() const { return n_experts > 0; }
};

struct ModelSection {
  std::string arch = "gpt2";
  int n_layers = 12;
  int d_model = 768;
  int n_heads = 12;
  int vocab_size = 50257;
  int pad_vocab_multiple = 128;
  int max_seq_len = 1024;
  int n_kv_heads = 0;               // grouped-query attention; 0: n_heads (multi-head)
  int ffn_hidden = 0;               // the MLP's hidden width; 0: 4*d_model (gpt2), Llama's rule (llama)
  int ffn_multiple_of = 0;          // llama: the rule rounds the width up to this; 0: 256
  double ffn_dim_multiplier = 0;    // llama: the rule scales 8/3*d_model by this first; 0: 1
  double norm_eps = 0;              // the norm's epsilon; 0: 1e-5
  double rope_theta = 0;            // llama: RoPE's base; 0: 10000
  std::optional<bool> tie_embeddings;  // the LM head is the token embedding; unset: gpt2 yes, llama no
  MoeSection moe;
  // derived
  int padded_vocab = 0;  // vocab_size rounded up to a multiple of pad_vocab_multiple
  int head_dim() const { return d_model / n_heads; }
  bool is_llama() const { return arch == "llama"; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  bool tied() const { return tie_embeddings.value_or(!is_llama()); }
  double eps() const { return norm_eps > 0 ? norm_eps : 1e-5; }
  double rope_base() const { return rope_theta > 0 ? rope_theta : 10000.0; }
  // The MLP's hidden width: ffn_hidden, else GPT-2's 4*d_model, or Llama's rule (Meta's
  // reference code): 8/3*d_model, scaled by ffn_dim_multiplier, rounded up to ffn_multiple_of.
  // Llama 3 8B: 4096 -> 10922 -> x1.3 = 14198 -> 14336 (multiple of 1024).
  int ffn_width() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (!is_llama()) return 4 * d_model;
    const int64_t multiple = ffn_multiple_of > 0 ? ffn_multiple_of : 256;
    int64_t hidden = 2 * (int64_t(4) * d_model) / 3;
    if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
    return static_cast<int>((hidden + multiple - 1) / multiple * multiple);
  }
};

struct ParallelSection {
  int dp = -1;  // -1: world_size / (tp*pp*cp)
  int tp = 1;
  int pp = 1;
  int cp = 1;
  int ep = 1;  // expert parallel: the routed experts split over ep of the dp ranks (moe.n_experts > 0)
  std::string order = "tp-cp-dp-pp";  // innermost first
  int zero_stage = 0;                 // 0..3
  int dp_replicate = 1;               // HSDP: dp = dp_replicate x dp_shard; ZeRO shards over dp_shard
  double grad_bucket_mb = 25.0;       // fp32 gradient bucket size for the dp x cp reduction
  bool sequence_parallel = false;
  std::string pp_schedule = "1f1b";  // afab | 1f1b | interleaved
  int pp_virtual_stages = 1;
  std::vector<int> pp_layers;  // blocks per virtual stage (pp*pp_virtual_stages entries); empty: even split
  std::string cp_impl = "ring";  // ring | ulysses
  // What moves tensors between ranks (core/dist/comm_backend.h): auto | nccl | mpi.
  std::string comm_backend = "auto";
};

// Activation recompute: what forward keeps for backward (core/model/decoder_stage.h).
struct RecomputeSection {
  std::string mode = "none";  // none | selective | full
};

struct BatchSection {
  int micro_batch_size = 4;
  int seq_len = 1024;
  int64_t global_batch_tokens = 0;  // 0: one micro-batch per DP rank (no accumulation)
  // derived
  int grad_accum_steps = 0;  // global_batch_tokens / (micro_batch_size * seq_len * dp)
};

struct OptimSection {
  double lr = 6e-4;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
};

struct ScheduleSection {
  int total_steps = 1000;
  int warmup_steps = 0;
  std::string decay = "cosine";  // cosine | linear | wsd | constant
  double min_lr_ratio = 0.0;
  double cooldown_fraction = 0.2;  // wsd only: the final fraction of steps that decays
};

struct PrecisionSection {
  std::string compute_dtype = "auto";  // auto | fp32 | bf16 (auto: fp32 on cpu, bf16 on cuda)
  std::string master_weights = "fp32";
  // FP8 products for the blocks' linear layers (core/parallel/fp8_linear.h): "off",
  // "tensorwise", "rowwise" or "delayed"; which layers ("all", or a comma-separated list of qkv,
  // attn_out, mlp_up, mlp_down); the gradients' format (e5m2 or e4m3; weights and activations
  // are e4m3); delayed scaling's amax history in steps (core/parallel/fp8_delayed.h).
  std::string fp8 = "off";
  std::string fp8_layers = "all";
  std::string fp8_grad_format = "e5m2";
  int fp8_amax_history = 16;
  // ZeRO-3 all-gathers the FP8 layers' weights as e4m3 codes (tensorwise only;
  // core/train/param_gather.h).
  bool fp8_weight_gather = true;
  // Which cuBLASLt algorithm each product runs (core/ops/matmul_algos.h): "heuristic" (the
  // library's first choice), "timed" (the fastest of its top candidates, timed in the first step),
  // or the path of a timed run's matmul_algos.json (its choices).
  std::string matmul_algos = "heuristic";
};

struct DataSection {
  std::string train;  // glob of llm.c token shards
  std::string val;    // glob; empty: no validation
  int val_every_steps = 0;  // 0: never during the run (N > 0: every N steps and after the last)
  bool final_val = false;   // validate after the last step even when val_every_steps is 0
  int64_t val_tokens = 0;   // 0: the whole val set... rounded down to whole batches
  // The tokenizer the shards were prepared with (make_tokenizer's names or a tokenizer.json path);
  // "": the one model.vocab_size implies. Checkpoints record it (core/ckpt/checkpoint_tokenizer.h).
  std::string tokenizer;
};

// A multiple-choice task scored during training (core/eval/mc_score.h; `picotrain eval` scores
// the same way from a checkpoint).
struct EvalSection {
  std::string task;          // HellaSwag-format JSONL; "": none
  int every_steps = 0;       // N > 0: every N steps and after the last; 0: after the last only
  int64_t max_examples = 0;  // the task's first examples; 0: all of them
  std::string name;          // the log's fields <name>_acc, <name>_acc_norm; "": from the task's file name
};

struct CheckpointSection {
  std::string dir;  // default: <out_dir>/checkpoints
  int every_steps = 0;
  // Save at the end of a run that finished its steps (whatever every_steps is), so a finished
  // run always leaves its trained model; false for runs that only measure (benchmarks).
  bool final = true;
  int keep_latest = 2;             // >= 2: the newest may be mid-write when the next one starts
  int keep_every = 0;              // steps that are multiples are milestones, never pruned; 0: none
  double save_timeout_s = 900;     // a save lasting longer ends the rank (the watchdog's); 0: never
  std::string resume = "none";  // auto | none | PATH
  // When checkpoints are saved, for the start-up log and the run report: "every 50 steps and at
  // the end", "at the end of the run", ... (a stop signal always saves one).
  std::string cadence() const;
};

struct LoggingSection {
  int every_steps = 1;
  std::string metrics_file = "metrics.jsonl";  // relative to run.out_dir
  double peak_tflops = 0.0;                    // 0: from the device table, or measured on the CPU
  std::string flops_formula = "palm";          // palm | llmc
  int sample_every = 0;                        // print a sample every this many steps and at the end; 0: never
  std::string sample_prompt = "The";           // the text samples continue
  int sample_tokens = 64;                      // tokens per sample
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  ParallelSection parallel;
  RecomputeSection recompute;
  BatchSection batch;
  OptimSection optim;
  ScheduleSection schedule;
  PrecisionSection precision;
  DataSection data;
  EvalSection eval;
  CheckpointSection checkpoint;
  LoggingSection logging;

  int world_size = 1;  // set by load_config from the launcher
};

// Reads `path` (JSON), applies `overrides` ("section.key=value"; the value is parsed as JSON
// when it is valid JSON, else taken as a string), checks every rule for a world of
// `world_size` ranks and fills in derived values. Throws ConfigError.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size);

// The JSON of a config file, unchecked (ConfigError when it cannot be read or is not JSON).
nlohmann::json read_config_file(const std::string& path);

// The same from an already-parsed JSON object (tests use this).
RunConfig config_from_json(const nlohmann::json& j, const std::vector<std::string>& overrides, int world_size);

// The resolved config (every key, derived values included) as JSON.
nlohmann::json config_to_json(const RunConfig& cfg);

// Writes the resolved config to <out_dir>/config.json (creating out_dir).
void write_resolved_config(const RunConfig& cfg);

}  // namespace pt
