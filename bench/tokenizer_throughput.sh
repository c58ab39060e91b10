#!/usr/bin/env bash
# Tokenizer throughput of `picotrain prepare` (MB of input text per second of encoding: reading,
# pre-tokenizing, BPE, writing the shards; the ~0.2 s of loading the tokenizer files is not
# counted) for each thread count, best and median of REPEAT runs.
#
#   bench/tokenizer_throughput.sh [--tokenizer gpt2|llama3|bytes|PATH] [--threads "1 2"] [--repeat 5] [INPUT...]
#
# INPUT defaults to data/raw (scripts/get_data.sh); BIN (env) defaults to build/picotrain.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/picotrain}
TOKENIZER=gpt2
THREADS="1 2"
REPEAT=5
INPUTS=()
NAMES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tokenizer) TOKENIZER=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    *) INPUTS+=(--input "$1"); NAMES+=("$1") ;;
  esac
  shift
done
[ ${#INPUTS[@]} -gt 0 ] || { INPUTS=(--input data/raw); NAMES=(data/raw); }
[ -x "$BIN" ] || { echo "tokenizer_throughput.sh: $BIN is not built" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# Other processes share the cores: the load average says how much the numbers below were shared.
echo "tokenizer $TOKENIZER, input ${NAMES[*]}, $REPEAT runs each; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $THREADS; do
  rates=()
  for ((i = 0; i < REPEAT; i++)); do
    line=$("$BIN" prepare --tokenizer "$TOKENIZER" "${INPUTS[@]}" --out "$OUT" --threads "$t" 2>/dev/null)
    # "... (3 documents, 14.3 MB of text, 15.5 MB/s)"
    rates+=("$(sed -E 's/.* ([0-9.]+) MB\/s\)$/\1/' <<<"$line")")
  done
  sorted=$(printf '%s\n' "${rates[@]}" | sort -g)
  echo "threads $t: best $(tail -1 <<<"$sorted") MB/s, median $(sed -n "$(((REPEAT + 1) / 2))p" <<<"$sorted") MB/s" \
    "(runs: ${rates[*]}); $(sed -E 's/ under .*\(/ (/' <<<"$line")"
done
