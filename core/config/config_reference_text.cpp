// The hand-written part of the configuration reference: what each config key means and the rule
// it follows, each section's opening line, and the rules every key shares. The key's type and
// default are not written here: they come from the key table itself (config_keys.cpp, from
// run_config.h). `picotrain keys` prints this for a terminal, and `picotrain keys --markdown`
// prints docs/configuration.md, which a test compares with the file (config_reference_doc).
// Markdown as GitHub renders it: `code`, *emphasis*, [links](into docs/); a '|' needs no escape.
#include "core/config/config_reference.h"

namespace pt::config {

std::string_view reference_rules() {
  return
      "A run config is a JSON object with the sections below; every section and every key may be left out and "
      "then takes its default (the defaults describe GPT-2 124M). An unknown section or key, a value of the "
      "wrong type, or a broken rule stops the run before anything is allocated, with exit code 2 and one line "
      "naming the key, the value and the rule, e.g. `error: parallel.tp=3 must divide model.n_heads=4`. "
      "`picotrain keys` prints the tables below in the terminal; `picotrain keys parallel` one section, "
      "`picotrain keys zero` every key whose name contains `zero`." "\n\n"
      "`picotrain train --config FILE --set section.key=value ...` changes keys after the file is read, in "
      "order. The value is read as JSON when it parses (`--set optim.lr=3e-4`, `--set optim.betas=[0.9,0.99]`, "
      "`--set parallel.sequence_parallel=true`), otherwise as text; string keys always take the text as it is "
      "(`--set run.name=2024` names the run \"2024\")." "\n\n"
      "Derived keys (marked *derived*) are filled in when the config is read, and the resolved config (every "
      "key, derived ones included) is written to `<run.out_dir>/config.json`, which can be passed back to "
      "`--config` on the same number of ranks. A derived key may be given, but then it must equal the value "
      "derived from the other keys: a stale copy is an error, not silently replaced. `0` (or `\"\"` for paths, "
      "`-1` for `parallel.dp`) asks for the derived value.";
}

std::string_view section_intro(std::string_view section) {
  if (section == "moe")
    return "A mixture of experts in a Llama (see [mixture of experts](models.md#mixture-of-experts)); with "
           "`n_experts` 0 the model is dense and the other keys are unused.";
  if (section == "parallel")
    return "The world size (ranks started by the launcher) must equal `dp*tp*pp*cp`.";
  if (section == "recompute")
    return "Activation recompute (see [activation recompute](parallel.md#activation-recompute)).";
  if (section == "eval")
    return "A multiple-choice benchmark scored during training (`picotrain eval` scores a checkpoint the same way).";
  if (section == "optim")
    return "AdamW with decoupled weight decay (on matrices only) and global-norm gradient clipping.";
  return {};
}

const std::vector<KeyMeaning>& key_meanings() {
  static const std::vector<KeyMeaning> meanings = {
      // ---- run
      {"run.name",
       "Name of the run; not empty."},
      {"run.out_dir",
       "Run directory (config, metrics, checkpoints). `\"\"`: `runs/<name>`."},
      {"run.seed",
       "Seed of every random stream (weights are initialised the same under every layout); >= 0."},
      {"run.hang_timeout_s",
       "A rank that makes no progress (no step or validation pass finishes) for this many seconds, or for 4 "
       "times its slowest step when that is longer, prints why and exits with code 1, so a hung run ends and "
       "can be resumed (the speedrun restarts it; `mpirun` ends the other ranks). NCCL's asynchronous errors "
       "end it at once. Writing a checkpoint does not count (it has `checkpoint.save_timeout_s`). `-1`: 600 "
       "with several ranks, off with one; `0`: off. See [when a run hangs](reliability.md#when-a-run-hangs)."},
      {"run.max_skipped_steps",
       "The non-finite guard: a step whose loss or gradient norm is a NaN or an infinity on any rank updates "
       "nothing (weights, master weights and Adam moments stay as they were; AdamW counts only real updates), "
       "is logged with its data position (`skipped` line) and counted (`skipped_steps` in metrics.jsonl and the "
       "report). This many skipped in a row end the run with an error naming the step and its data. `0`: the "
       "guard is off (a non-finite step then reaches the weights, and the next checkpoint save fails instead of "
       "writing it). >= 0. See [when a run meets NaNs](reliability.md#when-a-run-meets-nans) and [loss "
       "spikes](reliability.md#loss-spikes)."},
      {"run.spike",
       "Loss-spike rollback (PaLM's recipe): a step whose loss is more than this many standard deviations above "
       "the mean of the last `spike_window` losses reloads the newest checkpoint and skips the data from it "
       "through the spike and `spike_skip_steps` batches more (`spike` line, the report). `0`: off. >= 0."},
      {"run.spike_window",
       "How many recent losses the spike's mean and standard deviation are taken over; no spike is called "
       "before that many are known. >= 2."},
      {"run.spike_skip_steps",
       "Batches (global steps of data) skipped after the spike's own, besides those read between the checkpoint "
       "and the spike. >= 0."},
      {"run.spike_max_rollbacks",
       "A spike after this many rollbacks ends the run with an error instead (the run keeps diverging). >= 1."},
      {"run.replay_every_steps",
       "Corruption check: every this many steps each rank runs its first micro-batch's forward again, before "
       "the update, and compares the bits of every chunk's last hidden state with the first run (picotrain is "
       "bitwise deterministic, so they must agree). A mismatch names the rank and its host. Costs one forward "
       "of one micro-batch per check. `0`: off. >= 0."},
      {"run.replay_mismatch",
       "What a corruption-check mismatch does: `stop` ends the run before the step is applied; `warn` logs it, "
       "counts it in the report and trains on."},
      {"run.cuda_graphs",
       "CUDA graphs: from the session's second step on (after `precision.matmul_algos=timed` has chosen), each "
       "micro-batch's forward and backward, and the optimizer's update, is recorded once and then replayed with one "
       "launch instead of one per kernel, with the same bits. Under data parallel (ZeRO 0-1) the last "
       "micro-batch's work runs op by op (the gradient reductions start inside it); pipeline stages record theirs "
       "and exchange messages between. Tensor, context and expert parallel, ZeRO-2/3 over several ranks, dp with "
       "one micro-batch, `precision.fp8=delayed` and the CPU backend run op by op and the `graphs` line says why, "
       "as it does if a recording fails (the step then runs op by op, nothing lost). `false` by default until "
       "measured on a GPU (docs/gpu.md)."},
      // ---- model
      {"model.arch",
       "Architecture: `gpt2` (OpenAI GPT-2 / llm.c exactly) or `llama` (Hugging Face's `LlamaForCausalLM` "
       "exactly: RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases). The keys from `n_kv_heads` on "
       "shape the Llama family; given with `gpt2`, a value GPT-2 cannot have is an error."},
      {"model.n_layers",
       "Transformer blocks; >= 1; divisible by `parallel.pp * parallel.pp_virtual_stages` unless "
       "`parallel.pp_layers` lists the split."},
      {"model.d_model",
       "Hidden size; >= 1; divisible by `n_heads`."},
      {"model.n_heads",
       "Attention heads; >= 1; divisible by `parallel.tp` (by `tp*cp` with Ulysses)."},
      {"model.vocab_size",
       "Tokenizer vocabulary; >= 1."},
      {"model.pad_vocab_multiple",
       "The embedding and head are padded to a multiple of this (faster matmuls); >= 1."},
      {"model.max_seq_len",
       "Positions in the position embedding; >= 1; at least `batch.seq_len`."},
      {"model.n_kv_heads",
       "Key/value heads (grouped-query attention: query head h reads K/V head h / (n_heads / n_kv_heads)); `0`: "
       "`n_heads` (multi-head); must divide `n_heads`, and be divisible by `parallel.tp` (by `tp*cp` with "
       "Ulysses); GPT-2: `n_heads` only."},
      {"model.ffn_hidden",
       "The MLP's hidden width; `0`: `4*d_model` for gpt2, for llama Llama's rule: `8/3*d_model`, times "
       "`ffn_dim_multiplier`, rounded up to `ffn_multiple_of` (Llama 3 8B: 14336); divisible by `parallel.tp`."},
      {"model.ffn_multiple_of",
       "llama: the rule above rounds up to a multiple of this; `0`: 256."},
      {"model.ffn_dim_multiplier",
       "llama: the rule above scales `8/3*d_model` by this (Llama 3: 1.3 for 8B and 70B, 1.2 for 405B); `0`: 1."},
      {"model.norm_eps",
       "The norm's epsilon (RMSNorm for llama); `0`: 1e-5; in [0, 1); GPT-2: 1e-5 only."},
      {"model.rope_theta",
       "llama: RoPE's base (`inv_freq = theta^(-2i/head_dim)`, rotate-half pairing); `0`: 10000 (Llama 3: "
       "500000); >= 0."},
      {"model.tie_embeddings",
       "The LM head is the token embedding; `null`: true for gpt2 (always), false for llama."},
      {"model.padded_vocab",
       "*Derived*: `vocab_size` rounded up to a multiple of `pad_vocab_multiple` (50257 → 50304); divisible by "
       "`parallel.tp`."},
      // ---- moe
      {"moe.n_experts",
       "Routed SwiGLU experts in each sparse block; `0`: a dense model; > 0 needs `model.arch` `llama`."},
      {"moe.top_k",
       "Experts each token is routed to (their weights renormalised to sum to 1); >= 1, <= `n_experts`."},
      {"moe.expert_hidden",
       "Each expert's hidden width; `0`: `model.ffn_hidden` (Mixtral: 14336)."},
      {"moe.every",
       "Block l is sparse when `(l + 1) % every == 0` (1: every block, as Mixtral; 2: every other block, the "
       "rest dense); >= 1, <= `model.n_layers`."},
      {"moe.n_shared_experts",
       "Always-on experts of a sparse block, one SwiGLU of `n_shared_experts * expert_hidden` (DeepSeek's); its "
       "width divisible by `parallel.tp`; >= 0."},
      {"moe.aux_loss_coef",
       "Weight of the load-balancing loss (its mean over the sparse blocks) in the objective; `0`: logged, not "
       "trained on; >= 0."},
      // ---- parallel
      {"parallel.dp",
       "Data-parallel replicas; `-1` (*derived*): world size / (`tp*pp*cp`), which must divide evenly; else >= "
       "1."},
      {"parallel.tp",
       "Tensor-parallel ranks (Megatron column/row splits); >= 1; divides `model.n_heads` and "
       "`model.padded_vocab`."},
      {"parallel.pp",
       "Pipeline stages; >= 1."},
      {"parallel.cp",
       "Context-parallel ranks; >= 1; when > 1, `batch.seq_len` is divisible by `2*cp` (zigzag: two chunks per "
       "rank)."},
      {"parallel.ep",
       "Expert parallel: the routed experts split over groups of `ep` consecutive data-parallel ranks, each "
       "holding and running `n_experts/ep` of them, which exchange the routed tokens all-to-all (see [mixture "
       "of experts](models.md#expert-parallel)); needs `moe.n_experts`; >= 1; divides `dp` and `moe.n_experts` "
       "(and `dp/dp_replicate` with HSDP)."},
      {"parallel.order",
       "Rank order over the grid, innermost first; a permutation of `tp`, `cp`, `dp`, `pp` joined by `-`."},
      {"parallel.zero_stage",
       "0: all-reduce gradients; 1: shard optimizer state and master weights; 2: + gradients; 3: + parameters. "
       "In [0, 3]."},
      {"parallel.dp_replicate",
       "HSDP: the `dp` ranks form `dp_replicate` replicas of `dp/dp_replicate` ranks each; ZeRO shards inside a "
       "replica and gradients are then all-reduced across replicas. >= 1; divides `dp`."},
      {"parallel.grad_bucket_mb",
       "Size of the fp32 gradient buckets reduced over dp×cp (whole layers, in the reverse layer order backward "
       "completes them; ZeRO 2 and 3 reduce one layer at a time); > 0."},
      {"parallel.sequence_parallel",
       "With `tp` > 1: split the residual stream, LayerNorms and residual adds by token across the TP ranks "
       "(see [tensor, sequence and context parallel](parallel.md#tensor-sequence-and-context-parallel)); needs "
       "`batch.seq_len` divisible by `tp`, and `batch.micro_batch_size·batch.seq_len/cp` divisible by `tp`."},
      {"parallel.pp_schedule",
       "`afab` (all forward, all backward), `1f1b`, or `interleaved` (1F1B over virtual stages; needs `pp` >= "
       "2)."},
      {"parallel.pp_virtual_stages",
       "Model chunks per pipeline rank; >= 2 with `interleaved`, exactly 1 otherwise."},
      {"parallel.pp_layers",
       "Blocks per virtual stage, in order (virtual stage `s` is chunk `s/pp` of pipeline rank `s%pp`): "
       "`pp*pp_virtual_stages` entries, each >= 1, summing to `model.n_layers`; `[]`: an even split (then "
       "`model.n_layers` must be divisible by `pp*pp_virtual_stages`)."},
      {"parallel.cp_impl",
       "`ring` (ring attention, zigzag balanced) or `ulysses` (all-to-all over heads; needs `model.n_heads` "
       "divisible by `tp*cp`)."},
      {"parallel.comm_backend",
       "What moves tensors between ranks. `auto`: nothing with one rank; MPI with `--device cpu`; with "
       "`--device cuda`, NCCL when it loads on every rank and every rank has its own GPU, else MPI with device "
       "buffers staged through pinned host memory. `nccl`: NCCL, or an error naming why it cannot run. `mpi`: "
       "MPI (on GPUs staged through pinned host memory, which lets ranks share a GPU). The start-up `comm` line "
       "says which and why."},
      // ---- recompute
      {"recompute.mode",
       "`none` (keep every activation backward needs), `selective` (rebuild LayerNorm outputs, attention output "
       "and softmax state, GELU output: no matmul redone), or `full` (keep only each block's input and re-run "
       "the block in backward)."},
      // ---- batch
      {"batch.micro_batch_size",
       "Sequences per micro-batch on one DP replica; >= 1."},
      {"batch.seq_len",
       "Tokens per sequence; in [1, `model.max_seq_len`]."},
      {"batch.global_batch_tokens",
       "Tokens per optimizer step, over all replicas; a positive multiple of `micro_batch_size*seq_len*dp`. "
       "`0`: exactly one micro-batch per replica."},
      {"batch.grad_accum_steps",
       "*Derived*: `global_batch_tokens / (micro_batch_size*seq_len*dp)` micro-batches per step (with PP, the "
       "number of micro-batches in the schedule)."},
      // ---- optim
      {"optim.lr",
       "Peak learning rate; > 0."},
      {"optim.betas",
       "Adam β1, β2; each in [0, 1)."},
      {"optim.eps",
       "Adam ε; > 0."},
      {"optim.weight_decay",
       "Decoupled weight decay; >= 0."},
      {"optim.grad_clip",
       "Maximum global gradient norm; >= 0; `0`: no clipping."},
      // ---- schedule
      {"schedule.total_steps",
       "Optimizer steps in the run; >= 1."},
      {"schedule.warmup_steps",
       "Linear warmup: step s (0-based) of the warmup runs at `lr·(s+1)/warmup_steps`; in [0, `total_steps`]."},
      {"schedule.decay",
       "After warmup: `cosine` or `linear` down to `min_lr_ratio*lr` at the last step, `wsd` (constant, then "
       "linear over the last `cooldown_fraction` of the steps), or `constant`."},
      {"schedule.min_lr_ratio",
       "Final learning rate as a fraction of `optim.lr`; in [0, 1]."},
      {"schedule.cooldown_fraction",
       "`wsd` only: the fraction of `total_steps` at the end that decays; in (0, 1]."},
      // ---- precision
      {"precision.compute_dtype",
       "`fp32`, `bf16`, or `auto` (fp32 on the CPU backend, bf16 on CUDA)."},
      {"precision.master_weights",
       "Dtype of the weights the optimizer updates; only `fp32`."},
      {"precision.fp8",
       "`off`, `tensorwise`, `rowwise` or `delayed`: the linear layers of `fp8_layers` multiply in FP8 (e4m3 weights and "
       "activations), sums in fp32, with power-of-two scales from the largest values at the time: one per tensor "
       "(`tensorwise`), or one per row of each operand (`rowwise`: per token and per feature); or (`delayed`) one "
       "per tensor from its largest values over the last `fp8_amax_history` steps, recorded as the casts read "
       "them: no amax pass and no amax exchange per product, at the risk of clipping a tensor that outgrew its "
       "history (the first step scales as `tensorwise`; checkpoints keep the history). Needs a GPU of compute "
       "capability 8.9 or later (Ada, Hopper; `rowwise`: 9.0, Hopper); the CPU backend emulates it exactly."},
      {"precision.fp8_layers",
       "With `precision.fp8`: which layers multiply in FP8, a comma-separated list of `all` (a block's four linear "
       "layers, the default), `qkv`, `attn_out`, `mlp_up`, `mlp_down`, `lm_head` (the LM head, whose dynamic "
       "scales then cover one chunk of its rows at a time; `all,lm_head` adds it to the blocks'), `experts` (the "
       "routed experts of sparse blocks; needs `precision.fp8=delayed`, and they run in the compute dtype until the "
       "first step has recorded their amaxes) and `attention` (the blocks' attention forward: q, k, v and the "
       "probabilities in e4m3, each sequence's head scaled by its own largest value at the time under every recipe; "
       "the backward runs in the compute dtype on the quantised q, k, v; not with `parallel.cp_impl=ring` under "
       "context parallelism; on a GPU, head size 64 or 128 and bf16). Without `attention`, attention runs in the "
       "compute dtype."},
      {"precision.fp8_grad_format",
       "With `precision.fp8`: the output gradients' format in backward, `e5m2` (wider range) or `e4m3`."},
      {"precision.fp8_amax_history",
       "With `precision.fp8=delayed`: how many steps of each tensor's largest magnitude its scale covers (the "
       "largest of them); 1 to 1024. A resumed run whose history length changed keeps the newest steps."},
      {"precision.fp8_weight_gather",
       "With `precision.fp8=tensorwise` and `parallel.zero_stage=3`: all-gather the FP8 layers' weights as e4m3 codes "
       "(one byte a value, each rank casting its shard with the whole weight's scale) instead of in the compute "
       "dtype: half the bytes of a bf16 gather, a quarter of fp32's, and the same products bit for bit. `rowwise` "
       "and `delayed` gather in the compute dtype. Default `true`."},
      {"precision.matmul_algos",
       "Which cuBLASLt algorithm each matrix product runs on a GPU: `heuristic` (the default: cuBLASLt's first "
       "choice, the same on every run), `timed` (the session's first step times cuBLASLt's top 8 candidates for "
       "each product beside the heuristic's, the fastest is chosen, the same on every rank, logged on the `matmul` "
       "line and written to `<out_dir>/matmul_algos.json`; the products run the heuristic's choice in that step "
       "and the chosen ones from the next), or the path of such a file (its choices from the first step; a file "
       "from another GPU or cuBLASLt version is ignored with a warning). Two timed runs may choose differently and "
       "then differ in the last bits; a resumed timed run reads its file back, so it continues bit for bit. On the "
       "CPU backend the setting changes nothing."},
      // ---- data
      {"data.train",
       "Glob of llm.c token shards (`.bin`) to train on; not empty."},
      {"data.val",
       "Glob of validation shards; `\"\"`: no validation."},
      {"data.val_every_steps",
       "Validate every this many steps and after the last one when `val` is set; `0`: never during the run (see "
       "`final_val`); >= 0."},
      {"data.final_val",
       "Validate once after the last step even when `val_every_steps` is `0`. The start-up log's `data` line "
       "says when validation runs and on how many tokens; a validation longer than 10 s logs its progress."},
      {"data.val_tokens",
       "Validation tokens per evaluation, rounded down to whole batches; `0`: the whole validation set; >= 0."},
      {"data.tokenizer",
       "The tokenizer the shards were prepared with: `bytes`, `gpt2`, `llama3`, or the path of a byte-level BPE "
       "`tokenizer.json` (or of a folder holding one); `\"\"`: the one `model.vocab_size` implies (256, 50257, "
       "128256), as before the key existed. The run checks that `model.vocab_size` is at least its vocabulary, "
       "prints training samples with it, and records it in each checkpoint (a path's file is copied in), so "
       "`picotrain sample` and `convert --format hf` use it."},
      // ---- eval
      {"eval.task",
       "A multiple-choice task in HellaSwag's JSONL format (`ctx`, `endings`, `label` per line; "
       "`scripts/get_data.sh --hellaswag` fetches HellaSwag's validation set) scored during training as llm.c "
       "scores HellaSwag: each ending's loss given its context, accuracy by the summed (`<name>_acc`) and by the "
       "per-token mean loss (`<name>_acc_norm`) in `metrics.jsonl`, the step line and the run report. Tokenized "
       "with the run's tokenizer (`data.tokenizer`, else the one `model.vocab_size` implies); rows of "
       "`batch.seq_len` tokens, longer contexts cut from the left, an example whose ending alone does not fit "
       "skipped. `\"\"`: none. See [evaluation](running.md#evaluation)."},
      {"eval.every_steps",
       "Score `task` every this many steps and after the last one; `0`: after the last step only; >= 0."},
      {"eval.max_examples",
       "Score the task's first this many examples; `0`: all of them; >= 0."},
      {"eval.name",
       "The task's name in the log's fields (`<name>_acc`, `<name>_acc_norm`); `\"\"`: the task file's name up "
       "to its first `_` or `.` (`hellaswag_val.jsonl`: `hellaswag`)."},
      // ---- checkpoint
      {"checkpoint.dir",
       "Checkpoint directory; `\"\"`: `<run.out_dir>/checkpoints`."},
      {"checkpoint.every_steps",
       "Save every this many steps; `0`: no periodic checkpoints (the end of the run is still saved, see "
       "`final`, and so is a stop signal's step); >= 0."},
      {"checkpoint.final",
       "Save the end of a run that finished its steps, whatever `every_steps` is (once: a last step already "
       "saved is not written again), so the run leaves its trained model; the log's `done` line and the run "
       "report name it. `false`: no final save, for runs that only measure (benchmarks)."},
      {"checkpoint.keep_latest",
       "The newest checkpoints kept; older ones are deleted once a newer one is committed; >= 2 (the newest may "
       "be half-written when the run dies)."},
      {"checkpoint.keep_every",
       "Milestones: checkpoints at a multiple of this step are never deleted; `0`: none; >= 0."},
      {"checkpoint.save_timeout_s",
       "A save still running after this many seconds ends the rank like a hang (exit code 1, a message naming "
       "the save and whom the rank waits for), when the run has a watchdog (`run.hang_timeout_s`): a rank lost "
       "while the others wait in the save's agreements, or a stalled file system. The log's `checkpoint| ... "
       "saved (N s)` line says how long saves take; `0`: no limit; >= 0."},
      {"checkpoint.resume",
       "`none` (start fresh; refused when `dir` already holds checkpoints), `auto` (the newest valid checkpoint "
       "in `dir`; a fresh start when there is none), or a path (a `step_N` directory, or a checkpoint "
       "directory: its `latest`); not empty. See [checkpoints](checkpoints.md#saving-and-resuming)."},
      // ---- logging
      {"logging.every_steps",
       "Print a step line and append to the metrics file every this many steps; >= 1."},
      {"logging.metrics_file",
       "One JSON object per logged step, relative to `run.out_dir`; not empty."},
      {"logging.peak_tflops",
       "Peak TFLOP/s of one device for MFU; `0`: from the device table (GPU) or measured (CPU); >= 0."},
      {"logging.flops_formula",
       "FLOPs per token used for TFLOP/s and MFU: `palm` (PaLM: 6N + attention) or `llmc` (llm.c's, to compare "
       "with its logs)."},
      {"logging.sample_every",
       "Print a text sample in the log every this many steps and after the last one; `0`: never; >= 0. The "
       "tokenizer follows `model.vocab_size` (256: bytes, 50257: GPT-2, files in `data/gpt2`); without one, "
       "samples are skipped with one warning. See [sampling](sampling.md)."},
      {"logging.sample_prompt",
       "The text the log's samples continue (any text; `\"\"`: from the start of a document)."},
      {"logging.sample_tokens",
       "Tokens per log sample (fewer when GPT-2 ends the text first); >= 1."},
  };
  return meanings;
}

}  // namespace pt::config
