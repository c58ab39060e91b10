#!/usr/bin/env bash
# ctest torch_reference: the independent PyTorch GPT-2 (scripts/torch_reference.py) against
# picotrain's CPU backend, from a real checkpoint of configs/tiny-gpt2.json (GPT-2's 50257-token
# vocabulary, padded to 50304), and proof that the comparison can fail:
#   1. two training steps on random tokens, a checkpoint after each;
#   2. reference_dump on each backend from the latest checkpoint; the script must pass (exit 0);
#   3. the first backend's dump with one gradient element moved by 10x the bound of its tensor's
#      norm (1e-4 for fp32): the script must fail (exit 1) naming that tensor;
#   4. a dump of the first checkpoint compared with the second: the script must refuse it (exit 2);
#   5. `picotrain convert --format hf` to Hugging Face folders (fp32, bf16): the script reads them
#      by Hugging Face's names and their weights and logits must equal the checkpoint's; one
#      changed element must fail naming its tensor; the fp32 folder imported back with
#      `picotrain convert` must be the checkpoint the dump was made from (same weight checksums).
#
#   test/torch_reference.sh PICOTRAIN REFERENCE_DUMP SOURCE_DIR
#   TORCH_REFERENCE_BACKENDS="cpu:fp32 cuda:fp32 cuda:bf16" test/torch_reference.sh ...  # gpu_check.sh
# The backends are DEVICE:DTYPE pairs (default cpu:fp32, the one CI has).
# Exit status: 0 passed, 1 failed, 77 skipped: no python3 with torch and numpy (Debian's
# python3-torch is for /usr/bin/python3, which may not be the python3 first on PATH;
# PICOTRAIN_PYTHON names another interpreter).
set -euo pipefail
PICOTRAIN=$1
REFERENCE_DUMP=$2
SRC=$3
read -r -a BACKENDS <<<"${TORCH_REFERENCE_BACKENDS:-cpu:fp32}"

