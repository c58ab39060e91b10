#!/usr/bin/env python3
"""An independent GPT-2 in PyTorch, to check picotrain's logits, loss and gradients.

picotrain's side is a checkpoint (the checkpoints/ directory of a `picotrain train` run, or one
step_N directory in it) and what reference_dump (a tool built with the tests) computes from it
on a backend for one batch: the batch, the logits of an eval pass, the loss and every
parameter's gradient of one training pass (see test/reference_dump.cpp for the files):

    build/test/reference_dump --checkpoint RUN/checkpoints --out dump/cpu --device cpu
    build/test/reference_dump --checkpoint RUN/checkpoints --out dump/cuda_bf16 --device cuda --dtype bf16
    python3 scripts/torch_reference.py --checkpoint RUN/checkpoints dump/cpu dump/cuda_bf16

This script reads the checkpoint itself (manifest.json and the chunk files it names, checking
every master tensor's shape against GPT-2's), rebuilds the model in float64 (on the GPU when
PyTorch sees one), runs each dump's batch and compares, per dump:
  fp32 (cpu, cuda)  relative L2 <= --tol-fp32 (1e-5)
  bf16 (cuda)       relative L2 <= --tol-bf16 (2e-2)
for the logits, the loss (relative difference) and every parameter's gradient, with
loss = (sum of per-token cross-entropies over the first vocab_size logits) / (B*T), positions
whose target is -1 ignored. The bf16 backend computes with bf16-rounded weights, so its
reference does too: the comparison measures activation rounding, not the rounding of the
weights.

Why 1e-5 for fp32: the CPU backend's worst error on the tiny GPT-2 of the ctest is 2.4e-6 (fp32
keeps ~7 digits; the CUDA backend's fp32 matmuls never use TF32), while the nearest wrong
definition, GELU with erf instead of tanh, is 2.7e-5 on the logits and up to 8.8e-5 on a
gradient of that near-initial checkpoint (3.4e-4 after 30 steps): 1e-4 would let it through.
Why 2e-2 for bf16: it keeps ~3 digits (2^-9 = 2e-3 per rounding), and picotrain's own GPU
against CPU model test uses the same bound.

The model is written here from GPT-2's definition (not copied from any implementation):
token + learned position embeddings, pre-LayerNorm blocks (eps 1e-5) with causal multi-head
attention (scale 1/sqrt(head_dim)) and a 4x MLP with tanh-approximate GELU, a final LayerNorm
and an LM head tied to the token embedding over the padded vocabulary (the loss uses the first
vocab_size columns). Weights are [out, in]: y = x @ W^T + b. Parameter names follow Hugging Face
GPT-2 (wte, wpe, h.L.ln_1.weight, ..., ln_f.bias), as picotrain's checkpoints name them.

Hugging Face folders (`picotrain convert --format hf`; --hf DIR, repeatable) are read with this
script's own safetensors reader: an 8-byte little-endian header length, a JSON header giving
each tensor's dtype, shape and data_offsets (counted from the end of the header), then the raw
little-endian data. config.json must describe the checkpoint's model (GPT2LMHeadModel, n_embd,
n_layer, n_head, n_positions, vocab_size, tanh GELU, LayerNorm eps 1e-5, tied head). Its
tensors go into this GPT-2 by Hugging Face's names ("transformer." + picotrain's name, wte and
wpe with ".weight"), the Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, stored
[in, out]) transposed back and the embedding's rows past vocab_size zero-padded. Then every
weight must equal the checkpoint's bit for bit (rounded to bf16 first when torch_dtype is
bfloat16), and the logits of the first dump's batch from the folder's weights must equal those
from the checkpoint's exactly; an fp32 folder's logits must also be within --tol-fp32 of
picotrain's in that dump.

Chunk checksums are not recomputed here: reference_dump reads the same files through
picotrain's reader, which verifies every one.

Exit status: 0 every quantity within its bound, 1 something is not, 2 the checkpoint or a dump
is missing or malformed, or a dump was not made from this checkpoint (its master weights' chunk
checksums differ).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


class BadInput(Exception):
    """A checkpoint or dump that cannot be compared (exit status 2)."""


# ---- the checkpoint -------------------------------------------------------------------------------


def resolve_checkpoint(path):
    """`path` when it holds manifest.json, else the step directory path/latest names."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    raise BadInput("%s is neither a checkpoint (no manifest.json) nor a checkpoint directory (no latest)" % path)


