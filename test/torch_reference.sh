#!/usr/bin/env bash
# ctest torch_reference: the independent PyTorch GPT-2, Llama and Mixtral
# (scripts/torch_reference.py) against picotrain's CPU backend, from real checkpoints with GPT-2's
# 50257-token vocabulary (padded to 50304), and proof that the comparison can fail. First the script's own Llama and
# Mixtral are checked against a loop written from the definitions (--self-test). Then, for each
# model
#   gpt2:    configs/tiny-gpt2.json with 2 heads of 64 channels, dumped at 1 x 147 tokens: head size
#            64 in bf16 is what the CUDA backend's tensor-core flash kernels take (the Llama's and
#            the Mixtral's 16 take the CUDA-core ones), and 147 tokens leave a ragged last tile
#            (128-row tiles both ways) with two key blocks adding into one dQ tile (one
#            sequence: the float64 reference's time grows with tokens x vocab);
#   llama:   the same run settings as a Llama of 2 layers, d_model 64, 4 query heads over 2
#            key/value heads, an untied head, norm_eps 1e-6 and rope_theta 500000 (not the
#            defaults, so they must travel through the checkpoint and the folder);
#   mixtral: that Llama with 4 experts of width 96 in every block, 2 per token, and the
#            balancing loss weighted 0.02 (its gradient is part of every gradient compared):
#   1. two training steps on random tokens, a checkpoint after each;
#   2. reference_dump on each backend from the latest checkpoint (batch 2 x 47 unless the model
#      says otherwise); the script must pass (exit 0);
#   3. the first backend's dump with one gradient element moved by 10x the bound of its tensor's
#      norm (1e-4 for fp32; the mixtral's router): the script must fail (exit 1) naming that tensor;
#      for the mixtral also the dump with one token's expert replaced by one it did not choose:
#      the routing check must fail (the reference follows each dump's routing, and checks it);
#   4. a dump of the first checkpoint compared with the second: the script must refuse it (exit 2);
#   5. `picotrain convert --format hf` to Hugging Face folders (fp32, bf16; the mixtral's a
#      MixtralForCausalLM): the script reads them
#      by Hugging Face's names and their weights and logits must equal the checkpoint's; one
#      changed element must fail naming its tensor; the fp32 folder imported back with
#      `picotrain convert` must be the checkpoint the dump was made from (same weight checksums).
#
#   test/torch_reference.sh PICOTRAIN REFERENCE_DUMP SOURCE_DIR
#   TORCH_REFERENCE_BACKENDS="cpu:fp32 cuda:fp32 cuda:bf16" test/torch_reference.sh ...  # gpu_check.sh
#   TORCH_REFERENCE_ARCHS=llama test/torch_reference.sh ...  # one model only
# The backends are DEVICE:DTYPE pairs (default cpu:fp32, the one CI has); the models gpt2, llama,
# mixtral (default all three).
# Exit status: 0 passed, 1 failed, 77 skipped: no python3 with torch and numpy (Debian's
# python3-torch is for /usr/bin/python3, which may not be the python3 first on PATH;
# PICOTRAIN_PYTHON names another interpreter).
set -euo pipefail
PICOTRAIN=$1
REFERENCE_DUMP=$2
SRC=$3
read -r -a BACKENDS <<<"${TORCH_REFERENCE_BACKENDS:-cpu:fp32}"
read -r -a ARCHS <<<"${TORCH_REFERENCE_ARCHS:-gpt2 llama mixtral}"

TEST_NAME=torch_reference
# PY, WORK and expect.
source "$(dirname "$0")/torch_test_support.sh"

# The script's Llama and Mixtral against its loop over the definitions, before it judges picotrain's.
expect 0 "torch_reference.py --self-test" "$PY" "$SRC/scripts/torch_reference.py" --self-test

# An llm.c shard of random GPT-2 ids (header: magic 20240520, version 1, token count).
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

