#!/usr/bin/env bash
# Issue #9's GPU speed benchmarks and issue #30's attention comparison, unattended on one GPU within
# one device call (BUDGET_S, default 540 s), ending in one summary ($OUT/bench_summary.md: ours,
# PyTorch, ratio, target, met?):
#   1. build Release for this GPU: picotrain and bench/kernel_bench, configured exactly as
#      scripts/gpu_check.sh does (same build folder by default, so after gpu_check little rebuilds),
#      or none: scripts/gpu_pack.sh's prebuilt .gpubin when it starts here (GPU_BIN, as gpu_check)
#   2. bench/kernel_bench: every op of a GPT-2 124M and 1.5B training step, CUDA events, against the
#      copy bandwidth and matmul rate measured in the run
#   3. bench/kernel_bench --model none: our attention (issue #30), causal, forward, backward and both,
#      hd 64/128, T 1k/2k/4k/8k/16k (B*T 16384, NH*hd 2048), multi-head and grouped-query 8:1
#   4. bench/attention_sdpa.py: PyTorch's flash and cuDNN SDPA back ends at the same shapes
#      (steps 3-4: ATTN_WARMUP untimed + ATTN_REPS timed calls per measurement; about a minute together)
#   5. synthetic llm.c shards (bench/synthetic_shards.py: English-like Zipf token frequencies)
#   6. picotrain train, GPT-2 124M bf16, T 1024, B 64 x 8 micro-batches (524288 tokens/step, the
#      llm.c recipe), STEPS_124M steps; tokens/s and MFU from metrics.jsonl after SKIP_124M steps
#   7. bench/torch_gpt2.py at the same shape and tokens (torch.compile, flash SDPA, fused AdamW)
#   8. picotrain train, GPT-2 1.5B (configs/gpt2-1.5b.json), B 8 x 16, STEPS_15B steps: MFU; then
#      a Llama of Llama 3.2 1B's shape (configs/llama3-1b.json, T 2048), B 8 x ACCUM_1B: MFU
#   9. with FP8=1 (issue #35), after them: the same 1.5B and Llama 1B runs with precision.fp8=tensorwise
#      (every block layer's product in FP8), for tokens/s and the loss gap against the bf16 runs
#  10. bench/bench_summary.py: the summary
# ATTN_ONLY=1 runs steps 1, 3, 4 and 9 alone (builds kernel_bench only): the attention comparison
# in a short second device call.
# Every step runs under `timeout`, capped by what is left of the budget; a step that no longer fits
# is skipped and says so, so one hang cannot eat the device call. Steps 6-8 use zero_stage 0 (on one
# GPU every stage runs as ZeRO-0 anyway) and no validation, sampling or checkpoints.
# Made for a GPU machine with nvcc, CMake, Ninja and PyTorch but no package manager: libraries it
# lacks come from .deps/ (scripts/fetch_deps.sh, then carry .deps along), as for gpu_check.sh.
#
#   bench/gpu_bench.sh                 # results in $OUT (default BUILD_DIR/gpu_bench)
#   DRY_RUN=1 bench/gpu_bench.sh       # print every command with its timeout; run nothing
#   ATTN_ONLY=1 bench/gpu_bench.sh     # the attention comparison alone
#
# Environment: BUILD_DIR (build-gpucheck), OUT, JOBS (nproc), BUDGET_S (540), PYTHON (python3),
# ATTN_ONLY (0), ATTN_WARMUP (2), ATTN_REPS (10),
# STEPS_124M (20), SKIP_124M (5), B_124M (64), ACCUM_124M (8), STEPS_15B (10), SKIP_15B (3),
# B_15B (8), ACCUM_15B (16), STEPS_1B (8), SKIP_1B (3), B_1B (8), ACCUM_1B (8), TORCH_15B (0; 1 also runs torch_gpt2.py at 1.5B, if time is left),
# RUN_124M (1; 0 leaves out steps 6-7, the 124M runs, to give a short call's time to the others),
# TIMED_ALGOS (0; 1 also runs the 124M training run with precision.matmul_algos=timed, as long again),
# MOE (0; 1 also runs a small Mixtral, configs/mixtral-small.json, at the Llama 1B's batch and steps),
# GRAPHS (0; 1 also runs the 124M and Llama 1B runs with run.cuda_graphs=true, as long again),
# HOPPER_BWD (0; 1 also runs the 124M and Llama 1B runs with PICOTRAIN_FLASH_BACKWARD=auto: the
# Hopper attention backward, as long again),
# FP8 (0; 1 also runs step 9, about as long again as the 1.5B and 1B runs: run it where the budget
# allows, e.g. a second call with a larger BUDGET_S),
# NSYS (0; 1 also profiles 6 steps of 124M at 2 micro-batches under `nsys profile --stats=true`;
# on the lent H100s of 2026-11 nsys was not on the PATH), GPU_BIN (as scripts/gpu_check.sh: the
# prebuilt .gpubin by default when present; empty builds here).
# Exit status: 0 when every step ran (whether or not the targets are met), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpucheck}
OUT=${OUT:-$BUILD/gpu_bench}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${BUDGET_S:-540}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
STEPS_124M=${STEPS_124M:-20} SKIP_124M=${SKIP_124M:-5} B_124M=${B_124M:-64} ACCUM_124M=${ACCUM_124M:-8}
STEPS_15B=${STEPS_15B:-10} SKIP_15B=${SKIP_15B:-3} B_15B=${B_15B:-8} ACCUM_15B=${ACCUM_15B:-16}
STEPS_1B=${STEPS_1B:-8} SKIP_1B=${SKIP_1B:-3} B_1B=${B_1B:-8} ACCUM_1B=${ACCUM_1B:-8} T_1B=2048
TORCH_15B=${TORCH_15B:-0} NSYS=${NSYS:-0}
RUN_124M=${RUN_124M:-1}
ATTN_ONLY=${ATTN_ONLY:-0} ATTN_WARMUP=${ATTN_WARMUP:-2} ATTN_REPS=${ATTN_REPS:-10}
T=1024
RESERVE_S=20  # kept for the summary
mkdir -p "$OUT" "$BUILD"
export PATH="/usr/local/cuda/bin:$PATH"
export PYTHONUNBUFFERED=1
# torch.compile's cache in the build folder: a second call on a warm machine compiles less.
export TORCHINDUCTOR_CACHE_DIR="$BUILD/inductor_cache"
START=$(date +%s)
FAILED=0
: >"$OUT/steps.tsv"

