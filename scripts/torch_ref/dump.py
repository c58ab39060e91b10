"""The reader of a reference_dump folder (dump.json, the batch, the logits, the gradients and, with
experts, the routing), checked to come from the checkpoint being compared against (the master
weights' chunk checksums).
"""
import json
import os

import numpy as np

from . import BadInput


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
    if "moe" in manifest["model"] and not isinstance(meta.get("aux_loss"), (int, float)):
        raise BadInput("%s: the model has experts, but dump.json has no aux_loss" % path)
    meta["routing_choices"] = None
    if "routing" in meta:
        try:
            shape = tuple(meta["routing"]["shape"])
            choices = np.fromfile(os.path.join(path, meta["routing"]["file"]), dtype="<i4")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BadInput("cannot read the routing in %s: %s" % (path, e))
        moe = manifest["model"]["moe"]
        if len(shape) != 3 or shape[1:] != (N, moe["top_k"]) or choices.size != int(np.prod(shape)) or \
                choices.size and (choices.min() < 0 or choices.max() >= moe["n_experts"]):
            raise BadInput("%s: routing is not [sparse blocks, %d, %d] expert ids" % (path, N, moe["top_k"]))
        meta["routing_choices"] = choices.reshape(shape)
    meta["tag"] = "%s %s" % (meta["device"], meta["compute_dtype"])
    return meta, tokens.reshape(B, T), targets.reshape(B, T), logits.reshape(N, Vp), grads
