# Sourced by scripts/gpu_check.sh and bench/gpu_bench.sh: whether the binaries that
# scripts/gpu_pack.sh built elsewhere (carried as .gpubin.tar.xz, or .gpubin) run on this machine.
#   in:  ROOT; GPU_BIN (unset: $ROOT/.gpubin, unpacked from .gpubin.tar.xz when only that is
#        here; empty: build here instead)
#        GPU_BIN_ANY_SOURCES=1: use it even when it was packed from other sources
#   out: GPU_BIN, the folder when it was packed from these sources (scripts/source_hash.sh,
#        recorded in its BUILD_INFO) and its picotrain starts here, else empty; LD_LIBRARY_PATH gains
#        the folders of the libraries the binaries cannot find: the CUDA libraries where this
#        machine keeps them (its toolkit, or PyTorch's pip wheels), the rest from the folder's lib/
#   also: find_gpu_library NAME, the first file NAME in this machine's CUDA folders or PyTorch's
#         pip wheels (gpu_check.sh finds libnccl.so.2 with it)

find_gpu_library() {
  find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ /usr/local/cuda*/lib*/ \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) -name "$1" 2>/dev/null | head -1
}

if [ -z "${GPU_BIN+set}" ]; then
  if [ ! -x "$ROOT/.gpubin/picotrain" ] && [ -f "$ROOT/.gpubin.tar.xz" ]; then
    tar xJf "$ROOT/.gpubin.tar.xz" -C "$ROOT"
  fi
  [ -x "$ROOT/.gpubin/picotrain" ] && GPU_BIN=$ROOT/.gpubin
fi
GPU_BIN=${GPU_BIN:-}
# Binaries packed from other sources would test and time code that is not here: build instead.
if [ -n "$GPU_BIN" ] && [ "${GPU_BIN_ANY_SOURCES:-0}" != 1 ]; then
  packed=$(sed -n 's/^sources: //p' "$GPU_BIN/BUILD_INFO" 2>/dev/null)
  here=$(bash "$(dirname "${BASH_SOURCE[0]}")/source_hash.sh" "$ROOT")
  if [ "$packed" != "$here" ]; then
    echo "prebuilt $GPU_BIN was packed from other sources (${packed:-no fingerprint} there, $here here):" \
      "building here instead; run scripts/gpu_pack.sh before carrying it (GPU_BIN_ANY_SOURCES=1 uses it anyway)" >&2
    GPU_BIN=""
  fi
fi
if [ -n "$GPU_BIN" ]; then
  GPU_BIN=$(cd "$GPU_BIN" && pwd)
  for missing in $(ldd "$GPU_BIN/picotrain" 2>/dev/null | awk '/not found/ { print $1 }'); do
    found=$(find "$GPU_BIN/lib" -name "$missing" | head -1)
    [ -n "$found" ] || found=$(find_gpu_library "$missing")
    if [ -n "$found" ]; then
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$found")"
      echo "prebuilt: $missing from $(dirname "$found")" >&2
    fi
  done
  if ! "$GPU_BIN/picotrain" --help >/dev/null 2>&1; then
    echo "prebuilt $GPU_BIN/picotrain does not start here; building instead:" >&2
    ldd "$GPU_BIN/picotrain" 2>&1 | grep -i 'not found' >&2
    GPU_BIN=""
  fi
fi
