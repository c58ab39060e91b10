#!/usr/bin/env bash
# scripts/gpu_prebuilt.sh uses a carried .gpubin only when it was packed from the sources here
# (scripts/source_hash.sh in its BUILD_INFO): a fake checkout with a fake prebuilt picotrain,
# first matching, then after a source file changed, then with GPU_BIN_ANY_SOURCES=1.
set -euo pipefail
SCRIPTS=$(cd "$(dirname "$0")/../scripts" && pwd)
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/core" "$ROOT/.gpubin"
echo "int x = 1;" >"$ROOT/core/a.cpp"
printf '#!/bin/sh\nexit 0\n' >"$ROOT/.gpubin/picotrain"
chmod +x "$ROOT/.gpubin/picotrain"
echo "sources: $(bash "$SCRIPTS/source_hash.sh" "$ROOT")" >"$ROOT/.gpubin/BUILD_INFO"

chosen() {  # GPU_BIN as gpu_prebuilt.sh leaves it, its messages on stderr
  ( unset GPU_BIN; export ROOT; source "$SCRIPTS/gpu_prebuilt.sh"; echo "$GPU_BIN" )
}
fail() { echo "FAIL: $*"; exit 1; }

[ "$(chosen 2>/dev/null)" = "$ROOT/.gpubin" ] || fail "a pack of these sources is not used"
echo "int x = 2;" >"$ROOT/core/a.cpp"
[ -z "$(chosen 2>/dev/null)" ] || fail "a pack of other sources is used"
chosen 2>&1 >/dev/null | grep -q "packed from other sources" || fail "no message for a stale pack"
[ "$(GPU_BIN_ANY_SOURCES=1 chosen 2>/dev/null)" = "$ROOT/.gpubin" ] || fail "GPU_BIN_ANY_SOURCES=1 is ignored"
# A file outside the fingerprinted folders (docs) changes nothing.
echo "int x = 1;" >"$ROOT/core/a.cpp"
mkdir -p "$ROOT/docs" && echo "notes" >"$ROOT/docs/x.md"
[ "$(chosen 2>/dev/null)" = "$ROOT/.gpubin" ] || fail "a docs change made the pack stale"
echo "gpu_prebuilt_check: ok"