left() { echo $((BUDGET_S - ($(date +%s) - START))); }
record() {  # NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$OUT/steps.tsv"
  echo "gpu_bench: $1: $2 (${3} s) $4"
}

# step NAME MAX_S LOG CMD...: runs CMD (output to LOG) under a timeout of MAX_S seconds or what is
# left of the budget, whichever is less; skipped when under 20 s would be left for it.
step() {
  local name=$1 max=$2 log=$3
  shift 3
  local avail=$(($(left) - RESERVE_S))
  local limit=$((max < avail ? max : avail))
  if [ "$DRY_RUN" = 1 ]; then
    printf '[dry run] %s: timeout %s %s > %s\n' "$name" "$max" "$*" "$log"
    return 0
  fi
  if [ "$limit" -lt 20 ]; then
    record "$name" skip 0 "out of budget (${avail} s left)"
    FAILED=1
    return 99
  fi
  local t0
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  case $rc in
    0) record "$name" ok "$dt" "$(basename "$log")" ;;
    124 | 137) record "$name" TIMEOUT "$dt" "killed after ${limit} s; see $(basename "$log")"; FAILED=1 ;;
    *)
      # The first error line, else the last line: what to look at first.
      local why
      why=$(grep -m1 -iE '^error|error:|Traceback' "$log" || tail -1 "$log")
      record "$name" FAIL "$dt" "rc $rc: $(echo "$why" | cut -c1-160)"
      FAILED=1
      ;;
  esac
  return $rc
}

