#!/usr/bin/env bash
# ctest torch_mc_reference: `picotrain eval --task` against the independent PyTorch reference
# (scripts/torch_reference.py --mc-task, scripts/torch_ref/multiple_choice.py), which reads the
# same checkpoint and the same task file, tokenizes it itself (bytes) and computes every ending's
# loss in float64. For a byte-level GPT-2 (configs/tiny.json) and a byte-level Llama
# (configs/tiny-llama.json with vocabulary 256):
#   1. three training steps on random bytes, a checkpoint at the end;
#   2. `picotrain eval --task` on a task file written here (14 examples: Unicode, a context long
#      enough to be cut from the left at rows of 48 tokens, an ending too long for them, which
#      both sides skip), with its --scores file; the script must pass (exit 0): the same token
#      ids, each ending's summed and mean loss within 1e-4 relative, the same predictions;
#   3. the scores with one loss moved by 1e-3 relative: the script must fail (exit 1) naming it.
#
#   test/torch_mc_reference.sh PICOTRAIN SOURCE_DIR
# Exit status: 0 passed, 1 failed, 77 skipped: no python3 with torch and numpy (PICOTRAIN_PYTHON
# names another interpreter).
set -euo pipefail
PICOTRAIN=$1
SRC=$2

TEST_NAME=torch_mc_reference
# PY, WORK and expect.
source "$(dirname "$0")/torch_test_support.sh"

# A shard of random bytes, and the task.
"$PY" - "$WORK" <<'EOF'
import json, random, sys
import numpy as np
work = sys.argv[1]
tokens = np.random.default_rng(0).integers(0, 256, 20000).astype("<u2")
header = np.zeros(256, dtype="<i4")
header[:3] = (20240520, 1, tokens.size)
with open(work + "/bytes_train_000000.bin", "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
rng = random.Random(4)
words = ["the", "cat", "sat", "on", "a", "mat", "then", "ran", "away", "café", "naïve", "über", "日本"]
phrase = lambda n: " ".join(rng.choice(words) for _ in range(n))
with open(work + "/task.jsonl", "w", encoding="utf-8") as f:
    for i in range(12):
        f.write(json.dumps({"ctx": "A man " + phrase(2 + i % 4) + ".",
                            "endings": [phrase(1 + (i + k) % 3) for k in range(4)],
                            "label": rng.randrange(4)}, ensure_ascii=False) + "\n")
    # cut from the left at rows of 48 tokens
    f.write(json.dumps({"ctx": "A long story " + phrase(12), "endings": [phrase(2), phrase(3), phrase(1), phrase(2)],
                        "label": 1}) + "\n")
    # an ending of 61 tokens: skipped at 48
    f.write(json.dumps({"ctx": "Too long", "endings": ["x" * 60, "y", "z", "w"], "label": 0}) + "\n")
EOF

check_model() {
  local name=$1 config=$2
  shift 2
  local dir="$WORK/$name"
  expect 0 "$name: train for 3 steps" "$PICOTRAIN" train --device cpu --config "$SRC/configs/$config" "$@" \
    --set run.out_dir="$dir/run" --set "data.train=$WORK/bytes_train_*.bin" --set data.val= \
    --set batch.global_batch_tokens=512 --set schedule.total_steps=3 --set schedule.warmup_steps=1 \
    --set logging.sample_every=0
  expect 0 "$name: picotrain eval --task" "$PICOTRAIN" eval --device cpu --checkpoint "$dir/run/checkpoints" \
    --task "$WORK/task.jsonl" --scores "$dir/scores.jsonl" --set batch.seq_len=48 --set batch.micro_batch_size=3
  grep -q "13 examples scored, 1 skipped" "$WORK/out.log" ||
    { echo "torch_mc_reference: FAILED: expected 13 examples scored and 1 skipped"; exit 1; }
  expect 0 "$name: torch_reference.py --mc-task" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$dir/run/checkpoints" --mc-task "$WORK/task.jsonl" --mc-scores "$dir/scores.jsonl" --mc-seq-len 48
  grep -q "13 examples scored, 1 skipped" "$WORK/out.log" ||
    { echo "torch_mc_reference: FAILED: the reference did not score 13 and skip 1"; exit 1; }

  # One ending's summed loss off by 1e-3 relative must fail, naming it.
  "$PY" - "$dir/scores.jsonl" "$dir/perturbed.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
lines[3]["loss_sum"][2] *= 1.001
with open(sys.argv[2], "w") as f:
    f.writelines(json.dumps(l) + "\n" for l in lines)
EOF
  expect 1 "$name: torch_reference.py --mc-task: a perturbed loss" "$PY" "$SRC/scripts/torch_reference.py" \
    --checkpoint "$dir/run/checkpoints" --mc-task "$WORK/task.jsonl" --mc-scores "$dir/perturbed.jsonl" \
    --mc-seq-len 48
  grep -q "example 3 ending 2: loss_sum" "$WORK/out.log" ||
    { echo "torch_mc_reference: FAILED: the perturbed loss is not named"; exit 1; }
}

check_model gpt2 tiny.json
check_model llama tiny-llama.json --set model.vocab_size=256
echo "torch_mc_reference: passed"