# check_model NAME GRAD HF_TENSOR HF_AS DUMP_OPTIONS [--set ...]: steps 1-5 for one model, in
# $WORK/NAME, from configs/tiny-gpt2.json with the --set options given. GRAD is the gradient
# perturbed in step 3; HF_TENSOR the folder's tensor changed in step 5, which the script names
# HF_AS (picotrain's name); DUMP_OPTIONS reference_dump's batch options ("": its 2 x 47 tokens).
check_model() {
  local name=$1 grad=$2 hf_tensor=$3 hf_as=$4 dump_options
  read -r -a dump_options <<<"$5"
  shift 5
  local dir="$WORK/$name"
  mkdir -p "$dir"

  # 1. Two training steps.
  expect 0 "$name: train for 2 steps" \
    "$PICOTRAIN" train --device cpu --config "$SRC/configs/tiny-gpt2.json" "$@" --set run.out_dir="$dir/run" \
    --set "data.train=$WORK/tok_train_*.bin" --set data.val= --set batch.global_batch_tokens=512 \
    --set schedule.total_steps=2 --set schedule.warmup_steps=1 --set checkpoint.every_steps=1 \
    --set logging.sample_every=0
  local ckpt="$dir/run/checkpoints"

  # 2. Every backend against the reference.
  local dumps=() backend device dtype
  for backend in "${BACKENDS[@]}"; do
    device=${backend%%:*}
    dtype=${backend#*:}
    expect 0 "$name: reference_dump --device $device --dtype $dtype" "$REFERENCE_DUMP" --checkpoint "$ckpt" \
      --out "$dir/${device}_$dtype" --device "$device" --dtype "$dtype" "${dump_options[@]}"
    dumps+=("$dir/${device}_$dtype")
  done
  expect 0 "$name: torch_reference.py: ${BACKENDS[*]}" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$ckpt" "${dumps[@]}"

  # 3. One wrong gradient element must fail the comparison.
  cp -r "${dumps[0]}" "$dir/perturbed"
  "$PY" - "$dir/perturbed" "$grad" <<'EOF'
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
  expect 1 "$name: torch_reference.py: a perturbed gradient" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$ckpt" "$dir/perturbed"
  grep -q "over the bound: grad $grad" "$WORK/out.log" ||
    { echo "torch_reference: FAILED: the perturbed tensor $grad is not named"; exit 1; }

  # 3b. With experts: one token sent to an expert it did not choose (of those, the one that falls
  # furthest below its choices) must fail the routing check, naming it.
  if [ -f "${dumps[0]}/routing.i32" ]; then
    cp -r "${dumps[0]}" "$dir/misrouted"
    "$PY" - "$dir/misrouted" "$ckpt" "$SRC/scripts" <<'EOF'
import json, os, sys
import numpy as np
import torch
folder, ckpt = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import torch_reference as ref
meta = json.load(open(os.path.join(folder, "dump.json")))
routing = np.fromfile(os.path.join(folder, "routing.i32"), dtype="<i4").reshape(meta["routing"]["shape"])
_, manifest, weights = ref.read_checkpoint(ckpt)
model = manifest["model"]
tokens = torch.tensor(np.fromfile(os.path.join(folder, "tokens.i32"), dtype="<i4").reshape(meta["batch"], -1),
                      dtype=torch.long)
w = {n: torch.tensor(a, dtype=torch.float64) for n, a in weights.items()}
row, best = 5, None
for e in (e for e in range(model["moe"]["n_experts"]) if e not in routing[-1, row]):
    trial = routing.copy()
    trial[-1, row, 0] = e
    routed = []
    with torch.no_grad():
        ref.forward(w, model, tokens, routed, trial)
    if best is None or routed[-1][3] > best[0]:
        best = (routed[-1][3], trial)
best[1].astype("<i4").tofile(os.path.join(folder, "routing.i32"))
print("misrouted: token %d of the last sparse block, shortfall %.3e" % (row, best[0]))
EOF
    expect 1 "$name: torch_reference.py: a token routed otherwise" "$PY" "$SRC/scripts/torch_reference.py" \
      --checkpoint "$ckpt" "$dir/misrouted"
    grep -q "over the bound: .*routing" "$WORK/out.log" ||
      { echo "torch_reference: FAILED: the misrouted token is not named"; exit 1; }
  fi

  # 4. A dump made from another checkpoint is refused, not compared.
  expect 0 "$name: reference_dump on the CPU from step 1" "$REFERENCE_DUMP" --checkpoint "$ckpt/step_00000001" \
    --out "$dir/step1" --device cpu "${dump_options[@]}"
  expect 2 "$name: torch_reference.py: a dump of step 1 against step 2" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$ckpt" "$dir/step1"

  # 5. Hugging Face folders out and back in.
  expect 0 "$name: convert --format hf" "$PICOTRAIN" convert --from "$ckpt" --to "$dir/hf" --format hf
  expect 0 "$name: convert --format hf --dtype bf16" "$PICOTRAIN" convert --from "$ckpt" --to "$dir/hf16" \
    --format hf --dtype bf16
  expect 0 "$name: torch_reference.py --hf: fp32 and bf16 folders" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$ckpt" --hf "$dir/hf" --hf "$dir/hf16" "${dumps[0]}"
  cp -r "$dir/hf" "$dir/hf_perturbed"
  "$PY" - "$dir/hf_perturbed/model.safetensors" "$hf_tensor" <<'EOF'
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
  expect 1 "$name: torch_reference.py --hf: a changed weight" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$ckpt" --hf "$dir/hf_perturbed" "${dumps[0]}"
  grep -q "weight $hf_as" "$WORK/out.log" ||
    { echo "torch_reference: FAILED: the changed tensor $hf_as is not named"; exit 1; }
  expect 0 "$name: convert the Hugging Face folder back" "$PICOTRAIN" convert --from "$dir/hf" --to "$dir/imported"
  expect 0 "$name: torch_reference.py: the imported checkpoint is the dumped one" "$PY" \
    "$SRC/scripts/torch_reference.py" --checkpoint "$dir/imported" "${dumps[0]}"
}

GPT2=(--set model.n_heads=2)  # d_model 128: head size 64
LLAMA=(--set model.arch=llama --set model.n_layers=2 --set model.d_model=64 --set model.n_heads=4
  --set model.n_kv_heads=2 --set model.norm_eps=1e-6 --set model.rope_theta=500000)
for arch in "${ARCHS[@]}"; do
  case $arch in
    gpt2)
      check_model gpt2 h.1.mlp.c_fc.bias transformer.h.1.mlp.c_fc.weight h.1.mlp.c_fc.weight "--batch 1 --seq-len 147" \
        "${GPT2[@]}"
      ;;
    llama)
      check_model llama model.layers.1.self_attn.k_proj.weight model.layers.1.mlp.up_proj.weight \
        model.layers.1.mlp.up_proj.weight "" "${LLAMA[@]}"
      ;;
    mixtral)
      check_model mixtral model.layers.1.block_sparse_moe.gate.weight \
        model.layers.0.block_sparse_moe.experts.2.w3.weight model.layers.0.block_sparse_moe.experts.2.w3.weight "" \
        "${LLAMA[@]}" --set moe.n_experts=4 --set moe.top_k=2 --set moe.expert_hidden=96 --set moe.aux_loss_coef=0.02
      ;;
    *)
      echo "torch_reference: unknown model $arch in TORCH_REFERENCE_ARCHS (gpt2, llama, mixtral)"
      exit 1
      ;;
  esac
done

echo "torch_reference: passed"
