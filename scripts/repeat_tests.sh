#!/usr/bin/env bash
# Runs a ctest label over and over, with the machine's cores kept busy, and reports how often each
# test failed: the way to find a flaky test before CI does.
#   scripts/repeat_tests.sh -L mpi -n 30             # 30 rounds of the mpi tests, under load
#   scripts/repeat_tests.sh -L unit -n 30 -j 2
#   scripts/repeat_tests.sh -L mpi -n 5 --no-load     # without the busy loops
#   scripts/repeat_tests.sh -L mpi -n 30 --nice 10    # busy loops at a lower priority
#   BUILD_DIR=build-x scripts/repeat_tests.sh ...     # default: build/ (built by scripts/test.sh)
# Exit code 0 when every round passed, 1 when any test failed once, 2 for bad usage.
# Each round's ctest log is kept in $BUILD_DIR/repeat/<label>-<round>.log.
set -uo pipefail
cd "$(dirname "$0")/.."

LABEL="" ROUNDS=30 JOBS=$(nproc) LOAD=1 NICE=0 EXTRA=()
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -L) LABEL=${2:?-L needs a label}; shift 2 ;;
    -n) ROUNDS=${2:?-n needs a count}; shift 2 ;;
    -j) JOBS=${2:?-j needs a count}; shift 2 ;;
    -R) EXTRA+=(-R "${2:?-R needs a regex}"); shift 2 ;;
    --no-load) LOAD=0; shift ;;
    --nice) NICE=${2:?--nice needs a niceness}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "repeat_tests.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$LABEL" ] || { echo "repeat_tests.sh: -L LABEL is required (unit, mpi, gpu, torch)" >&2; exit 2; }
case "$ROUNDS" in ''|*[!0-9]*|0) echo "repeat_tests.sh: -n must be a count >= 1, got '$ROUNDS'" >&2; exit 2 ;; esac
BUILD_DIR=${BUILD_DIR:-build}
[ -f "$BUILD_DIR/CTestTestfile.cmake" ] || { echo "repeat_tests.sh: no tests in $BUILD_DIR (run scripts/test.sh first)" >&2; exit 2; }

# As scripts/test.sh runs them: root may run mpirun, ranks oversubscribe, shared memory only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

# Load: one busy loop per core (at niceness --nice, default 0: the tests' own priority), for as
# long as the rounds run. At equal priority the multi-rank tests slow down many times over: ranks
# wait on each other in every collective, and each waits for the scheduler to give it a core.
LOADERS=()
stop_load() { for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_load EXIT
if [ "$LOAD" = 1 ]; then
  for _ in $(seq "$(nproc)"); do nice -n "$NICE" bash -c 'while :; do :; done' & LOADERS+=($!); done
fi

LOGS="$BUILD_DIR/repeat"
mkdir -p "$LOGS"
declare -A FAILS=()
failed_rounds=0
start=$(date +%s)
for round in $(seq "$ROUNDS"); do
  log="$LOGS/$LABEL-$round.log"
  t0=$(date +%s)
  ctest --test-dir "$BUILD_DIR" -L "$LABEL" "${EXTRA[@]}" -j "$JOBS" --output-on-failure >"$log" 2>&1
  rc=$?
  # ctest's summary names each failed test: "  12 - mpi_launch (Failed)".
  failed=$(sed -n '/The following tests FAILED:/,$p' "$log" | sed -n 's/^[[:space:]]*[0-9]\+ - \([^ ]*\) (.*/\1/p')
  tests=$(sed -n 's/.*tests passed, [0-9]\+ tests failed out of \([0-9]\+\)/\1/p' "$log" | tail -1)
  if [ "$rc" != 0 ]; then
    failed_rounds=$((failed_rounds + 1))
    [ -n "$failed" ] || failed="(ctest exit $rc, see $log)"
    for t in $failed; do FAILS[$t]=$(( ${FAILS[$t]:-0} + 1 )); done
  fi
  now=$(date +%s)
  eta=$(( (now - start) * (ROUNDS - round) / round ))
  printf 'round %d/%d: %s tests, %s in %d s | ETA %dm%02ds\n' "$round" "$ROUNDS" "${tests:-?}" \
    "$([ "$rc" = 0 ] && echo passed || echo "FAILED: $(echo $failed | tr '\n' ' ')")" $((now - t0)) \
    $((eta / 60)) $((eta % 60))
done

echo "label $LABEL: $ROUNDS rounds in $(( $(date +%s) - start )) s, $([ "$LOAD" = 1 ] && echo "$(nproc) busy loops at niceness $NICE" || echo "no load")"
if [ "$failed_rounds" = 0 ]; then
  echo "$ROUNDS passed, 0 failed"
  exit 0
fi
echo "failures per test (logs in $LOGS):"
for t in "${!FAILS[@]}"; do printf '  %-40s %d of %d rounds\n' "$t" "${FAILS[$t]}" "$ROUNDS"; done
echo "$((ROUNDS - failed_rounds)) passed, $failed_rounds failed"
exit 1
