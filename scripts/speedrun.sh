#!/usr/bin/env bash
# The speedrun: from a fresh machine to a trained model that writes text, top to bottom.
#
#   1. install what the build needs (Debian packages)
#   2. build picotrain (Release; the CUDA backend is compiled when nvcc is present)
#   3. fetch the GPT-2 tokenizer and build an offline English corpus (Brown + Jane Austen +
#      King James Bible, ~14 MB)
#   4. tokenize it with GPT-2's BPE into llm.c-format shards (~3.4 M tokens, about a second)
#   5. train configs/tiny-gpt2.json on the CPU (7.3M parameters, 150 steps of 1024 tokens, 2.5
#      minutes on 2 cores), printing the log with a sample every 50 steps and saving checkpoints
#   6. sample from the final checkpoint (fixed seed: the same text for the same weights)
#
# Usage: scripts/speedrun.sh [--steps N] [--config FILE] [-- extra picotrain train flags]
# Environment: BUILD_DIR (default build), DATA_DIR (default data), RUN_DIR (default runs/speedrun),
# CUDA=ON|OFF (default: ON when nvcc is found; training runs on the CPU either way).
# Every speedrun trains from scratch into RUN_DIR; a previous speedrun there is moved to
# RUN_DIR.previous (replacing the one before it), so a re-run never fails on old checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=""
CONFIG=configs/tiny-gpt2.json
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "speedrun: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build}
DATA_DIR=${DATA_DIR:-data}
RUN_DIR=${RUN_DIR:-runs/speedrun}
PICOTRAIN="$BUILD_DIR/picotrain"
# The config's vocabulary picks the tokenizer: 256 is the byte-level one (configs/tiny.json),
# anything else (or no vocab_size: GPT-2's 50257 is the default) GPT-2's.
TOKENIZER=gpt2
SHARDS="$DATA_DIR/tiny_gpt2"
if grep -Eq '"vocab_size"[[:space:]]*:[[:space:]]*256[^0-9]' "$CONFIG"; then TOKENIZER=bytes; SHARDS="$DATA_DIR/tiny"; fi

echo "== 1/6 setup"
scripts/setup.sh

echo "== 2/6 build"
CUDA_FLAG=${CUDA:-OFF}
if [ -z "${CUDA:-}" ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  CUDA_FLAG=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA="$CUDA_FLAG" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target picotrain

echo "== 3/6 tokenizer and corpus"
scripts/get_data.sh "$DATA_DIR/raw"

echo "== 4/6 tokenize ($TOKENIZER)"
if ! ls "$SHARDS"/corpus_train_*.bin >/dev/null 2>&1; then
  "$PICOTRAIN" prepare --tokenizer "$TOKENIZER" --input "$DATA_DIR/raw" --out "$SHARDS" --name corpus
else
  echo "shards already in $SHARDS"
fi

echo "== 5/6 train"
if [ -e "$RUN_DIR" ]; then
  rm -rf "$RUN_DIR.previous"
  mv "$RUN_DIR" "$RUN_DIR.previous"
  echo "the previous speedrun's $RUN_DIR is now $RUN_DIR.previous; this one starts from scratch"
fi
ARGS=(train --config "$CONFIG" --set "run.out_dir=$RUN_DIR"
      --set "data.train=$SHARDS/corpus_train_*.bin" --set "data.val=$SHARDS/corpus_val_*.bin")
[ -n "$STEPS" ] && ARGS+=(--set "schedule.total_steps=$STEPS")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# With checkpoint.every_steps 0 a run saves only on a stop signal; the sample needs one at the end.
"$PICOTRAIN" "${ARGS[@]}" --set checkpoint.every_steps=50 "${EXTRA[@]}"

echo "== 6/6 sample"
"$PICOTRAIN" sample --checkpoint "$RUN_DIR/checkpoints" --prompt "In the beginning" -n 64 --seed 1337
