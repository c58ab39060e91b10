#!/usr/bin/env bash
# ctest attention_ptx: proof, without a GPU, that the flash-attention kernels (bf16 and FP8, and
# the FP8 cast kernels) and the experts' grouped products (cuda/grouped_matmul.cu) compile to the instructions they are written for and that no kernel spills. For each (file, arch) row of CHECKS
# below, nvcc compiles the file for that arch alone (device code only, as a cubin, with --keep so
# the PTX stays) and -Xptxas -v reports each function's resources. Then:
#   1. the PTX (comments removed) must match every pattern the row names (see PTX below);
#   2. every function ptxas reports on must have 0 bytes spill stores and 0 bytes spill loads (or
#      no more than its file's SPILL_ALLOWANCE, below, with the reason), and every kernel entry
#      must have a report. A stack frame is allowed (a kernel may keep a local
#      array there on purpose) but shown, as it usually means local memory;
#   3. ptxas must not report a "Potential Performance Loss" (it serialises wgmma products when
#      their registers may be touched while in flight).
# Each kernel's registers, static shared memory, stack frame and spills are printed as a table, so
# the CI log shows them. Shared memory is the static part only: the flash kernels use dynamic
# shared memory (extern __shared__), whose size is set at launch and is not in ptxas' report.
# The PTX counts are of static occurrences in the PTX text, not of executed instructions.
#
#   test/attention_ptx_check.sh [NVCC [SOURCE_DIR]]
# NVCC defaults to /usr/local/cuda/bin/nvcc (else nvcc on PATH), SOURCE_DIR to this repository.
# ATTENTION_PTX_KEEP=DIR keeps each row's PTX, cubin and ptxas log under DIR (default: a temporary
# folder, removed at exit).
# Exit status: 0 passed, 1 failed, 77 skipped (no nvcc), 2 usage.
set -euo pipefail

# Extended regexes for the PTX a row may require, by name (PTX ISA syntax; the optional state
# space of ldmatrix and cp.async may be written .shared or .shared::cta).
declare -A PTX=(
  # ldmatrix without .trans: the A operand and the [n][k] B operands (K in Q K^T).
  [ldmatrix]='ldmatrix\.sync\.aligned\.m8n8\.x[124]\.(shared|b16)'
  # ldmatrix.trans: the [k][n] B operands (V in P V, and the backward's transposed products).
  [ldmatrix.trans]='ldmatrix\.sync\.aligned\.m8n8\.x[124]\.trans'
  # The asynchronous global -> shared copy itself (commit_group alone would not copy anything) ...
  [cp.async]='cp\.async\.c[ag]\.shared(::cta)?\.global'
  # ... and a wait for it.
  [cp.async.wait]='cp\.async\.wait_(group|all)'
  # The bf16 tensor-core product with fp32 accumulators.
  [mma.bf16]='mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32'
  # For a Hopper-only (sm_90a) kernel: warpgroup mma and TMA tile copies.
  [wgmma]='wgmma\.mma_async\.sync\.aligned'
  [cp.async.bulk.tensor]='cp\.async\.bulk\.tensor'
  # ... the barriers those copies complete on, waited for by phase ...
  [mbarrier.wait]='mbarrier\.try_wait\.parity'
  # ... and the producer/consumer register split (warp specialisation).
  [setmaxnreg]='setmaxnreg\.(inc|dec)\.sync\.aligned\.u32'
  # A Hopper-only kernel built for an older arch: its body is a trap (never launched there).
  [trap]='^[[:space:]]*trap;'
  # FP8 casts (cuda/fp8_cast.cu): the scaling multiply without .ftz (mul.rn.ftz.f32 would flush
  # subnormal inputs under --use_fast_math and break bit-identity with CpuOps), 16-byte loads and
  # the transposed kernel's 16-byte code stores.
  [mul.rn.noftz]='mul\.rn\.f32[[:space:]]'
  [ld.v4]='ld\.global(\.nc)?\.v4\.'
  [st.v4]='st\.global\.v4\.'
  # FP8 attention (cuda/flash_attention_fp8.cu): P's cast to e4m3 codes (two per instruction) ...
  [cvt.e4m3x2]='cvt\.rn\.satfinite\.e4m3x2\.f32'
  # ... the e4m3 tensor-core product where it is native (sm_89, sm_120) ...
  [mma.e4m3]='mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32'
  # ... and where it is not (Hopper): the codes widened to f16 once per fragment, f16 products.
  [cvt.f16x2.e4m3x2]='cvt\.rn\.f16x2\.e4m3x2'
  [mma.f16]='mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32'
)

