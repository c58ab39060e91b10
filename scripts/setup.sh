#!/usr/bin/env bash
# Installs what picotrain needs to build and test, from Debian packages. Non-interactive,
# idempotent, and fast when everything is already there (it only asks dpkg).
# The CUDA toolkit is not installed here: it is found at /usr/local/cuda when present, and
# the build falls back to the CPU backend without it.
#   scripts/setup.sh           # what building, training and the tests need
#   scripts/setup.sh --tests   # and what only the tests use: PyTorch (see below), iproute2
#   scripts/setup.sh --cluster # and a Slurm to run scripts/slurm/ against (scripts/slurm/local_cluster.sh)
set -euo pipefail

TESTS=0 CLUSTER=0
for arg in "$@"; do
  case $arg in
    --tests) TESTS=1 ;;
    --cluster) CLUSTER=1 ;;
    *) echo "setup: unknown argument $arg (takes --tests and --cluster)" >&2; exit 2 ;;
  esac
done

# pkg-config + libpcre2-dev: the GPT-2 pre-tokenizer's Unicode regex; zlib1g-dev: gzip input to prepare.
PACKAGES=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev catch2 libopenmpi-dev openmpi-bin gnuplot-nox
  pkg-config libpcre2-dev zlib1g-dev)

# --tests: Debian's PyTorch (CPU, for /usr/bin/python3, with numpy) runs the independent GPT-2
# reference (ctest torch_reference, skipped without it). On a fresh Debian 12 it is 256 packages,
# 205 MB to download and 870 MB installed (Debian's libtorch pulls in OpenCV, GDAL, Qt, Mesa);
# measured on 2 busy cores: 3 s to download, 14 s to unpack, 11 s to byte-compile, so about a
# minute with dpkg's own work. Worth it for the tests, not for training: only with --tests, and
# not when a python3 that imports torch and numpy is already there.
has_torch() {
  local py
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 && "$py" -c "import torch, numpy" >/dev/null 2>&1 && return 0
  done
  return 1
}
if [ "$TESTS" -eq 1 ] && ! has_torch; then
  PACKAGES+=(python3-torch)
fi
# --tests: `ip` and `tc` make the cluster tests' hosts (scripts/netns_cluster.sh).
if [ "$TESTS" -eq 1 ]; then
  PACKAGES+=(iproute2)
fi

# --cluster: Debian's Slurm (controller, node daemon, client commands; srun's PMIx plugin comes
# with them) and munge, its authentication, for the slurm_requeue test. About 25 s. The packages'
# own services are not used: local_cluster.sh runs the daemons from a directory of its own.
if [ "$CLUSTER" -eq 1 ]; then
  PACKAGES+=(slurmctld slurmd slurm-client munge)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# python3-torch is in Debian 12 (1.13) but not in every distribution: without it the test skips.
if [[ " ${missing[*]} " == *" python3-torch "* ]] && ! apt-cache show python3-torch >/dev/null 2>&1; then
  echo "setup: no python3-torch package here; the PyTorch reference test will be skipped"
  available=()
  for p in "${missing[@]}"; do [ "$p" = python3-torch ] || available+=("$p"); done
  missing=(${available[@]+"${available[@]}"})
fi
[ ${#missing[@]} -eq 0 ] || $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
