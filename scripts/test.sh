#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test (ctest).
# GPU tests exit 77 (skipped) on a machine without a GPU.
#   scripts/test.sh            # build dir: build/
#   BUILD_DIR=b scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# --cluster: Slurm and munge, so that slurm_requeue runs the sbatch script under a real Slurm.
scripts/setup.sh --tests --cluster
# The tokenizer files (GPT-2, Llama 3) and the reference encoders its tests run under node (npm only; kept).
scripts/get_data.sh --tokenizer

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
CUDA_FLAG=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_FLAG=ON
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# Multi-rank tests run as root in CI and oversubscribe 2 cores; shared memory only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA="$CUDA_FLAG"
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
