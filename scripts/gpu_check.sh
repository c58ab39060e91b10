#!/usr/bin/env bash
# Every check of the CUDA backend that needs a GPU, unattended, ending in one summary table:
#   1. build (Release, CUDA for this GPU's architecture; with MPI when the machine has it, for the
#      multi-rank tests), or the prebuilt binaries of scripts/gpu_pack.sh when they start here
#   2. every gpu_* test (each kernel against CpuOps, whole-model parity, the 50-step loss curve,
#      bit-exact resume, NCCL on one rank), all at once, a row each; mpi_gpu_parity under mpirun
#      when this machine has MPI and built it
#   3. scripts/torch_reference.py: an independent PyTorch GPT-2, Llama and Mixtral against the CPU,
#      CUDA fp32 and CUDA bf16 backends (logits, loss, every gradient), beside the tests
#      (test/torch_reference.sh with the CUDA backends added)
#   4. a short GPT-2 124M bf16 training run on synthetic data (20 steps)
#   5. compute-sanitizer memcheck and racecheck over the tests of the kernels last changed (SANITIZE)
# Made for a GPU machine with nvcc, CMake, Ninja and PyTorch but no package manager: libraries it
# lacks come from .deps/ (run scripts/fetch_deps.sh where apt works, then carry .deps along).
# Meant to finish within 10 minutes on one H100/H200 when it builds, about 4 with .gpubin.
#
#   scripts/fetch_deps.sh; scripts/gpu_pack.sh   # here, where apt works: .deps/ and .gpubin/
#   scripts/gpu_check.sh             # on the GPU machine; logs in $OUT (default build-gpucheck/gpu_check/)
#
# Environment: BUILD_DIR, OUT, JOBS, GPU_BIN (prebuilt folder; default .gpubin when present;
# GPU_BIN= builds here; with MPI here mpi_gpu_parity is built here all the same), TEST_LIMIT (240 s
# per test), TORCH_LIMIT (400 s), TORCH_BACKENDS (the reference's backends: "cpu:fp32 cuda:fp32
# cuda:bf16"; "cuda:bf16" alone is the short check), TRAIN_LIMIT (180 s), MPI_LIMIT (300 s: mpi_gpu_parity, np 2 and 4),
# PICOTRAIN_NCCL_LIB (else the libnccl.so.2 of PyTorch's pip wheels), SANITIZE (gpu_attention gpu_attention_block; empty
# skips step 5), SANITIZE_LIMIT (150 s per tool and test), SANITIZE_ARGS (test arguments under it; ~[flash]).
# Writes to $OUT: summary.txt, build.log, tests/<test>.log, torch.log, train.log, metrics.jsonl, report.json.
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpucheck}
OUT=${OUT:-$BUILD/gpu_check}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$BUILD"
export PATH="/usr/local/cuda/bin:$PATH"
export PYTHONUNBUFFERED=1

ROWS=()
FAILED=0
# record NAME STATUS SECONDS DETAIL
record() {
  ROWS+=("$(printf '| %-22s | %-4s | %6s | %s' "$1" "$2" "$3" "$4")")
  [ "$2" = "ok" ] || FAILED=1
  echo "gpu_check: $1: $2 ($3 s) $4"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }'; }

# ---- the machine ----------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The sources' fingerprint (scripts/source_hash.sh), not the copy's .git, which may be stale.
  echo "sources: $(bash scripts/source_hash.sh)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "nvcc: $(nvcc --version 2>&1 | tail -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1)"
  echo "python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
# ---- 1. build --------------------------------------------------------------------------------------
# Prebuilt binaries (scripts/gpu_pack.sh made here, carried as .gpubin) save the GPU machine's
# minutes when they start there; otherwise everything is built here.
t0=$(now)
source scripts/gpu_cmake_args.sh  # ARCHS, CMAKE_ARGS, MPI_FLAG
source scripts/gpu_prebuilt.sh    # GPU_BIN: the prebuilt folder when its binaries start here, else empty
GPU_TESTS=()
for f in test/gpu_*.cpp; do GPU_TESTS+=("$(basename "$f" .cpp)"); done
if [ -n "$GPU_BIN" ]; then
  PICOTRAIN=$GPU_BIN/picotrain REFERENCE_DUMP=$GPU_BIN/reference_dump TEST_BIN=$GPU_BIN
  rc=0
  record build ok "$(elapsed "$t0")" "prebuilt: $(tr '\n' ' ' <"$GPU_BIN/BUILD_INFO")"
