#!/usr/bin/env bash
# Installs what picotrain needs to build and test, from Debian packages. Non-interactive,
# idempotent, and fast when everything is already there (it only asks dpkg).
# The CUDA toolkit is not installed here: it is found at /usr/local/cuda when present, and
# the build falls back to the CPU backend without it.
set -euo pipefail

# pkg-config + libpcre2-dev: the GPT-2 pre-tokenizer's Unicode regex; zlib1g-dev: gzip input to prepare.
PACKAGES=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev catch2 libopenmpi-dev openmpi-bin gnuplot-nox
  pkg-config libpcre2-dev zlib1g-dev)

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
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
