"""Multiple-choice scoring (HellaSwag's JSONL: ctx, endings, label per line) in float64, from the
task file itself, to check `picotrain eval --task FILE --scores SCORES`.

Written from llm.c's definition (not from picotrain's code): each ending is tokenized with a
leading space after the context's tokens; its loss is the sum of the cross-entropies of its
tokens (over the first vocab_size logits) given everything before them; the prediction is the
ending with the lowest summed loss (acc) and with the lowest mean loss per token (acc_norm), ties
to the lower index. A row holds seq_len inputs, so context + ending may have seq_len + 1 tokens:
a longer example loses tokens from the left of its context (one cut for all its endings, by the
longest), and an example whose longest ending alone has more than seq_len tokens is skipped.

Tokenization here is the byte tokenizer's (UTF-8 bytes, vocabulary 256), so this side needs no
tokenizer files; the model must have vocab_size 256.

The comparison, per scored example: the same context and endings (token ids), each ending's
summed and mean loss within the bound (relative), and the same two predictions; then the same
count, skipped count and accuracies.
"""
import json
import math

import torch
import torch.nn.functional as F

from . import BadInput
from .models import forward


def read_task(path, max_examples=0):
    """[(context, [endings], label)] of the JSONL file (blank lines skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if max_examples and len(out) >= max_examples:
                break
            if not line.strip():
                continue
            try:
                j = json.loads(line)
                out.append((j["ctx"], list(j["endings"]), int(j["label"])))
            except (ValueError, KeyError, TypeError) as e:
                raise BadInput("%s line %d: %s" % (path, number, e))
    return out


def byte_ids(text):
    return list(text.encode("utf-8"))


def layout(task, seq_len):
    """[(index in the task, context ids after the cut, [ending ids], label)], skipped count."""
    rows, skipped = [], 0
    for index, (ctx, endings, label) in enumerate(task):
        context = byte_ids(ctx)
        ends = [byte_ids(" " + e) for e in endings]
        longest = max(len(e) for e in ends)
        cut = max(0, len(context) + longest - (seq_len + 1))
        if cut >= len(context):
            skipped += 1
            continue
        rows.append((index, context[cut:], ends, label))
    return rows, skipped


def ending_losses(w, model, context, ending, device):
    """(summed loss, mean loss) of `ending`'s tokens after `context`, in float64."""
    ids = torch.tensor([context + ending], dtype=torch.long, device=device)
    logits = forward(w, model, ids[:, :-1])[0, :, :model["vocab_size"]]
    logp = F.log_softmax(logits, dim=-1)
    first = len(context) - 1  # the position whose next token is the ending's first
    targets = ids[0, len(context):]
    losses = -logp[first:, :].gather(1, targets[:, None])[:, 0]
    total = float(losses.sum().item())
    return total, total / len(ending)


def score(weights, model, task_path, seq_len, max_examples, device):
    """The reference's scores: ([per example dict], skipped)."""
    if model["vocab_size"] != 256:
        raise BadInput("the multiple-choice check tokenizes with the byte tokenizer: the model's vocabulary is %d, "
                       "not 256" % model["vocab_size"])
    w = {name: torch.tensor(a, dtype=torch.float64, device=device) for name, a in weights.items()}
    rows, skipped = layout(read_task(task_path, max_examples), seq_len)
    out = []
    with torch.no_grad():
        for index, context, ends, label in rows:
            sums, means = zip(*(ending_losses(w, model, context, e, device) for e in ends))
            out.append({"example": index, "label": label, "context": context, "endings": ends,
                        "loss_sum": list(sums), "loss_mean": list(means),
                        "pred": min(range(len(sums)), key=lambda k: (sums[k], k)),
                        "pred_norm": min(range(len(means)), key=lambda k: (means[k], k))})
    return out, skipped


def read_scores(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise BadInput("cannot read the scores %s: %s" % (path, e))


def compare_scores(mine, skipped, theirs, tol):
    """Prints the comparison; returns the list of what differs (empty: all agree)."""
    bad = []
    if len(mine) != len(theirs):
        bad.append("%d examples scored here, %d by picotrain" % (len(mine), len(theirs)))
    worst = 0.0
    for a, b in zip(mine, theirs):
        where = "example %d" % a["example"]
        if b["example"] != a["example"]:
            bad.append("%s: picotrain's line is example %d" % (where, b["example"]))
            continue
        if b["context"] != a["context"] or b["endings"] != a["endings"]:
            bad.append("%s: other token ids" % where)
            continue
        for key in ("loss_sum", "loss_mean"):
            for k, (x, y) in enumerate(zip(a[key], b[key])):
                rel = abs(x - y) / max(abs(x), 1e-12)
                worst = max(worst, rel)
                if not rel <= tol or math.isnan(y):
                    bad.append("%s ending %d: %s %.9g here, %.9g by picotrain (rel %.2e > %.0e)" %
                               (where, k, key, x, y, rel, tol))
        for key in ("pred", "pred_norm"):
            if a[key] != b[key]:
                bad.append("%s: %s %d here, %d by picotrain" % (where, key, a[key], b[key]))
    n = len(mine)
    acc = sum(e["pred"] == e["label"] for e in mine) / max(n, 1)
    acc_norm = sum(e["pred_norm"] == e["label"] for e in mine) / max(n, 1)
    print("multiple choice: %d examples scored, %d skipped; acc %.4f, acc_norm %.4f; worst relative loss "
          "difference %.2e (bound %.0e)" % (n, skipped, acc, acc_norm, worst, tol))
    for line in bad:
        print("multiple choice: %s" % line)
    return bad
