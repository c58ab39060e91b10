# Sourced by scripts/gpu_check.sh and bench/gpu_bench.sh: the CMake arguments of a Release build
# for this machine's GPU, with the libraries the machine lacks taken from .deps/ (made by
# scripts/fetch_deps.sh on a machine with apt, then carried along).
#   in:  ROOT (the repository), BUILD (the build folder)
#   out: ARCHS (the CUDA architectures), MPI_FLAG (ON when the machine has MPI: the multi-rank GPU
#        tests need it), CMAKE_ARGS (configure arguments)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
case "$cc" in
  90) ARCHS="90a" ;;  # Hopper: the architecture-specific target (wgmma, TMA)
  "") ARCHS="80;90a" ;;
  *) ARCHS="$cc" ;;
esac
MPI_FLAG=OFF
command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 && MPI_FLAG=ON
CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPICOTRAIN_CUDA=ON "-DPICOTRAIN_MPI=$MPI_FLAG"
            "-DPICOTRAIN_CUDA_ARCHS=$ARCHS")
command -v ninja >/dev/null 2>&1 && CMAKE_ARGS+=(-G Ninja)
if [ -d "$ROOT/.deps/usr" ]; then
  CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$ROOT/.deps/usr")
  # Only what the machine lacks comes from .deps (its libraries are Debian's builds).
  if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libpcre2-8; }; then
    CMAKE_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$ROOT/.deps/bin/pkg-config")
  fi
  [ -e /usr/include/zlib.h ] || CMAKE_ARGS+=("-DZLIB_ROOT=$ROOT/.deps/usr")
else
  echo "no .deps/ here; if CMake cannot find CLI11/json/Catch2/PCRE2, run scripts/fetch_deps.sh on a" \
       "machine with apt and carry .deps along" >&2
fi