# What is checked: one row per (file, arch), with the PTX names it must contain. A file built for
# several archs has a row per arch (CMakeLists.txt builds every cuda/*.cu for all of
# PICOTRAIN_CUDA_ARCHS, 80 and 90a by default; these rows check both, whatever this build chose).
CHECKS=(
  # file                            arch     required PTX (names in PTX above)
  "cuda/flash_attention_forward.cu  sm_80    ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  "cuda/flash_attention_forward.cu  sm_90a   ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  "cuda/flash_attention_backward.cu sm_80    ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  "cuda/flash_attention_backward.cu sm_90a   ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  "cuda/flash_attention_forward_sm90.cu sm_90a wgmma cp.async.bulk.tensor mbarrier.wait setmaxnreg"
  "cuda/flash_attention_forward_sm90.cu sm_80 trap"
  "cuda/flash_attention_backward_sm90.cu sm_90a wgmma cp.async.bulk.tensor mbarrier.wait setmaxnreg"
  "cuda/flash_attention_backward_sm90.cu sm_80 trap"
  "cuda/fp8_cast.cu                 sm_80    mul.rn.noftz ld.v4 st.v4"
  "cuda/fp8_cast.cu                 sm_90a   mul.rn.noftz ld.v4 st.v4"
  "cuda/attention_fp8_cast.cu       sm_80    mul.rn.noftz ld.v4 st.v4"
  "cuda/attention_fp8_cast.cu       sm_90a   mul.rn.noftz ld.v4 st.v4"
  "cuda/flash_attention_fp8.cu      sm_90a   ldmatrix cp.async cp.async.wait cvt.e4m3x2 cvt.f16x2.e4m3x2 mma.f16"
  "cuda/flash_attention_fp8.cu      sm_80    trap"
  # The routed experts' grouped products use the same building blocks (cuda/flash_attention_mma.cuh).
  "cuda/grouped_matmul.cu           sm_80    ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  "cuda/grouped_matmul.cu           sm_90a   ldmatrix ldmatrix.trans cp.async cp.async.wait mma.bf16"
  # Not a build target by default (80;90a), but the arch of the kernel's native e4m3 path (a build
  # for Ada adds 89): it must compile there, without spills, to the e4m3 product.
  "cuda/flash_attention_fp8.cu      sm_89    ldmatrix cp.async cp.async.wait cvt.e4m3x2 mma.e4m3"
)

# Spill bytes (stores and loads, each) a file's kernels may have; everything else must spill
# nothing. The backward's threads hold dK and dV (HS fp32 each) beside S^T and dP^T at the 255
# register limit, and ptxas (nvcc 13.0) keeps up to 16 bytes of scalars in local memory rather
# than give up the block's registers; variants that spilled nothing ran slower (the kernel's
# header). More than this means a change moved real work to local memory.
declare -A SPILL_ALLOWANCE=(
  [cuda/flash_attention_backward.cu]=16
)

# The flags CMakeLists.txt compiles cuda/*.cu with (picotrain_cuda in a Release build): the source
# root as include dir, C++17, Release's -O3 -DNDEBUG, and the target's --use_fast_math -O3. Keep
# these in step with it: other flags can change register allocation and so spills.
# (--threads 2 is left out: it only runs archs in parallel, and each row here has one arch.)
FLAGS=(-O3 -DNDEBUG --use_fast_math -std=c++17)