else
  PICOTRAIN=$BUILD/picotrain REFERENCE_DUMP=$BUILD/test/reference_dump TEST_BIN=$BUILD/test
  # dp2, tp2, pp2, cp2 (and 4-rank layouts) on this one GPU through the staged MpiComm.
  TARGETS=(picotrain reference_dump "${GPU_TESTS[@]}")
  [ "$MPI_FLAG" = ON ] && TARGETS+=(mpi_gpu_parity)
  {
    echo "cmake ${CMAKE_ARGS[*]}"
    timeout 420 cmake "${CMAKE_ARGS[@]}" &&
      timeout 420 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
  } >"$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    record build ok "$(elapsed "$t0")" "archs $ARCHS, MPI $MPI_FLAG, targets ${TARGETS[*]}"
  else
    record build FAIL "$(elapsed "$t0")" "rc $rc, see build.log: $(grep -m1 -E 'error|Error' "$OUT/build.log" | cut -c1-120)"
  fi
fi
# Without MPI the multi-rank GPU layouts cannot run here: say so in the table, as a failure.
[ "$MPI_FLAG" = ON ] || record "multi-rank gpu tests" FAIL 0 "no MPI (mpicxx, mpirun) on this machine"
# The prebuilt binaries are single-rank (an MPI built elsewhere would not match this machine's):
# with MPI here, mpi_gpu_parity is built here, beside the tests below.
MPI_BUILD_PID=""
if [ "$MPI_FLAG" = ON ] && [ -n "$GPU_BIN" ]; then
  ( echo "cmake ${CMAKE_ARGS[*]}"
    timeout 420 cmake "${CMAKE_ARGS[@]}" && timeout 420 cmake --build "$BUILD" -j "$JOBS" --target mpi_gpu_parity
  ) >"$OUT/build_mpi.log" 2>&1 &
  MPI_BUILD_PID=$!
fi
# A Hopper GPU (compute capability 9.x) must run the Hopper flash forward: PICOTRAIN_REQUIRE_SM90=1
# makes gpu_attention fail, not skip, its Hopper case when the kernel is not available there.
if nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | grep -q '^9\.'; then
  export PICOTRAIN_REQUIRE_SM90=1
