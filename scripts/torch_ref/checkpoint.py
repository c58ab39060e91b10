"""The reader of a picotrain checkpoint (a step directory's manifest.json and the chunk files it
names): its master weights as whole float32 arrays, every tensor's shape checked against its
architecture's, every element stored exactly once. Chunk checksums are not recomputed here
(reference_dump's reader verifies them).
"""
import json
import os

import numpy as np

from . import BadInput
from .shapes import ARCHITECTURES, model_shapes


def resolve_checkpoint(path):
    """`path` when it holds manifest.json, else the step directory path/latest names."""
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    raise BadInput("%s is neither a checkpoint (no manifest.json) nor a checkpoint directory (no latest)" % path)


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
    if "moe" in model:
        # The balancing loss's weight is the writer's config's (picotrain keeps it out of the
        # model's shape keys): the script's model carries it with the other moe keys.
        try:
            model["moe"]["aux_loss_coef"] = manifest["config"]["moe"]["aux_loss_coef"]
        except (KeyError, TypeError):
            raise BadInput("%s: a model with experts, but the manifest's config has no moe.aux_loss_coef" % step_dir)
    if model.get("arch") not in ARCHITECTURES:
        raise BadInput("%s holds a %s model, not one of %s" % (step_dir, model.get("arch"), ", ".join(ARCHITECTURES)))
    file_bytes = {}
    for f in manifest["files"]:
        size = os.path.getsize(os.path.join(step_dir, f["name"])) if os.path.exists(os.path.join(step_dir, f["name"])) else -1
        if size != f["bytes"]:
            raise BadInput("%s: %s has %d bytes, the manifest says %d" % (step_dir, f["name"], size, f["bytes"]))
        file_bytes[f["name"]] = size
    entries = {t["name"][len("master/"):]: t for t in manifest["tensors"] if t["name"].startswith("master/")}
    try:
        expected = model_shapes(model)
    except KeyError as e:
        raise BadInput("%s: the manifest's model has no %s" % (step_dir, e))
    if set(entries) != set(expected):
        raise BadInput("%s: master tensors missing %s, unexpected %s" % (
            step_dir, sorted(set(expected) - set(entries)) or "none", sorted(set(entries) - set(expected)) or "none"))
    weights = {}
    for name, shape in expected.items():
        if tuple(entries[name]["shape"]) != shape:
            raise BadInput("%s: master/%s has shape %s, %s with %s has %s" %
                           (step_dir, name, entries[name]["shape"], model["arch"], json.dumps(model), list(shape)))
        weights[name] = read_tensor(step_dir, entries[name], file_bytes)
    return step_dir, manifest, weights
