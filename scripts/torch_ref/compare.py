"""The comparison: the relative errors of a dump's logits, loss, balancing loss, routing and every
gradient against the reference, and of a Hugging Face folder's weights and logits against the
checkpoint's, printed as the table's rows; each returns the names over their bound.
"""
import numpy as np
import torch

from .models import forward
from .objective import round_bf16


def errors(got, ref):
    """(relative L2 error, max |got - ref| / max |ref|) in float64; inf when got is not finite."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(got)):
        return float("inf"), float("inf")
    diff = np.abs(got - ref)
    norm = np.linalg.norm(ref)
    rel = np.linalg.norm(diff) / norm if norm > 0 else np.linalg.norm(diff)
    peak = np.max(np.abs(ref)) if ref.size else 0.0
    worst = (np.max(diff) if diff.size else 0.0) / (peak if peak > 0 else 1.0)
    return float(rel), float(worst)


def compare(dump, ref, tol, verbose):
    """Prints the dump's rows of the table; returns the names over the bound."""
    meta, _, _, logits, grads = dump
    ref_logits, ref_loss, ref_grads, ref_aux, margin = ref
    loss_err = abs(meta["loss"] - ref_loss) / abs(ref_loss)
    grad_rows = [("grad " + name, errors(grads[name], ref_grads[name])) for name in ref_grads]
    # (name checked, name printed, (rel, peak)); the grads printed are the worst unless verbose.
    checked = [("logits", "logits", errors(logits, ref_logits)),
               ("loss", "loss %.6f vs %.6f" % (meta["loss"], ref_loss), (loss_err, loss_err))]
    if ref_aux is not None:
        aux_err = abs(meta["aux_loss"] - ref_aux) / abs(ref_aux)
        checked.append(("balancing loss", "balancing loss %.6f vs %.6f" % (meta["aux_loss"], ref_aux),
                        (aux_err, aux_err)))
    if margin is not None and meta["routing_choices"] is not None:
        _, differing, shortfall = margin
        blocks, rows = meta["routing_choices"].shape[:2]
        checked.append(("routing", "routing: %d of %d rows otherwise" % (differing, blocks * rows),
                        (shortfall, shortfall)))
    printed = [(name, values) for _, name, values in checked]
    worst = max(grad_rows, key=lambda r: r[1][0])
    printed += grad_rows if verbose else [(worst[0] + " (worst)", worst[1])]
    everything = ("grad (all)", errors(np.concatenate([g.reshape(-1) for g in grads.values()]),
                                       np.concatenate([g.reshape(-1) for g in ref_grads.values()])))
    printed.append(everything)
    for name, (rel, peak) in printed:
        print("%-10s %-40s %10.3e %10.3e %8.0e  %s" % (meta["tag"], name[:40], rel, peak, tol,
                                                       "ok" if rel <= tol else "FAIL"))
    if margin is not None:
        print("%-10s routing: smallest gap between a token's k-th and (k+1)-th expert probability %.3e%s" % (
            meta["tag"], margin[0], " (float32 may route otherwise)" if margin[0] < 1e-6 else ""))
    checked = [(name, values) for name, _, values in checked] + grad_rows + [everything]
    return [name for name, (rel, _) in checked if not rel <= tol]


def compare_hf(path, config, hf_weights, ckpt_weights, model, dump, tol):
    """Prints the folder's rows; returns the names of what differs."""
    bf16 = config.get("torch_dtype") == "bfloat16"
    tag = "hf %s" % ("bf16" if bf16 else "fp32")
    want = {name: round_bf16(a) if bf16 else a for name, a in ckpt_weights.items()}
    failed = ["weight " + name for name in want if not np.array_equal(hf_weights[name], want[name])]
    print("%-10s %-40s %10s %10s %8s  %s" % (tag, "weights equal, bit for bit", "", "", "",
                                               "ok" if not failed else "FAIL: %d differ" % len(failed)))
    meta, tokens, _, logits, _ = dump
    with torch.no_grad():
        as64 = lambda w: {n: torch.tensor(a, dtype=torch.float64) for n, a in w.items()}
        tok = torch.tensor(tokens, dtype=torch.long)
        ref_hf = forward(as64(hf_weights), model, tok).view(tokens.size, -1).numpy()
        ref_ckpt = forward(as64(want), model, tok).view(tokens.size, -1).numpy()
    V = model["vocab_size"]
    rows = [("logits vs checkpoint's (exact)", errors(ref_hf[:, :V], ref_ckpt[:, :V]), 0.0)]
    if not bf16 and meta["compute_dtype"] == "fp32":
        rows.append(("logits vs picotrain " + meta["tag"], errors(logits[:, :V], ref_hf[:, :V]), tol))
    for name, (rel, peak), bound in rows:
        ok = rel <= bound
        print("%-10s %-40s %10.3e %10.3e %8.0e  %s" % (tag, name[:40], rel, peak, bound, "ok" if ok else "FAIL"))
        if not ok:
            failed.append(name)
    return failed
