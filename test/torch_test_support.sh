# Sourced by the PyTorch reference tests (torch_reference.sh, torch_mc_reference.sh) with
# TEST_NAME set: finds PY, a python3 with torch and numpy (PICOTRAIN_PYTHON first; none: the test
# is skipped, exit 77), makes WORK, a temporary folder removed on exit, and defines expect.

PY=""
for candidate in ${PICOTRAIN_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch, numpy" >/dev/null 2>&1; then
    PY=$candidate
    break
  fi
done
if [ -z "$PY" ]; then
  echo "$TEST_NAME: skipped: no python3 with torch and numpy (Debian: apt-get install python3-torch)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/picotrain_$TEST_NAME.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# expect RC WHAT COMMAND...: runs COMMAND, shows its output, fails the test unless it exits RC.
expect() {
  local want=$1 what=$2 rc=0
  shift 2
  echo "== $what (expect exit $want)"
  "$@" >"$WORK/out.log" 2>&1 || rc=$?
  cat "$WORK/out.log"
  if [ "$rc" -ne "$want" ]; then
    echo "$TEST_NAME: FAILED: $what exited $rc, expected $want"
    exit 1
  fi
}
