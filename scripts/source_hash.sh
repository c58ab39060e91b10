#!/usr/bin/env bash
# The fingerprint of the sources the GPU binaries are built from: a hash over every C++, CUDA and
# CMake file under CMakeLists.txt, cmake/, app/, core/, cuda/, test/ and bench/ of ROOT (default:
# this checkout). scripts/gpu_pack.sh records it in .gpubin/BUILD_INFO; scripts/gpu_prebuilt.sh
# compares it on the GPU machine, so binaries packed from other sources are never run as these.
#   scripts/source_hash.sh [ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
dirs=()
for d in CMakeLists.txt cmake app core cuda test bench; do [ -e "$d" ] && dirs+=("$d"); done
[ ${#dirs[@]} -gt 0 ] || { echo "no sources"; exit 0; }
find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' \
  -o -name '*.cmake' \) -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum | sha256sum | cut -c1-16
