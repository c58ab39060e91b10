#!/usr/bin/env python3
"""An independent GPT-2 in PyTorch, to check picotrain's logits, loss and gradients.

picotrain's GPU test binary writes one batch, the initial weights and what each backend
computed from them (test/gpu_model.cpp, the hidden "[dump]" case):

    PICOTRAIN_DUMP_DIR=dump build/test/gpu_model "[dump]"
    python3 scripts/torch_reference.py --dump dump

This script rebuilds the model from those weights in float64 (on the GPU when there is one),
runs the same batch, and compares per backend:
  cpu        the fp32 CPU reference backend         relative L2 <= --tol-fp32 (1e-4)
  cuda_fp32  the CUDA backend computing in fp32     relative L2 <= --tol-fp32 (1e-4)
  cuda_bf16  the CUDA backend computing in bf16     relative L2 <= --tol-bf16 (2e-2)
for the logits (an eval pass), the loss and every parameter's gradient (one training pass,
loss = sum of per-token cross-entropies / (B*T), positions with target -1 ignored). The bf16
backend computes with bf16-rounded weights, so its reference does too: the comparison
measures activation rounding, not the rounding of the weights.

The model is written here from GPT-2's definition (not copied from any implementation):
token + learned position embeddings, pre-LayerNorm blocks (eps 1e-5) with causal multi-head
attention (scale 1/sqrt(head_dim)) and a 4x MLP with tanh-approximate GELU, a final LayerNorm
and an LM head tied to the token embedding over the padded vocabulary (the loss uses the first
vocab_size columns). Weights are [out, in] as in picotrain: y = x @ W^T + b.

Dump format (little-endian): model.txt ("key value" lines: n_layers d_model n_heads vocab_size
padded_vocab max_seq_len B T), params.txt ("name offset numel dim0 [dim1]" per parameter, offsets
in floats into params.f32), params.f32, tokens.i32 and targets.i32 (B*T each), and per backend
<tag>_logits.f32 (B*T x padded_vocab), <tag>_loss.txt, <tag>_grads.f32 (laid out as params.f32).

Exit status: 0 all within tolerance, 1 something is not, 2 the dump is missing or malformed.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

TAGS = ("cpu", "cuda_fp32", "cuda_bf16")


def read_kv(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                key, value = line.split()
                out[key] = int(value)
    return out


def read_specs(path):
    specs = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts:
                specs.append((parts[0], int(parts[1]), int(parts[2]), tuple(int(d) for d in parts[3:])))
    return specs


def round_bf16(a):
    """fp32 -> bf16 -> fp32 with round-to-nearest-even, as picotrain's kernels and uploads round."""
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def forward(w, cfg, tokens):
    """Logits [B, T, Vp] of GPT-2 with weights w (name -> tensor) on token ids [B, T]."""
    B, T = tokens.shape
    C, NH, L = cfg["d_model"], cfg["n_heads"], cfg["n_layers"]
    HS = C // NH
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()

    def layer_norm(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], eps=1e-5)

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    x = w["wte"][tokens] + w["wpe"][:T]
    for layer in range(L):
        h = "h.%d." % layer
        qkv = linear(layer_norm(x, h + "ln_1"), h + "attn.c_attn")
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, h + "attn.c_proj")
        hidden = F.gelu(linear(layer_norm(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + linear(hidden, h + "mlp.c_proj")
    x = layer_norm(x, "ln_f")
    return x @ w["wte"].T


def reference(cfg, specs, flat, tokens, targets, device):
    """Logits [N, Vp], loss and the flat gradient of the loss, all float64."""
    w = {}
    for name, offset, numel, shape in specs:
        t = torch.tensor(flat[offset:offset + numel], dtype=torch.float64, device=device).view(*shape)
        w[name] = t.requires_grad_(True)
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    tok = torch.tensor(tokens, dtype=torch.long, device=device).view(B, T)
    tgt = torch.tensor(targets, dtype=torch.long, device=device).view(B * T)
    logits = forward(w, cfg, tok).view(B * T, -1)
    loss = F.cross_entropy(logits[:, :V], tgt, ignore_index=-1, reduction="sum") / (B * T)
    loss.backward()
    grads = np.zeros(len(flat), dtype=np.float64)
    for name, offset, numel, _ in specs:
        grads[offset:offset + numel] = w[name].grad.detach().cpu().numpy().reshape(-1)
    return logits.detach().cpu().numpy(), float(loss.item()), grads


def errors(got, ref):
    """(relative L2 error, max |got - ref| / max |ref|) in float64."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(got)):
        return float("inf"), float("inf")
    diff = got - ref
    norm = np.linalg.norm(ref)
    rel = np.linalg.norm(diff) / norm if norm > 0 else np.linalg.norm(diff)
    peak = np.max(np.abs(ref)) if ref.size else 0.0
    worst = np.max(np.abs(diff)) / peak if peak > 0 else (np.max(np.abs(diff)) if diff.size else 0.0)
    return float(rel), float(worst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", required=True, help="folder written by gpu_model \"[dump]\"")
    ap.add_argument("--tol-fp32", type=float, default=1e-4)
    ap.add_argument("--tol-bf16", type=float, default=2e-2)
    ap.add_argument("--verbose", action="store_true", help="print every parameter, not only the worst")
    args = ap.parse_args()

    d = args.dump
    try:
        cfg = read_kv(os.path.join(d, "model.txt"))
        specs = read_specs(os.path.join(d, "params.txt"))
        flat = np.fromfile(os.path.join(d, "params.f32"), dtype=np.float32)
        tokens = np.fromfile(os.path.join(d, "tokens.i32"), dtype=np.int32)
        targets = np.fromfile(os.path.join(d, "targets.i32"), dtype=np.int32)
    except (OSError, ValueError) as e:
        print("torch_reference: cannot read the dump in %s: %s" % (d, e), file=sys.stderr)
        return 2
    N, Vp = cfg["B"] * cfg["T"], cfg["padded_vocab"]
    if tokens.size != N or targets.size != N or flat.size != sum(s[2] for s in specs):
        print("torch_reference: the dump's sizes do not agree with model.txt/params.txt", file=sys.stderr)
        return 2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch_reference: GPT-2 %d layers, d_model %d, %d heads, vocab %d (padded %d), batch %d x %d; "
          "float64 on %s, torch %s" % (cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["vocab_size"], Vp,
                                       cfg["B"], cfg["T"], device, torch.__version__))
    refs = {}
    failed = False
    found = 0
    print("%-10s %-36s %12s %12s %10s  %s" % ("backend", "tensor", "rel L2", "max rel", "tolerance", "result"))
    for tag in TAGS:
        path = os.path.join(d, tag + "_grads.f32")
        if not os.path.exists(path):
            print("%-10s (no dump)" % tag)
            continue
        found += 1
        weights = round_bf16(flat) if tag == "cuda_bf16" else flat
        key = "bf16" if tag == "cuda_bf16" else "fp32"
        if key not in refs:
            refs[key] = reference(cfg, specs, weights.astype(np.float64), tokens, targets, device)
        ref_logits, ref_loss, ref_grads = refs[key]
        tol = args.tol_bf16 if tag == "cuda_bf16" else args.tol_fp32
        logits = np.fromfile(os.path.join(d, tag + "_logits.f32"), dtype=np.float32).reshape(N, Vp)
        grads = np.fromfile(os.path.join(d, tag + "_grads.f32"), dtype=np.float32)
        with open(os.path.join(d, tag + "_loss.txt")) as f:
            loss = float(f.read().split()[0])

        rows = [("logits", errors(logits, ref_logits)),
                ("loss %.6f vs %.6f" % (loss, ref_loss),
                 (abs(loss - ref_loss) / abs(ref_loss), abs(loss - ref_loss) / abs(ref_loss)))]
        grad_rows = [("grad " + name, errors(grads[o:o + n], ref_grads[o:o + n])) for name, o, n, _ in specs]
        worst = max(grad_rows, key=lambda r: r[1][0])
        rows += grad_rows if args.verbose else [(worst[0] + " (worst)", worst[1])]
        rows.append(("grad (all)", errors(grads, ref_grads)))
        bad = [name for name, (rel, _) in rows + grad_rows if not rel <= tol]
        for name, (rel, peak) in rows:
            print("%-10s %-36s %12.3e %12.3e %10.1e  %s" % (tag, name[:36], rel, peak, tol,
                                                            "ok" if rel <= tol else "FAIL"))
        if bad:
            failed = True
            print("%-10s over tolerance: %s" % (tag, ", ".join(sorted(set(bad)))))
    if found == 0:
        print("torch_reference: no backend results in %s" % d, file=sys.stderr)
        return 2
    print("torch_reference: %s" % ("FAIL" if failed else "all within tolerance"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