# finish: step 9, the summary of whatever ran, and the exit status; ATTN_ONLY=1 comes here after step 4.
finish() {
  if [ "$DRY_RUN" = 1 ]; then
    echo "[dry run] summary: $PYTHON bench/bench_summary.py $OUT --skip-124m $SKIP_124M --skip-15b $SKIP_15B --skip-1b $SKIP_1B"
    exit 0
  fi
  echo "gpu_bench: $(($(date +%s) - START)) s of the ${BUDGET_S} s budget used"
  "$PYTHON" bench/bench_summary.py "$OUT" --skip-124m "$SKIP_124M" --skip-15b "$SKIP_15B" --skip-1b "$SKIP_1B" ||
    FAILED=1
  echo "gpu_bench: summary in $OUT/bench_summary.md"
  exit $FAILED
}

# ---- the machine ---------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The sources' fingerprint, not the copy's .git (a device copy's may be stale): the prebuilt
  # binaries' BUILD_INFO (the build row) records the same fingerprint and their commit.
  echo "sources: $(bash scripts/source_hash.sh)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "nvcc: $(nvcc --version 2>&1 | tail -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1)"
  echo "python: $($PYTHON -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"
  echo "cpu: $(nproc) cores"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
# ---- 1. build (the same configuration as scripts/gpu_check.sh), or its prebuilt binaries -----------
source scripts/gpu_cmake_args.sh  # ARCHS, CMAKE_ARGS
source scripts/gpu_prebuilt.sh    # GPU_BIN: scripts/gpu_pack.sh's folder when it starts here
if [ -n "$GPU_BIN" ]; then
  PICOTRAIN=$GPU_BIN/picotrain KERNEL_BENCH=$GPU_BIN/kernel_bench BUILT=0
  record build ok 0 "prebuilt: $(tr '\n' ' ' <"$GPU_BIN/BUILD_INFO")"
else
  # One command for `timeout`: configure, then only the targets this run uses.
  TARGETS="picotrain kernel_bench"
  [ "$ATTN_ONLY" = 1 ] && TARGETS=kernel_bench
  printf -v BUILD_CMD '%q ' cmake "${CMAKE_ARGS[@]}"
  BUILD_CMD+="&& cmake --build $(printf '%q' "$BUILD") -j $JOBS --target $TARGETS"
  step build 300 "$OUT/build.log" bash -c "$BUILD_CMD"
  BUILT=$?
  PICOTRAIN="$BUILD/picotrain" KERNEL_BENCH="$BUILD/bench/kernel_bench"
fi
[ "$DRY_RUN" = 1 ] && BUILT=0

# ---- 2-3. kernel benchmark: the training step's ops (6 s on the H100 of 2026-11), then attention --------
# Two calls, so that each has its own timeout and a failing attention shape cannot lose the op table.
if [ $BUILT -ne 0 ]; then
  record kernel_bench skip 0 "no build"
  record kernel_attention skip 0 "no build"
else
  if [ "$ATTN_ONLY" != 1 ]; then
    step kernel_bench 90 "$OUT/kernel_bench.log" "$KERNEL_BENCH" --model 124m --model 1.5b --no-attention \
      --b124 "$B_124M" --accum124 "$ACCUM_124M" --b15 "$B_15B" --accum15 "$ACCUM_15B" -T "$T" \
      --json "$OUT/kernel_bench.json" --md "$OUT/kernel_bench.md"
  fi
  # 20 shapes x 3 measurements x (ATTN_WARMUP + ATTN_REPS) calls: about 10 s at 120 TFLOP/s.
  step kernel_attention 60 "$OUT/kernel_attention.log" "$KERNEL_BENCH" --model none \
    --attention-warmup "$ATTN_WARMUP" --attention-reps "$ATTN_REPS" \
    --json "$OUT/kernel_attention.json" --md "$OUT/kernel_attention.md"
fi

# ---- 4. PyTorch SDPA, flash and cuDNN -------------------------------------------------------------------
# The same 20 shapes on two back ends: about 10 s of attention at 300 TFLOP/s, plus importing torch
# and building cuDNN's graphs.
step attention_sdpa 90 "$OUT/attention_sdpa.log" "$PYTHON" bench/attention_sdpa.py --backends flash cudnn \
  --warmup "$ATTN_WARMUP" --reps "$ATTN_REPS" --json "$OUT/attention_sdpa.json"