def gpt2_shapes(model):
    """Every GPT-2 parameter's name and shape, in the order the model uses them."""
    C, L = model["d_model"], model["n_layers"]
    shapes = {"wte": (model["padded_vocab"], C), "wpe": (model["max_seq_len"], C)}
    for layer in range(L):
        h = "h.%d." % layer
        for name, shape in (("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
                            ("attn.c_attn.weight", (3 * C, C)), ("attn.c_attn.bias", (3 * C,)),
                            ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                            ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                            ("mlp.c_fc.weight", (4 * C, C)), ("mlp.c_fc.bias", (4 * C,)),
                            ("mlp.c_proj.weight", (C, 4 * C)), ("mlp.c_proj.bias", (C,))):
            shapes[h + name] = shape
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def read_tensor(step_dir, entry, file_bytes):
    """A whole f32 tensor of the manifest, assembled from its chunks (flat ranges, or strided
    runs: the pieces of tensor-parallel ranks), every element covered exactly once."""
    name = entry["name"]
    if entry["dtype"] != "f32":
        raise BadInput("%s: tensor %s is %s, expected f32" % (step_dir, name, entry["dtype"]))
    numel = int(np.prod(entry["shape"], dtype=np.int64))
    out = np.zeros(numel, dtype=np.float32)
    covered = np.zeros(numel, dtype=np.int32)
    for c in entry["chunks"]:
        begin, end, offset, nbytes = c["begin"], c["end"], c["offset"], c["bytes"]
        run, stride = c.get("run", 0), c.get("stride", 0)
        if run:
            runs = (end - begin - run) // stride + 1
            index = (begin + np.arange(runs, dtype=np.int64)[:, None] * stride +
                     np.arange(run, dtype=np.int64)[None, :]).reshape(-1)
        else:
            index = np.arange(begin, end, dtype=np.int64)
        if index.size * 4 != nbytes or end > numel or offset + nbytes > file_bytes.get(c["file"], -1):
            raise BadInput("%s: tensor %s: chunk [%d, %d) of %s does not fit its %d bytes or its file" %
                           (step_dir, name, begin, end, c["file"], nbytes))
        data = np.fromfile(os.path.join(step_dir, c["file"]), dtype="<f4", count=index.size, offset=offset)
        if data.size != index.size:
            raise BadInput("%s: %s is shorter than the manifest says" % (step_dir, c["file"]))
        out[index] = data
        covered[index] += 1
    if not np.all(covered == 1):
        raise BadInput("%s: tensor %s: %d elements are not stored exactly once" %
                       (step_dir, name, int(np.count_nonzero(covered != 1))))
    return out.reshape(entry["shape"])


def read_checkpoint(path):
    """(step directory, manifest, {name: float32 array}) of the checkpoint's master weights."""
    step_dir = resolve_checkpoint(path)
    try:
        with open(os.path.join(step_dir, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput("cannot read %s/manifest.json: %s" % (step_dir, e))
    if manifest.get("format") != "picotrain-checkpoint" or manifest.get("format_version") != 1:
        raise BadInput("%s: not a picotrain checkpoint of format version 1" % step_dir)
    model = manifest["model"]
    if model.get("arch") != "gpt2":
        raise BadInput("%s holds a %s model, not gpt2" % (step_dir, model.get("arch")))
    file_bytes = {}
    for f in manifest["files"]:
        size = os.path.getsize(os.path.join(step_dir, f["name"])) if os.path.exists(os.path.join(step_dir, f["name"])) else -1
        if size != f["bytes"]:
            raise BadInput("%s: %s has %d bytes, the manifest says %d" % (step_dir, f["name"], size, f["bytes"]))
        file_bytes[f["name"]] = size
    entries = {t["name"][len("master/"):]: t for t in manifest["tensors"] if t["name"].startswith("master/")}
    expected = gpt2_shapes(model)
    if set(entries) != set(expected):
        raise BadInput("%s: master tensors missing %s, unexpected %s" % (
            step_dir, sorted(set(expected) - set(entries)) or "none", sorted(set(entries) - set(expected)) or "none"))
    weights = {}
    for name, shape in expected.items():
        if tuple(entries[name]["shape"]) != shape:
            raise BadInput("%s: master/%s has shape %s, GPT-2 with %s has %s" %
                           (step_dir, name, entries[name]["shape"], json.dumps(model), list(shape)))
        weights[name] = read_tensor(step_dir, entries[name], file_bytes)
    return step_dir, manifest, weights


# ---- a dump of reference_dump ---------------------------------------------------------------------


def master_checksums(manifest):
    """The checksums of the master weights' chunks, in manifest order: which weights these are."""
    return [c["checksum"] for t in manifest["tensors"] if t["name"].startswith("master/") for c in t["chunks"]]


def read_dump(path, manifest, shapes):
    """The dump in `path`, checked to come from the checkpoint `manifest` describes."""
    try:
        with open(os.path.join(path, "dump.json")) as f:
            meta = json.load(f)
        if meta["master_checksums"] != master_checksums(manifest):
            raise BadInput("%s was made from %s (step %d), whose weights are not this checkpoint's (step %d)" %
                           (path, meta["checkpoint"], meta["step"], manifest["step"]))
        B, T = meta["batch"], meta["seq_len"]
        N, Vp = B * T, manifest["model"]["padded_vocab"]
        tokens = np.fromfile(os.path.join(path, "tokens.i32"), dtype="<i4")
        targets = np.fromfile(os.path.join(path, "targets.i32"), dtype="<i4")
        logits = np.fromfile(os.path.join(path, meta["logits"]["file"]), dtype="<f4")
        flat = np.fromfile(os.path.join(path, meta["grads"]["file"]), dtype="<f4")
        listed = [(t["name"], tuple(t["shape"]), t["offset"]) for t in meta["grads"]["tensors"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput("cannot read the dump in %s: %s" % (path, e))
    if tokens.size != N or targets.size != N or logits.size != N * Vp:
        raise BadInput("%s: tokens, targets or logits do not hold %d x %d positions" % (path, B, T))
    if [(n, s) for n, s, _ in listed] != list(shapes.items()):
        raise BadInput("%s: the gradients listed are not the checkpoint's master tensors in order" % path)
    grads = {}
    for name, shape, offset in listed:
        n = int(np.prod(shape))
        if offset + n > flat.size:
            raise BadInput("%s: %s ends at %d floats, past the end of grads" % (path, name, offset + n))
        grads[name] = flat[offset:offset + n].reshape(shape)
    meta["tag"] = "%s %s" % (meta["device"], meta["compute_dtype"])
    return meta, tokens.reshape(B, T), targets.reshape(B, T), logits.reshape(N, Vp), grads


# ---- a Hugging Face folder -------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_safetensors(path):
    """{name: float32 array} of a safetensors file, each tensor checked to fill its byte range."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise BadInput("%s: shorter than a safetensors header length" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise BadInput("%s: the header is not JSON: %s" % (path, e))
    data = blob[8 + n:]
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = SAFETENSORS_DTYPES.get(e["dtype"])
        if dtype is None or end > len(data) or \
                end - begin != int(np.prod(e["shape"], dtype=np.int64)) * torch.finfo(dtype).bits // 8:
            raise BadInput("%s: tensor %s: dtype %s, shape %s and offsets %s do not agree with the file" %
                           (path, name, e["dtype"], e["shape"], e["data_offsets"]))
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        tensors[name] = t.to(torch.float32).reshape(e["shape"]).numpy()
    return tensors


def read_hf_folder(path, model):
    """(config, {picotrain name: float32 array}) of a GPT2LMHeadModel folder for `model`."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput("cannot read %s/config.json: %s" % (path, e))
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": model["d_model"],
            "n_layer": model["n_layers"], "n_head": model["n_heads"], "n_positions": model["max_seq_len"],
            "vocab_size": model["vocab_size"], "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": True}
    wrong = ["%s=%r (want %r)" % (k, config.get(k), v) for k, v in want.items() if config.get(k) != v]
    if wrong:
        raise BadInput("%s/config.json does not describe the checkpoint's GPT-2: %s" % (path, ", ".join(wrong)))
    weights = {}
    for name, a in read_safetensors(os.path.join(path, "model.safetensors")).items():
        if not name.startswith("transformer."):
            raise BadInput("%s: unexpected tensor %s" % (path, name))
        name = name[len("transformer."):]
        if name in ("wte.weight", "wpe.weight"):
            name = name[:-len(".weight")]
        weights[name] = a.T.copy() if name.endswith(CONV1D) else a
    if "wte" in weights:  # picotrain's padded vocabulary rows are zero
        wte = weights["wte"]
        weights["wte"] = np.concatenate([wte, np.zeros((model["padded_vocab"] - wte.shape[0], wte.shape[1]),
                                                       dtype=np.float32)])
    expected = gpt2_shapes(model)
    bad = sorted(set(expected) ^ set(weights)) + [n for n in expected if n in weights and weights[n].shape != expected[n]]
    if bad:
        raise BadInput("%s: tensors missing, unexpected or of the wrong shape: %s" % (path, ", ".join(bad)))
    return config, weights


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


# ---- GPT-2 ------------------------------------------------------------------------------------------


def round_bf16(a):
    """fp32 -> bf16 -> fp32 with round-to-nearest-even, as picotrain's bf16 backend rounds."""
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def forward(w, model, tokens):
    """Logits [B, T, padded_vocab] of GPT-2 with weights w (name -> tensor) on token ids [B, T]."""
    B, T = tokens.shape
    C, NH, L = model["d_model"], model["n_heads"], model["n_layers"]
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


def reference(weights, model, tokens, targets, device):
    """Logits [B*T, padded_vocab], loss and {name: gradient}, all float64 numpy."""
    w = {name: torch.tensor(a, dtype=torch.float64, device=device).requires_grad_(True) for name, a in weights.items()}
    B, T = tokens.shape
    tok = torch.tensor(tokens, dtype=torch.long, device=device)
    tgt = torch.tensor(targets, dtype=torch.long, device=device).view(B * T)
    logits = forward(w, model, tok).view(B * T, -1)
    loss = F.cross_entropy(logits[:, :model["vocab_size"]], tgt, ignore_index=-1, reduction="sum") / (B * T)
    loss.backward()
    grads = {name: t.grad.detach().cpu().numpy() for name, t in w.items()}
    return logits.detach().cpu().numpy(), float(loss.item()), grads


# ---- the comparison ---------------------------------------------------------------------------------


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
    ref_logits, ref_loss, ref_grads = ref
    loss_err = abs(meta["loss"] - ref_loss) / abs(ref_loss)
    grad_rows = [("grad " + name, errors(grads[name], ref_grads[name])) for name in ref_grads]
    rows = [("logits", errors(logits, ref_logits)),
            ("loss %.6f vs %.6f" % (meta["loss"], ref_loss), (loss_err, loss_err))]
    worst = max(grad_rows, key=lambda r: r[1][0])
    rows += grad_rows if verbose else [(worst[0] + " (worst)", worst[1])]
    rows.append(("grad (all)", errors(np.concatenate([g.reshape(-1) for g in grads.values()]),
                                      np.concatenate([g.reshape(-1) for g in ref_grads.values()]))))
    for name, (rel, peak) in rows:
        print("%-10s %-40s %10.3e %10.3e %8.0e  %s" % (meta["tag"], name[:40], rel, peak, tol,
                                                       "ok" if rel <= tol else "FAIL"))
    checked = [rows[0], ("loss", rows[1][1])] + grad_rows + [rows[-1]]
    return [name for name, (rel, _) in checked if not rel <= tol]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 all within bounds, 1 some not, 2 bad input")
    ap.add_argument("--checkpoint", required=True, help="a checkpoint directory (its latest) or a step_N directory")
    ap.add_argument("dumps", nargs="+", metavar="DUMP", help="folders written by reference_dump from that checkpoint")
    ap.add_argument("--tol-fp32", type=float, default=1e-5, help="bound for fp32 backends (default 1e-5)")
    ap.add_argument("--tol-bf16", type=float, default=2e-2, help="bound for the bf16 backend (default 2e-2)")
    ap.add_argument("--verbose", action="store_true", help="print every parameter, not only the worst")
    ap.add_argument("--hf", action="append", default=[], metavar="DIR",
                    help="a Hugging Face folder exported from the checkpoint (picotrain convert --format hf); "
                         "repeatable")
    args = ap.parse_args()

    try:
        step_dir, manifest, weights = read_checkpoint(args.checkpoint)
        shapes = {name: a.shape for name, a in weights.items()}
        dumps = [read_dump(d, manifest, shapes) for d in args.dumps]
        folders = [(d,) + read_hf_folder(d, manifest["model"]) for d in args.hf]
    except BadInput as e:
        print("torch_reference: %s" % e, file=sys.stderr)
        return 2

    model = manifest["model"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch_reference: %s (step %d): GPT-2 %d layers, d_model %d, %d heads, vocab %d (padded %d); "
          "float64 on %s, torch %s" % (step_dir, manifest["step"], model["n_layers"], model["d_model"],
                                       model["n_heads"], model["vocab_size"], model["padded_vocab"], device,
                                       torch.__version__))
    print("%-10s %-40s %10s %10s %8s  %s" % ("backend", "quantity", "rel L2", "max rel", "bound", "ok"))
    failed = []
    refs = {}  # the reference of each (weights rounding, batch) computed once
    for path, dump in zip(args.dumps, dumps):
        meta, tokens, targets = dump[0], dump[1], dump[2]
        bf16 = meta["compute_dtype"] == "bf16"
        key = (bf16, tokens.tobytes(), targets.tobytes())
        if key not in refs:
            w = {name: round_bf16(a) if bf16 else a for name, a in weights.items()}
            refs[key] = reference(w, model, tokens, targets, device)
        bad = compare(dump, refs[key], args.tol_bf16 if bf16 else args.tol_fp32, args.verbose)
        if bad:
            failed.append(path)
            print("%-10s over the bound: %s" % (meta["tag"], ", ".join(bad)))
    for path, config, hf_weights in folders:
        bad = compare_hf(path, config, hf_weights, weights, model, dumps[0], args.tol_fp32)
        if bad:
            failed.append(path)
            print("%-10s %s over the bound: %s" % ("hf", path, ", ".join(bad)))
    print("torch_reference: %s" % ("FAIL: " + ", ".join(failed) if failed else "all within bounds"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
