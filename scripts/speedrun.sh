#!/usr/bin/env bash
# The speedrun: from a fresh machine to a trained model, top to bottom.
#
#   1. install what the build needs (Debian packages)
#   2. build picotrain (Release; the CUDA backend is compiled when nvcc is present)
#   3. build an offline English corpus (Brown + Jane Austen + King James Bible, ~14 MB)
#   4. tokenize it into llm.c-format shards (byte-level vocabulary for now)
#   5. train configs/tiny.json on the CPU, printing the log
#
# Usage: scripts/speedrun.sh [--steps N] [--config FILE] [-- extra picotrain train flags]
# Environment: BUILD_DIR (default build), DATA_DIR (default data).
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=""
CONFIG=configs/tiny.json
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "speedrun: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build}
DATA_DIR=${DATA_DIR:-data}

echo "== 1/5 setup"
scripts/setup.sh

echo "== 2/5 build"
CUDA_FLAG=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_FLAG=ON; export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA="$CUDA_FLAG" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target picotrain

echo "== 3/5 corpus"
scripts/get_data.sh "$DATA_DIR/raw"

echo "== 4/5 tokenize"
if ! ls "$DATA_DIR"/tiny/corpus_train_*.bin >/dev/null 2>&1; then
  "$BUILD_DIR/picotrain" prepare --tokenizer bytes --input "$DATA_DIR/raw" --out "$DATA_DIR/tiny" --name corpus
else
  echo "shards already in $DATA_DIR/tiny"
fi

echo "== 5/5 train"
ARGS=(train --config "$CONFIG" --set "data.train=$DATA_DIR/tiny/corpus_train_*.bin" --set "data.val=$DATA_DIR/tiny/corpus_val_*.bin")
[ -n "$STEPS" ] && ARGS+=(--set "schedule.total_steps=$STEPS")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
"$BUILD_DIR/picotrain" "${ARGS[@]}" "${EXTRA[@]}"