if [ "$ATTN_ONLY" = 1 ]; then
  record training skip 0 "ATTN_ONLY=1: no op table, training runs or PyTorch GPT-2"
  finish
fi

# picotrain_run NAME CONFIG B ACCUM STEPS MAX_S [PREFIX...]: a short training run (PREFIX: a profiler
# command to run it under) at sequence length RUN_T (default T); its metrics.jsonl into $OUT/NAME.jsonl. It only measures: no checkpoint
# at all (checkpoint.final=false: a 1.5B one would be 18 GB of writes the timing does not need).
picotrain_run() {
  local name=$1 config=$2 b=$3 accum=$4 steps=$5 max=$6 t=${RUN_T:-$T}
  shift 6
  local run="$BUILD/bench_runs/$name"
  [ "$DRY_RUN" = 1 ] || rm -rf "$run"
  step "$name" "$max" "$OUT/$name.log" "$@" "$PICOTRAIN" train --device cuda --config "$config" \
    --set run.out_dir="$run" --set "data.train=$TRAIN" --set data.val= \
    --set batch.micro_batch_size="$b" --set batch.seq_len="$t" --set batch.global_batch_tokens=$((b * t * accum)) \
    --set schedule.total_steps="$steps" --set schedule.warmup_steps=2 --set logging.every_steps=1 \
    --set logging.sample_every=0 --set parallel.zero_stage=0 --set checkpoint.every_steps=0 \
    --set checkpoint.final=false ${RUN_SET:+--set "$RUN_SET"}
  local rc=$?
  [ "$DRY_RUN" = 1 ] || cp "$run/metrics.jsonl" "$OUT/$name.jsonl" 2>/dev/null
  return $rc
}

# ---- 5. synthetic shards -------------------------------------------------------------------------------
DATA="$BUILD/bench_data"
step synthetic_data 60 "$OUT/synthetic_data.log" "$PYTHON" bench/synthetic_shards.py "$DATA" --tokens 8000000
TRAIN="$DATA/synthetic_train_*.bin"

# ---- 6-8. training throughput ---------------------------------------------------------------------------
if [ "$RUN_124M" != 1 ]; then
  record picotrain_124m skip 0 "RUN_124M=0"
  record torch_124m skip 0 "RUN_124M=0"
else
  if [ $BUILT -eq 0 ]; then
    picotrain_run picotrain_124m configs/gpt2-124m.json "$B_124M" "$ACCUM_124M" "$STEPS_124M" 150
  else
    record picotrain_124m skip 0 "no build"
  fi
  step torch_124m 240 "$OUT/torch_124m.log" "$PYTHON" bench/torch_gpt2.py --model 124m -B "$B_124M" -T $T \
    --grad-accum "$ACCUM_124M" --steps $((STEPS_124M - SKIP_124M)) --warmup "$SKIP_124M" \
    --data "$DATA/synthetic_train_000000.bin" --json "$OUT/torch_124m.json"
fi
if [ $BUILT -eq 0 ]; then
  picotrain_run picotrain_1.5b configs/gpt2-1.5b.json "$B_15B" "$ACCUM_15B" "$STEPS_15B" 200
  RUN_T=$T_1B picotrain_run picotrain_llama1b configs/llama3-1b.json "$B_1B" "$ACCUM_1B" "$STEPS_1B" 150
else
  record picotrain_1.5b skip 0 "no build"
  record picotrain_llama1b skip 0 "no build"
fi
# Optional (TIMED_ALGOS=1): the 124M run again with precision.matmul_algos=timed (its log's `matmul`
# line says what the timing chose; the summary puts its tokens/s beside the heuristic's).
if [ "${TIMED_ALGOS:-0}" = 1 ] && [ "$RUN_124M" = 1 ]; then
  if [ $BUILT -eq 0 ]; then
    RUN_SET=precision.matmul_algos=timed picotrain_run picotrain_124m_timed configs/gpt2-124m.json "$B_124M" \
      "$ACCUM_124M" "$STEPS_124M" 150
  else
    record picotrain_124m_timed skip 0 "no build"
  fi
