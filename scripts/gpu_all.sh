#!/usr/bin/env bash
# One device call: scripts/gpu_check.sh (correctness), then bench/gpu_bench.sh (speed) with what
# is left of TOTAL_S, then everything packed for the trip back. Made for a lent GPU machine whose
# call returns at most a few files: the logs travel as one archive.
#
#   scripts/gpu_all.sh                    # results in $OUT: summary.txt, bench_summary.md, gpu_logs.tgz
#   TOTAL_S=480 SKIP_CHECK=1 scripts/gpu_all.sh   # the benchmarks alone
#   DRY_RUN=1 scripts/gpu_all.sh          # runs nothing: the benchmarks' commands and timeouts
#
# Environment: OUT (default build-gpucheck/gpu_all), TOTAL_S (540: the whole call's seconds),
# SKIP_CHECK / SKIP_BENCH (1 skips that half), and what gpu_check.sh and gpu_bench.sh read.
# Exit status: gpu_check.sh's (the benchmarks' state is in bench_summary.md).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=${OUT:-$ROOT/build-gpucheck/gpu_all}
TOTAL_S=${TOTAL_S:-540}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/picotrain_gpu_all.XXXXXX")
START=$(date +%s)
mkdir -p "$DEST"

check_rc=0
if [ "${DRY_RUN:-0}" = 1 ]; then
  # gpu_check.sh has no dry run (it builds, or unpacks .gpubin, then runs the tests): it is named,
  # not run, and the benchmarks print their commands (bench/gpu_bench.sh reads DRY_RUN too).
  echo "[dry run] scripts/gpu_check.sh: not run (build or .gpubin, every gpu test under TEST_LIMIT, the PyTorch"
  echo "          reference, mpi_gpu_parity, 20 steps of GPT-2 124M, compute-sanitizer over SANITIZE)"
  SKIP_CHECK=1
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  OUT=$WORK/check bash scripts/gpu_check.sh >"$WORK/gpu_check.log" 2>&1
  check_rc=$?
  cp "$WORK/check/summary.txt" "$DEST/summary.txt" 2>/dev/null
  tail -n 40 "$WORK/gpu_check.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  budget=$((TOTAL_S - ($(date +%s) - START) - 15))
  echo "gpu_all: ${budget} s left for the benchmarks"
  OUT=$WORK/bench BUDGET_S=$budget bash bench/gpu_bench.sh >"$WORK/gpu_bench.log" 2>&1
  cp "$WORK/bench/bench_summary.md" "$DEST/bench_summary.md" 2>/dev/null
  grep '^gpu_bench:\|^\[dry run\]' "$WORK/gpu_bench.log"
  cat "$WORK/bench/bench_summary.md" 2>/dev/null
fi
tar czf "$DEST/gpu_logs.tgz" -C "$WORK" .
echo "gpu_all: $(($(date +%s) - START)) s; logs in $DEST/gpu_logs.tgz ($(du -h "$DEST/gpu_logs.tgz" | cut -f1))"
exit $check_rc