fi
# NCCL on one rank (gpu_nccl_comm): PyTorch's pip wheel carries a libnccl.so.2 when the system has none.
# This machine is expected to have NCCL: PICOTRAIN_REQUIRE_NCCL=1 makes the test fail (not warn and
# pass) when it does not load, and a library that cannot be found at all is a failed row of its own.
export PICOTRAIN_REQUIRE_NCCL=1
if [ -z "${PICOTRAIN_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl=$(find_gpu_library libnccl.so.2)
  if [ -n "$nccl" ]; then
    export PICOTRAIN_NCCL_LIB=$nccl && echo "gpu_check: NCCL from $nccl"
  else
    record "nccl library" FAIL 0 "no libnccl.so.2 (ldconfig, CUDA folders, PyTorch): pip install nvidia-nccl-cu12 or set PICOTRAIN_NCCL_LIB"
  fi
fi

# ---- 2. GPU tests (and 3. the PyTorch reference beside them) -----------------------------------------
# Every gpu_* test binary at once (they check, not time: sharing the GPU and the cores changes
# no result), each under its own limit; its Catch2 summary line goes into the table. The PyTorch
# reference (section 3) runs at the same time. OMP threads are split between them (CpuOps is
# their reference).
TEST_LIMIT=${TEST_LIMIT:-240} TORCH_LIMIT=${TORCH_LIMIT:-400} TRAIN_LIMIT=${TRAIN_LIMIT:-180} MPI_LIMIT=${MPI_LIMIT:-300}
TORCH_BACKENDS=${TORCH_BACKENDS:-"cpu:fp32 cuda:fp32 cuda:bf16"}
t0=$(now)
if [ $rc -eq 0 ]; then
  mkdir -p "$OUT/tests"
  threads=$(( 2 * $(nproc) / (${#GPU_TESTS[@]} + 1) ))  # a little over the cores: the tests wait on the GPU too
  [ "$threads" -ge 1 ] || threads=1
  pids=()
  for t in "${GPU_TESTS[@]}"; do
    ( s=$(now); OMP_NUM_THREADS=$threads timeout -k 5 "$TEST_LIMIT" "$TEST_BIN/$t" >"$OUT/tests/$t.log" 2>&1
      echo "$? $(elapsed "$s")" >"$OUT/tests/$t.rc" ) &
    pids+=($!)
  done
fi
# ---- 3. PyTorch reference --------------------------------------------------------------------------
# The ctest torch_reference's script with every backend: trains a tiny GPT-2, Llama and Mixtral for
# 2 steps, dumps one batch from the checkpoint on cpu, cuda fp32 and cuda bf16 (reference_dump),
# compares them with torch_reference.py, and checks that a perturbed gradient (and for the
# Mixtral a misrouted token) fails.
t0=$(now)
if [ $rc -eq 0 ]; then
  OMP_NUM_THREADS=$threads TORCH_REFERENCE_BACKENDS="$TORCH_BACKENDS" timeout "$TORCH_LIMIT" test/torch_reference.sh \
    "$PICOTRAIN" "$REFERENCE_DUMP" "$ROOT" >"$OUT/torch.log" 2>&1
  prc=$?
  # The bf16 row of the worst gradient: "cuda bf16  grad NAME (worst)  REL_L2 ..."
  worst=$(awk '$1 == "cuda" && $2 == "bf16" && $5 == "(worst)" { print $4 " " $6; exit }' "$OUT/torch.log")
  if [ $prc -eq 0 ]; then
    record "torch reference" ok "$(elapsed "$t0")" "$TORCH_BACKENDS within bounds (bf16 worst grad: $worst)"
  elif [ $prc -eq 77 ]; then
    record "torch reference" FAIL "$(elapsed "$t0")" "no python3 with torch and numpy"
  elif [ $prc -eq 124 ]; then  # its log holds the expected "over the bound" lines of the negative checks
    record "torch reference" FAIL "$(elapsed "$t0")" "killed after TORCH_LIMIT=${TORCH_LIMIT} s at: $(grep '^== ' "$OUT/torch.log" | tail -1 | cut -c1-120)"
  else
    record "torch reference" FAIL "$(elapsed "$t0")" "rc $prc: $(grep -E 'over the bound|FAILED|error:' "$OUT/torch.log" | head -3 | tr '\n' ' ' | cut -c1-160)"
  fi
else
  record "torch reference" skip 0 "no build"
fi

# ---- 2 (results). Each GPU test's row: exit status, time, Catch2's summary -----------------------------
if [ $rc -eq 0 ]; then
  wait "${pids[@]}"
  for t in "${GPU_TESTS[@]}"; do
    read -r trc secs <"$OUT/tests/$t.rc" 2>/dev/null || { trc=255; secs=0; }
    line=$(grep -E "^(All tests passed|test cases:)" "$OUT/tests/$t.log" | tail -1)
    case $trc in
      0) record "$t" ok "$secs" "$line" ;;
      77) record "$t" FAIL "$secs" "skipped: no GPU seen" ;;
      124 | 137) record "$t" FAIL "$secs" "killed after ${TEST_LIMIT} s; $line" ;;
      *) record "$t" FAIL "$secs" "rc $trc: $line $(grep -m1 -E 'FAILED|error' "$OUT/tests/$t.log" | cut -c1-100)" ;;
    esac
  done
  # The multi-rank GPU test runs under mpirun, as ctest starts it.
  mpi_built=0
  if [ -n "$MPI_BUILD_PID" ]; then
    t0=$(now)
    wait "$MPI_BUILD_PID"
    brc=$?
    if [ $brc -eq 0 ]; then
      mpi_built=1
      record "build mpi_gpu_parity" ok "$(elapsed "$t0")" "waited for it after the tests; MPI: $(mpirun --version 2>&1 | head -1)"
    else
      record "build mpi_gpu_parity" FAIL "$(elapsed "$t0")" "rc $brc, see build_mpi.log: $(grep -m1 -E 'error|Error' "$OUT/build_mpi.log" | cut -c1-120)"
    fi
  elif [ "$MPI_FLAG" = ON ]; then
    mpi_built=1
  fi
  if [ $mpi_built = 1 ]; then
    t0=$(now)
    timeout "$MPI_LIMIT" ctest --test-dir "$BUILD" -R mpi_gpu_parity --output-on-failure --timeout $((MPI_LIMIT - 10)) >"$OUT/tests/mpi_gpu_parity.log" 2>&1
    mrc=$?
    line=$(grep -E "tests passed|tests failed" "$OUT/tests/mpi_gpu_parity.log" | tail -1)
    if [ $mrc -eq 0 ] && ! grep -q "Skipped" "$OUT/tests/mpi_gpu_parity.log"; then
      record mpi_gpu_parity ok "$(elapsed "$t0")" "$line"
    else
      record mpi_gpu_parity FAIL "$(elapsed "$t0")" "rc $mrc: $line"
    fi
  fi
fi

# ---- 4. GPT-2 124M, 20 steps ------------------------------------------------------------------------
t0=$(now)
if [ $rc -eq 0 ]; then
  DATA="$BUILD/synthetic"
  RUN="$BUILD/run124m"
  rm -rf "$RUN"
  # Synthetic llm.c shards: Zipf-distributed token ids (a learnable unigram distribution, so the
  # loss falls from ln(50257) ~ 10.8 within a few steps), 1024-byte header + uint16 tokens.
  python3 - "$DATA" <<'EOF' >"$OUT/train.log" 2>&1
import os, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
for split, n in (("train", 3_000_000), ("val", 300_000)):
    tok = np.minimum(rng.zipf(1.2, n) - 1, 50256).astype(np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    with open(os.path.join(out, "synthetic_%s_000000.bin" % split), "wb") as f:
        f.write(header.tobytes())
        f.write(tok.tobytes())
print("wrote synthetic shards to", out)
EOF
  # It only measures (the loss falls, the throughput): no checkpoint, not even the final one. The
  # corruption check runs every 5 steps: the CUDA forward must give the same bits when replayed
  # in evaluation (a mismatch ends the run and fails this check).
  timeout "$TRAIN_LIMIT" "$PICOTRAIN" train --device cuda --config configs/gpt2-124m.json \
    --set run.out_dir="$RUN" --set "data.train=$DATA/synthetic_train_*.bin" --set "data.val=$DATA/synthetic_val_*.bin" \
    --set batch.micro_batch_size=8 --set batch.global_batch_tokens=65536 --set schedule.total_steps=20 \
    --set schedule.warmup_steps=2 --set data.val_every_steps=10 --set data.val_tokens=65536 \
    --set logging.every_steps=1 --set parallel.zero_stage=0 --set checkpoint.every_steps=0 \
    --set checkpoint.final=false --set run.replay_every_steps=5 >>"$OUT/train.log" 2>&1
  trc=$?
  metrics=$(find "$RUN" -name 'metrics.jsonl' 2>/dev/null | head -1)
  [ -n "$metrics" ] && cp "$metrics" "$OUT/metrics.jsonl"
  [ -n "$metrics" ] && cp "$(dirname "$metrics")/report.json" "$OUT/report.json" 2>/dev/null || true
  detail=$(python3 - "$OUT/metrics.jsonl" <<'EOF' 2>&1
import json, math, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    print("no metrics.jsonl"); sys.exit(1)
steps = [r for r in rows if "loss" in r]
if not steps:
    print("no steps logged"); sys.exit(1)
first, last = steps[0], steps[-1]
losses = [r["loss"] for r in steps]
ok = all(math.isfinite(x) for x in losses) and last["loss"] < first["loss"]
tail = steps[len(steps) // 2:]  # steady state: skip the warm-up steps
tps = sum(r.get("tokens_per_s", 0) for r in tail) / len(tail)
mfu = sum(r.get("mfu", 0) for r in tail) / len(tail)
val = [r["val_loss"] for r in rows if "val_loss" in r]
try:  # the corruption check's count and cost (report.json beside metrics.jsonl)
    rel = json.load(open(sys.argv[1].replace("metrics.jsonl", "report.json")))["reliability"]
    replay = ", %d replay checks %.3f s" % (rel["replay_checks"], rel["replay_seconds"])
except (OSError, KeyError, ValueError):
    replay = ""
print("loss %.3f -> %.3f over %d steps, %.0f tok/s, MFU %.1f%%%s%s" % (
    first["loss"], last["loss"], last.get("step", len(steps)), tps, 100 * mfu,
    ", val %.3f" % val[-1] if val else "", replay))
sys.exit(0 if ok else 1)
EOF
)
  drc=$?
  if [ $trc -eq 0 ] && [ $drc -eq 0 ]; then
    record "gpt2-124m 20 steps" ok "$(elapsed "$t0")" "$detail"
  else
    record "gpt2-124m 20 steps" FAIL "$(elapsed "$t0")" "rc $trc: $detail; $(grep -m1 '^error' "$OUT/train.log")"
  fi
else
  record "gpt2-124m 20 steps" skip 0 "no build"
fi

# ---- 5. compute-sanitizer on the kernels changed since the last GPU run --------------------------------
# memcheck (out-of-bounds and misaligned accesses) and racecheck (shared-memory hazards) over the
# tests in SANITIZE (default gpu_attention and gpu_attention_block: the flash kernels, on whole
# sequences and on blocks), each run under SANITIZE_LIMIT
# seconds; SANITIZE_ARGS goes to the test binary (a Catch2 filter keeps a slow test short: the
# default ~[flash] leaves out gpu_attention's long T sweeps, whose kernels the short cases share).
SANITIZE=${SANITIZE-gpu_attention gpu_attention_block} SANITIZE_LIMIT=${SANITIZE_LIMIT:-150} SANITIZE_ARGS=${SANITIZE_ARGS-~[flash]}
if [ $rc -eq 0 ] && [ -n "$SANITIZE" ]; then
  if command -v compute-sanitizer >/dev/null 2>&1; then
    mkdir -p "$OUT/sanitize"
    for t in $SANITIZE; do
      for tool in memcheck racecheck; do
        t0=$(now)
        log="$OUT/sanitize/$t.$tool.log"
        # shellcheck disable=SC2086  # SANITIZE_ARGS is a list of arguments
        timeout -k 5 "$SANITIZE_LIMIT" compute-sanitizer --tool "$tool" --error-exitcode 3 "$TEST_BIN/$t" \
          $SANITIZE_ARGS >"$log" 2>&1
        src=$?
        summary=$(grep -m1 -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log")
        case $src in
          0) record "$tool $t" ok "$(elapsed "$t0")" "$summary" ;;
          124 | 137) record "$tool $t" FAIL "$(elapsed "$t0")" "killed after ${SANITIZE_LIMIT} s" ;;
          *) record "$tool $t" FAIL "$(elapsed "$t0")" "rc $src: $summary $(grep -m1 -E 'Invalid|Race|hazard' "$log" | cut -c1-100)" ;;
        esac
      done
    done
  else
    record "compute-sanitizer" FAIL 0 "not on this machine's PATH"
  fi
fi

# ---- summary ---------------------------------------------------------------------------------------
{
  echo
  echo "picotrain GPU check"
  cat "$OUT/machine.txt"
  echo
  printf '| %-22s | %-4s | %6s | %s\n' "check" "ok?" "s" "detail"
  printf '|%s|%s|%s|%s\n' "------------------------" "------" "--------" "--------------------------------"
  for r in "${ROWS[@]}"; do echo "$r"; done
  # The training run's measured memory and where its step's time went on the GPU (docs/log.md, "The log").
  if [ -f "$OUT/train.log" ]; then
    echo
    grep -E '^(memory    \| step|phases    \|)' "$OUT/train.log" | sed 's/^/gpt2-124m /'
  fi
  echo
  if [ $FAILED -eq 0 ]; then echo "RESULT: all checks passed"; else echo "RESULT: FAILED (logs in $OUT)"; fi
} | tee "$OUT/summary.txt"
rm -f "$OUT/machine.txt"
exit $FAILED
