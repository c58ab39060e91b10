#!/usr/bin/env bash
# Builds the GPU binaries on THIS machine (no GPU needed: nvcc compiles for a named architecture)
# and packs them, stripped, into .gpubin/ and .gpubin.tar.xz (both git-ignored; the archive is a
# tenth of the folder's size: carry it), so that a GPU machine lent for minutes spends none of
# them compiling: scripts/gpu_check.sh and bench/gpu_bench.sh unpack and use it when its binaries
# start there, and build for themselves otherwise.
#
#   scripts/gpu_pack.sh                # Release, sm_90a (H100/H200), no MPI -> .gpubin/
#   ARCHS="80;90a" scripts/gpu_pack.sh # other architectures
#
# What it packs: picotrain, reference_dump, kernel_bench and every test/gpu_*.cpp test, plus
# .gpubin/lib/ with the non-CUDA, non-libc libraries they load (PCRE2, zlib, OpenMP): a GPU
# machine's image may lack them, and the scripts add this folder to the library path only then.
# The build is single-rank (-DPICOTRAIN_MPI=OFF): an MPI library built here would not match one
# there, so the multi-rank GPU test (mpi_gpu_parity) is built on the GPU machine when it has MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD_DIR:-$ROOT/build-gpupack}
ARCHS=${ARCHS:-90a}
PACK=$ROOT/.gpubin
JOBS=${JOBS:-$(nproc)}
export PATH="/usr/local/cuda/bin:$PATH"

TOOLS=(picotrain reference_dump kernel_bench)
TESTS=()
for f in test/gpu_*.cpp; do TESTS+=("$(basename "$f" .cpp)"); done

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA=ON -DPICOTRAIN_MPI=OFF \
  "-DPICOTRAIN_CUDA_ARCHS=$ARCHS" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}" "${TESTS[@]}"

rm -rf "$PACK"
mkdir -p "$PACK/lib"
cp "$BUILD/picotrain" "$BUILD/test/reference_dump" "$BUILD/bench/kernel_bench" "$PACK/"
for t in "${TESTS[@]}"; do cp "$BUILD/test/$t" "$PACK/"; done
strip "$PACK"/* 2>/dev/null || true
# The libraries a GPU image may not have (Debian's builds; glibc and libstdc++ there are newer).
ldd "$PACK/picotrain" | awk '/libpcre2-8|libz\.so|libgomp/ { print $3 }' | xargs -r -I{} cp -L {} "$PACK/lib/"
{
  echo "commit: $(git rev-parse --short HEAD) $(git status --porcelain | wc -l) changed files"
  echo "sources: $(scripts/source_hash.sh)"
  echo "archs: $ARCHS"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(nvcc --version | tail -1)"
} >"$PACK/BUILD_INFO"
tar cJf "$PACK.tar.xz" -C "$ROOT" .gpubin
echo "gpu_pack: $(ls "$PACK" | wc -l) entries in $PACK ($(du -sh "$PACK" | cut -f1)), $PACK.tar.xz ($(du -h "$PACK.tar.xz" | cut -f1)):"
cat "$PACK/BUILD_INFO"