fi
# Optional (GRAPHS=1): the 124M and Llama 1B runs again with their forwards and backwards replayed as
# CUDA graphs (the log's `graphs` line says when they were recorded, or why not).
if [ "${GRAPHS:-0}" = 1 ]; then
  if [ $BUILT -eq 0 ]; then
    if [ "$RUN_124M" = 1 ]; then
      RUN_SET=run.cuda_graphs=true picotrain_run picotrain_124m_graphs configs/gpt2-124m.json "$B_124M" \
        "$ACCUM_124M" "$STEPS_124M" 150
    fi
    RUN_SET=run.cuda_graphs=true RUN_T=$T_1B picotrain_run picotrain_llama1b_graphs configs/llama3-1b.json "$B_1B" \
      "$ACCUM_1B" "$STEPS_1B" 150
  else
    record picotrain_graphs skip 0 "no build"
  fi
fi
# Optional (HOPPER_BWD=1): the 124M and Llama 1B runs again with the Hopper attention backward
# (PICOTRAIN_FLASH_BACKWARD=auto; where the GPU has no Hopper kernel it is the sm_80 one).
if [ "${HOPPER_BWD:-0}" = 1 ]; then
  if [ $BUILT -eq 0 ]; then
    if [ "$RUN_124M" = 1 ]; then
      picotrain_run picotrain_124m_sm90bwd configs/gpt2-124m.json "$B_124M" "$ACCUM_124M" "$STEPS_124M" 150 \
        env PICOTRAIN_FLASH_BACKWARD=auto
    fi
    RUN_T=$T_1B picotrain_run picotrain_llama1b_sm90bwd configs/llama3-1b.json "$B_1B" "$ACCUM_1B" "$STEPS_1B" 150 \
      env PICOTRAIN_FLASH_BACKWARD=auto
  else
    record picotrain_sm90bwd skip 0 "no build"
  fi
fi
# Optional (FP8=1): the 1.5B and 1B runs again with every block layer's product in FP8.
if [ "${FP8:-0}" = 1 ]; then
  if [ $BUILT -eq 0 ]; then
    RUN_SET=precision.fp8=tensorwise picotrain_run picotrain_1.5b_fp8 configs/gpt2-1.5b.json "$B_15B" "$ACCUM_15B" \
      "$STEPS_15B" 200
    RUN_SET=precision.fp8=tensorwise RUN_T=$T_1B picotrain_run picotrain_llama1b_fp8 configs/llama3-1b.json "$B_1B" \
      "$ACCUM_1B" "$STEPS_1B" 150
  else
    record picotrain_fp8 skip 0 "no build"
  fi
fi
# Optional (MOE=1): a small Mixtral (configs/mixtral-small.json: the Llama 1B's attention, 8 experts
# of width 2048, top-2 in every block) at the Llama 1B's batch: the routed experts' grouped products.
if [ "${MOE:-0}" = 1 ]; then
  if [ $BUILT -eq 0 ]; then
    RUN_T=$T_1B picotrain_run picotrain_mixtral_small configs/mixtral-small.json "$B_1B" "$ACCUM_1B" "$STEPS_1B" 150
  else
    record picotrain_mixtral_small skip 0 "no build"
  fi
fi
# Optional: Nsight Systems over a few 124M steps, for the measured per-kernel time of real steps
# (gaps and host syncs included); the report stays in $BUILD, its kernel summary goes to the log.
if [ "$NSYS" = 1 ] && [ $BUILT -eq 0 ]; then
  if command -v nsys >/dev/null 2>&1; then
    picotrain_run nsys_124m configs/gpt2-124m.json "$B_124M" 2 6 150 nsys profile --stats=true --force-overwrite=true \
      --output "$BUILD/nsys_124m"
  else
    record nsys_124m skip 0 "NSYS=1 but no nsys on this machine"
  fi
fi
if [ "$TORCH_15B" = 1 ]; then
  step torch_1.5b 240 "$OUT/torch_1.5b.log" "$PYTHON" bench/torch_gpt2.py --model 1.5b -B "$B_15B" -T $T \
    --grad-accum "$ACCUM_15B" --steps $((STEPS_15B - SKIP_15B)) --warmup "$SKIP_15B" \
    --data "$DATA/synthetic_train_000000.bin" --json "$OUT/torch_1.5b.json"
fi
finish