[[ $# -le 2 ]] || { echo "usage: $0 [NVCC [SOURCE_DIR]]" >&2; exit 2; }
if [[ $# -ge 1 ]]; then
  NVCC=$1
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
  NVCC=/usr/local/cuda/bin/nvcc
else
  NVCC=$(command -v nvcc || true)
fi
if [[ -z $NVCC || ! -x $NVCC ]]; then
  echo "skipped: no nvcc (${NVCC:-not on PATH, not in /usr/local/cuda/bin})"
  exit 77
fi
SRC=$(cd "${2:-$(dirname "$0")/..}" && pwd)
# c++filt (binutils) demangles nvcc's names; the toolkit's own cu++filt when binutils is absent.
DEMANGLE="cat"
if command -v c++filt >/dev/null; then
  DEMANGLE="c++filt"
elif [[ -x $(dirname "$NVCC")/cu++filt ]]; then
  DEMANGLE=$(dirname "$NVCC")/cu++filt
fi

if [[ -n ${ATTENTION_PTX_KEEP:-} ]]; then
  WORK=$ATTENTION_PTX_KEEP
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi

# ---- compile: each row in its own folder, as many at once as there are cores -------------------
# One nvcc per (file, arch) keeps each ptxas report whole (several archs in one nvcc, with
# --threads, interleave them) and compiles no host code (-cubin): a row takes a few seconds.
start=$(date +%s)
jobs_max=$(nproc 2>/dev/null || echo 2)
for i in "${!CHECKS[@]}"; do
  read -r file arch _ <<<"${CHECKS[$i]}"
  dir=$WORK/$i
  rm -rf "$dir" && mkdir -p "$dir"  # a kept folder from an earlier run must not leave its PTX
  [[ -f $SRC/$file ]] || { echo "no such file: $SRC/$file" >"$dir/ptxas.log"; echo 1 >"$dir/rc"; continue; }
  while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n || true; done
  (
    set +e
    "$NVCC" -I"$SRC" "${FLAGS[@]}" -arch="$arch" -cubin --keep --keep-dir "$dir" -Xptxas -v \
      -o "$dir/out.cubin" "$SRC/$file" >"$dir/ptxas.log" 2>&1
    echo $? >"$dir/rc"
  ) &
done
wait

# ---- check and report ---------------------------------------------------------------------------
failures=()
printf '%-34s %-7s %-44s %5s %6s %6s %9s %9s\n' file arch kernel regs smem stack "spill st" "spill ld"
for i in "${!CHECKS[@]}"; do
  read -r file arch required <<<"${CHECKS[$i]}"
  dir=$WORK/$i
  where="$file $arch"
  if [[ $(cat "$dir/rc") != 0 ]]; then
    # The first errors are enough (the build itself shows the rest); the same for every arch.
    echo "---- $where: compile failed ($(wc -l <"$dir/ptxas.log") lines of output, the first 30):"
    head -n 30 "$dir/ptxas.log"
    failures+=("$where: does not compile")
    continue
  fi

  # ptxas -v prints, per entry (kernel):
  #   ptxas info    : Compiling entry function 'NAME' for 'sm_80'
  #   ptxas info    : Function properties for NAME
  #       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  #   ptxas info    : Used 168 registers, used 1 barriers, 392 bytes cmem[0]   (", N bytes smem" if any)
  # and "Function properties" blocks for non-inlined device functions too (no "Used" line).
  # One line out per function: kind name regs smem stack spill_stores spill_loads.
  report=$(awk '
    /Compiling entry function/ { split($0, q, "\047"); cur = q[2]; kind[cur] = "entry"; order[++n] = cur }
    /Function properties for / {
      fn = $0; sub(/.*Function properties for /, "", fn)
      if (!(fn in kind)) { kind[fn] = "function"; order[++n] = fn }
    }
    /bytes stack frame/ {
      stack[fn] = $1
      for (k = 1; k <= NF; k++) {
        if ($(k + 1) == "bytes" && $(k + 2) == "spill" && $(k + 3) ~ /^stores/) st[fn] = $k
        if ($(k + 1) == "bytes" && $(k + 2) == "spill" && $(k + 3) ~ /^loads/) ld[fn] = $k
      }
    }
    /Used [0-9]+ registers/ {
      regs[cur] = $0; sub(/.*Used /, "", regs[cur]); sub(/ registers.*/, "", regs[cur])
      smem[cur] = 0
      if (match($0, /[0-9]+ bytes smem/)) { smem[cur] = substr($0, RSTART, RLENGTH); sub(/ .*/, "", smem[cur]) }
    }
    END {
      for (k = 1; k <= n; k++) {
        f = order[k]
        printf "%s %s %s %s %s %s %s\n", kind[f], f, (f in regs) ? regs[f] : "-", (f in smem) ? smem[f] : "-",
               (f in stack) ? stack[f] : "?", (f in st) ? st[f] : "?", (f in ld) ? ld[f] : "?"
      }
    }' "$dir/ptxas.log")

  entries=0
  while read -r kind name regs smem stack st ld; do
    [[ -n $kind ]] || continue
    [[ $kind == entry ]] && entries=$((entries + 1))
    # void pt::gpu::(anonymous namespace)::flash_forward_kernel<128>(bf16*, ...) -> pt::gpu::flash_forward_kernel<128>
    short=$(echo "$name" | $DEMANGLE | sed -e 's/^void //' -e 's/(anonymous namespace):://g' -e 's/(.*)$//')
    [[ $kind == entry ]] || short="$short (device function)"
    printf '%-34s %-7s %-44s %5s %6s %6s %9s %9s\n' "$file" "$arch" "$short" "$regs" "$smem" "$stack" "$st" "$ld"
    if [[ $st == "?" || $ld == "?" ]]; then
      failures+=("$where: $short: no spill figures in ptxas' report")
    elif [[ $st -gt ${SPILL_ALLOWANCE[$file]:-0} || $ld -gt ${SPILL_ALLOWANCE[$file]:-0} ]]; then
      failures+=("$where: $short spills: $st bytes stores, $ld bytes loads (allowed: ${SPILL_ALLOWANCE[$file]:-0})")
    fi
  done <<<"$report"
  [[ $entries -gt 0 ]] || failures+=("$where: ptxas reported no kernel entry")
  # ptxas serialises wgmma (waits after each product) when it cannot prove the accumulators are
  # left alone while a product is in flight, and says so as a "Potential Performance Loss".
  if grep -q "Potential Performance Loss" "$dir/ptxas.log"; then
    grep "Potential Performance Loss" "$dir/ptxas.log" | head -n 3
    failures+=("$where: ptxas reports a potential performance loss (above)")
  fi

  # The PTX: --keep leaves exactly one .ptx in the row's folder (one arch). Comments are dropped so
  # that only instructions count.
  ptx=("$dir"/*.ptx)
  if [[ ${#ptx[@]} -ne 1 || ! -f ${ptx[0]} ]]; then
    failures+=("$where: expected one .ptx from --keep, found ${#ptx[@]}")
    continue
  fi
  sed -e 's://.*$::' "${ptx[0]}" >"$dir/instructions.txt"
  counts=() missing=()
  for name in $required; do
    [[ -n ${PTX[$name]:-} ]] || { failures+=("$where: no pattern named '$name' in PTX"); continue; }
    c=$(grep -cE "${PTX[$name]}" "$dir/instructions.txt" || true)
    counts+=("$name $c")
    [[ $c -gt 0 ]] || missing+=("$name")
  done
  joined=$(printf '%s, ' "${counts[@]}")
  echo "    PTX counts: ${joined%, }"
  [[ ${#missing[@]} -eq 0 ]] || failures+=("$where: PTX lacks ${missing[*]}")
done

echo "${#CHECKS[@]} file/arch rows compiled in $(($(date +%s) - start)) s with $NVCC ($("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
echo "smem = static shared memory only (dynamic shared memory is set at launch); stack = stack frame bytes"
if [[ ${#failures[@]} -gt 0 ]]; then
  echo "FAILED:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo "passed: every required PTX instruction present, no spills beyond the allowances"