PY=""
for candidate in ${PICOTRAIN_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch, numpy" >/dev/null 2>&1; then
    PY=$candidate
    break
  fi
done
if [ -z "$PY" ]; then
  echo "torch_reference: skipped: no python3 with torch and numpy (Debian: apt-get install python3-torch)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/picotrain_torch_reference.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# expect RC WHAT COMMAND...: runs COMMAND, shows its output, fails the test unless it exits RC.
expect() {
  local want=$1 what=$2 rc=0
  shift 2
  echo "== $what (expect exit $want)"
  "$@" >"$WORK/out.log" 2>&1 || rc=$?
  cat "$WORK/out.log"
  if [ "$rc" -ne "$want" ]; then
    echo "torch_reference: FAILED: $what exited $rc, expected $want"
    exit 1
  fi
}

# 1. An llm.c shard of random GPT-2 ids (header: magic 20240520, version 1, token count).
"$PY" - "$WORK/tok_train_000000.bin" <<'EOF'
import sys
import numpy as np
tokens = np.random.default_rng(0).integers(0, 50257, 20000).astype("<u2")
header = np.zeros(256, dtype="<i4")
header[:3] = (20240520, 1, tokens.size)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
EOF
expect 0 "train configs/tiny-gpt2.json for 2 steps" \
  "$PICOTRAIN" train --device cpu --config "$SRC/configs/tiny-gpt2.json" --set run.out_dir="$WORK/run" \
  --set "data.train=$WORK/tok_train_*.bin" --set data.val= --set batch.global_batch_tokens=512 \
  --set schedule.total_steps=2 --set schedule.warmup_steps=1 --set checkpoint.every_steps=1 \
  --set logging.sample_every=0
CKPT="$WORK/run/checkpoints"

# 2. Every backend against the reference.
DUMPS=()
for backend in "${BACKENDS[@]}"; do
  device=${backend%%:*}
  dtype=${backend#*:}
  expect 0 "reference_dump --device $device --dtype $dtype" "$REFERENCE_DUMP" --checkpoint "$CKPT" \
    --out "$WORK/${device}_$dtype" --device "$device" --dtype "$dtype"
  DUMPS+=("$WORK/${device}_$dtype")
done
expect 0 "torch_reference.py: ${BACKENDS[*]}" "$PY" "$SRC/scripts/torch_reference.py" --checkpoint "$CKPT" "${DUMPS[@]}"

# 3. One wrong gradient element must fail the comparison.
cp -r "${DUMPS[0]}" "$WORK/perturbed"
"$PY" - "$WORK/perturbed" h.1.mlp.c_fc.bias <<'EOF'
import json, os, sys
import numpy as np
folder, name = sys.argv[1], sys.argv[2]
meta = json.load(open(os.path.join(folder, "dump.json")))
t = next(t for t in meta["grads"]["tensors"] if t["name"] == name)
grads = np.memmap(os.path.join(folder, meta["grads"]["file"]), dtype="<f4", mode="r+")
g = grads[t["offset"]:t["offset"] + int(np.prod(t["shape"]))]
bound = 2e-2 if meta["compute_dtype"] == "bf16" else 1e-5  # torch_reference.py's defaults
g[7] += 10 * bound * np.linalg.norm(g.astype(np.float64))
grads.flush()
EOF
expect 1 "torch_reference.py: a perturbed gradient" "$PY" "$SRC/scripts/torch_reference.py" --checkpoint "$CKPT" \
  "$WORK/perturbed"
grep -q "over the bound: grad h.1.mlp.c_fc.bias" "$WORK/out.log" ||
  { echo "torch_reference: FAILED: the perturbed tensor h.1.mlp.c_fc.bias is not named"; exit 1; }

# 4. A dump made from another checkpoint is refused, not compared.
expect 0 "reference_dump on the CPU from step 1" "$REFERENCE_DUMP" --checkpoint "$CKPT/step_00000001" \
  --out "$WORK/step1" --device cpu
expect 2 "torch_reference.py: a dump of step 1 against step 2" "$PY" "$SRC/scripts/torch_reference.py" \
  --checkpoint "$CKPT" "$WORK/step1"

# 5. Hugging Face folders out and back in.
expect 0 "convert --format hf" "$PICOTRAIN" convert --from "$CKPT" --to "$WORK/hf" --format hf
expect 0 "convert --format hf --dtype bf16" "$PICOTRAIN" convert --from "$CKPT" --to "$WORK/hf16" --format hf \
  --dtype bf16
expect 0 "torch_reference.py --hf: fp32 and bf16 folders" "$PY" "$SRC/scripts/torch_reference.py" \
  --checkpoint "$CKPT" --hf "$WORK/hf" --hf "$WORK/hf16" "${DUMPS[0]}"
cp -r "$WORK/hf" "$WORK/hf_perturbed"
"$PY" - "$WORK/hf_perturbed/model.safetensors" transformer.h.1.mlp.c_fc.weight <<'EOF'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    begin = json.loads(f.read(n))[name]["data_offsets"][0]
    f.seek(8 + n + begin + 4 * 5)
    (x,) = struct.unpack("<f", f.read(4))
    f.seek(-4, 1)
    f.write(struct.pack("<f", x + 1e-3))
EOF
expect 1 "torch_reference.py --hf: a changed weight" "$PY" "$SRC/scripts/torch_reference.py" --checkpoint "$CKPT" \
  --hf "$WORK/hf_perturbed" "${DUMPS[0]}"
grep -q "weight h.1.mlp.c_fc.weight" "$WORK/out.log" ||
  { echo "torch_reference: FAILED: the changed tensor h.1.mlp.c_fc.weight is not named"; exit 1; }
expect 0 "convert the Hugging Face folder back" "$PICOTRAIN" convert --from "$WORK/hf" --to "$WORK/imported"
expect 0 "torch_reference.py: the imported checkpoint is the dumped one" "$PY" "$SRC/scripts/torch_reference.py" \
  --checkpoint "$WORK/imported" "${DUMPS[0]}"

echo "torch_reference: passed"
