#!/usr/bin/env bash
# Unpacks the build's library dependencies into .deps/ (git-ignored) without installing them,
# for a machine that has a compiler, CMake and CUDA but no package manager (the GPU machines:
# they cannot reach a registry, so this runs HERE and .deps/ travels with the working tree).
#
#   scripts/fetch_deps.sh            # -> .deps/usr/{include,lib,share}, .deps/bin/pkg-config
#
# What it fetches (Debian packages of this machine's release, by `apt-get download`, unpacked
# with `dpkg -x`, nothing installed): the header-only CLI11, nlohmann/json and Catch2 v2 (their
# CMake package files compute paths relative to themselves, so CMAKE_PREFIX_PATH=.deps/usr finds
# them), PCRE2 and zlib headers/libraries, and pkgconf for a machine without pkg-config.
# MPI is not fetched: the GPU check builds with -DPICOTRAIN_MPI=OFF.
# scripts/gpu_check.sh uses .deps/ only for what the machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(libcli11-dev nlohmann-json3-dev catch2 libpcre2-dev libpcre2-8-0 zlib1g-dev zlib1g pkgconf pkgconf-bin
          libpkgconf3)
DEPS="$PWD/.deps"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# apt's sandbox user must be able to write the download folder.
chmod 777 "$work"
(cd "$work" && apt-get download -q "${PACKAGES[@]}")
rm -rf "$DEPS"
mkdir -p "$DEPS/bin"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$DEPS"; done

# zlib's development symlink is absolute (/lib/...): point it at the unpacked runtime instead.
lib="$DEPS/usr/lib/x86_64-linux-gnu"
zlib_so=$(cd "$DEPS/lib/x86_64-linux-gnu" 2>/dev/null && ls libz.so.1.* 2>/dev/null | head -1 || true)
if [ -n "$zlib_so" ]; then ln -sf "../../../lib/x86_64-linux-gnu/$zlib_so" "$lib/libz.so"; fi

# pkg-config confined to .deps: Debian's pkgconf run with its own library, the .pc files'
# /usr prefix mapped into .deps by the sysroot.
cat >"$DEPS/bin/pkg-config" <<'EOF'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$here/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$here/usr/lib/x86_64-linux-gnu/pkgconfig:$here/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$here"
exec "$here/usr/bin/pkgconf" "$@"
EOF
chmod +x "$DEPS/bin/pkg-config"

echo "fetch_deps: unpacked ${#PACKAGES[@]} packages into $DEPS ($(du -sh "$DEPS" | cut -f1))"
"$DEPS/bin/pkg-config" --modversion libpcre2-8 >/dev/null && echo "fetch_deps: .deps/bin/pkg-config works"
