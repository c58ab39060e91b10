#!/usr/bin/env python3
"""An independent GPT-2, Llama and Mixtral in PyTorch, to check picotrain's logits, loss and gradients.

picotrain's side is a checkpoint (the checkpoints/ directory of a `picotrain train` run, or one
step_N directory in it) and what reference_dump (a tool built with the tests) computes from it
on a backend for one batch: the batch, the logits of an eval pass, the loss and every
parameter's gradient of one training pass (see test/reference_dump.cpp for the files):

    build/test/reference_dump --checkpoint RUN/checkpoints --out dump/cpu --device cpu
    build/test/reference_dump --checkpoint RUN/checkpoints --out dump/cuda_bf16 --device cuda --dtype bf16
    python3 scripts/torch_reference.py --checkpoint RUN/checkpoints dump/cpu dump/cuda_bf16

This script reads the checkpoint itself (manifest.json and the chunk files it names, checking
every master tensor's shape against its model.arch's: gpt2 or llama), rebuilds the model in
float64 (on the GPU when PyTorch sees one), runs each dump's batch and compares, per dump:
  fp32 (cpu, cuda)  relative L2 <= --tol-fp32 (1e-5)
  bf16 (cuda)       relative L2 <= --tol-bf16 (2e-2)
for the logits, the loss (relative difference) and every parameter's gradient, with
loss = (sum of per-token cross-entropies over the first vocab_size logits) / (B*T), positions
whose target is -1 ignored. A model with experts also compares its balancing loss (relative
difference), and its gradients are those of picotrain's objective, loss + moe.aux_loss_coef *
the balancing loss (see the Mixtral below). The bf16 backend computes with bf16-rounded weights, so its
reference does too: the comparison measures activation rounding, not the rounding of the
weights.

Why 1e-5 for fp32: the CPU backend's worst error on the tiny GPT-2 of the ctest (2 heads of 64,
one sequence of 147 tokens) is 1.5e-6 (fp32 keeps ~7 digits; the CUDA backend's fp32 matmuls never
use TF32), while the nearest wrong definition, GELU with erf instead of tanh, is 3.2e-5 on the
logits and up to 9.0e-5 on a gradient of that near-initial checkpoint (2.9e-4 after 30 steps):
1e-4 would let it through.
The same bound holds for Llama: on the ctest's tiny Llama (GQA, eps 1e-6, theta 500000) the CPU
backend's worst error is 1.9e-6 (a norm weight's gradient), while the nearest wrong definitions
are orders above it: eps 1e-5 for 1e-6 (1.1e-2 on the logits), no eps (1.2e-3), theta 1e4 for
5e5 (4.1e-3), even/odd RoPE pairs for rotate-half (5.6e-3), K/V heads taken h % n_kv_heads
(0.65), GELU for SiLU (1.9e-2); float64 RoPE angles for float32 ones do not show at 47 positions.
The bound holds with experts too: on the ctest's tiny Mixtral (4 experts of 96, top 2, every block
sparse, balancing loss weighted 0.02) the CPU backend's worst error is 1.4e-6 (a norm weight's
gradient; the routers' 7.7e-7), while the nearest wrong definitions are far above it, mostly on
the routers' gradients, which the balancing loss dominates near initialisation: Hugging Face's
one balancing loss over every block's tokens at once for the mean of each block's (0.56), the
chosen experts' renormalised weights for P_i (0.58), f_i from each token's first choice only
(0.65), f_i divided by top_k (0.79), no balancing loss (1.9), weights not renormalised over the
chosen experts (4.9e-2 on the logits).
Why 2e-2 for bf16: it keeps ~3 digits (2^-9 = 2e-3 per rounding), and picotrain's own GPU
against CPU model test uses the same bound.

The model is written here from GPT-2's definition (not copied from any implementation):
token + learned position embeddings, pre-LayerNorm blocks (eps 1e-5) with causal multi-head
attention (scale 1/sqrt(head_dim)) and a 4x MLP with tanh-approximate GELU, a final LayerNorm
and an LM head tied to the token embedding over the padded vocabulary (the loss uses the first
vocab_size columns). Weights are [out, in]: y = x @ W^T + b. Parameter names follow Hugging Face
GPT-2 (wte, wpe, h.L.ln_1.weight, ..., ln_f.bias), as picotrain's checkpoints name them.

The Llama is written from Hugging Face's LlamaForCausalLM conventions (not copied from any
implementation): the token embedding; per block RMSNorm x * rsqrt(mean(x^2) + eps) * w, q/k/v
projections, RoPE on q and k with inv_freq = 1/theta^(arange(0, hd, 2)/hd) and the angles
pos * inv_freq in float32 as Hugging Face computes them, rotate_half(x) = cat(-x2, x1) (dimension
i pairs with i + hd/2), grouped-query attention where query head h reads key/value head
h // (n_heads / n_kv_heads), causal softmax scaled by 1/sqrt(hd), o_proj and the residual, then
RMSNorm and down(silu(gate(x)) * up(x)) and the residual; a final RMSNorm and lm_head (the token
embedding when tied). No biases. Its names are Hugging Face's (model.embed_tokens.weight,
model.layers.L.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight), as picotrain's
checkpoints name them, and eps, theta, n_kv_heads, the MLP width and the head's tying come from
the manifest's model.

A Llama with experts (the manifest's model has "moe") is Hugging Face's Mixtral, written from its
definitions (not copied from any implementation): block l is sparse when (l + 1) % moe.every
== 0 (every block for a Mixtral), and its MLP is block_sparse_moe: router logits = x @ gate^T,
probabilities = their softmax over all n_experts, each token's top_k most probable experts (a
tie to the lower index), their probabilities renormalised to sum to 1 as the weights, output =
sum_j weight_j * w2(silu(w1 x) * w3 x) over the chosen experts, plus, when moe.n_shared_experts
> 0, a SwiGLU of the shared experts (mlp.shared_experts.*_proj) on the same input. Each sparse
block's balancing loss (Switch Transformer's, as Mixtral's) is aux = n_experts * sum_i f_i P_i
over the batch's B*T tokens: f_i the share of tokens having expert i among their choices (a
count, through which no gradient flows), P_i the mean probability of expert i. The objective is
loss + moe.aux_loss_coef * (the mean of aux over the sparse blocks), moe.aux_loss_coef taken from
the manifest's config. picotrain's float32 and this float64 could route a token otherwise only
when its k-th and (k+1)-th probabilities nearly tie; the smallest such gap is printed. A dump
records the experts its backend chose (routing.i32): bf16 router logits break such near-ties
otherwise than float64, and a token sent to another expert changes that expert's gradient
wholesale, so the reference routes each token as the dump did, and the choices themselves are
checked: the float64 probability of a dump's least probable chosen expert may fall short of
float64's own k-th choice by at most the backend's bound ("routing" row: how many tokens chose
otherwise, and the largest shortfall).

--self-test checks the Llama and the Mixtral against a loop that computes each position, head,
rotated pair and routed expert one scalar at a time (and the balancing loss from counts), and
their autograd gradients (the router's and an expert's too) against central differences.

Hugging Face folders (`picotrain convert --format hf`; --hf DIR, repeatable) are read with this
script's own safetensors reader: an 8-byte little-endian header length, a JSON header giving
each tensor's dtype, shape and data_offsets (counted from the end of the header), then the raw
little-endian data. config.json must describe the checkpoint's model: GPT2LMHeadModel (n_embd,
n_layer, n_head, n_positions, vocab_size, tanh GELU, LayerNorm eps 1e-5, tied head), or
LlamaForCausalLM (hidden_size, intermediate_size, the layers, heads and key/value heads,
head_dim, max_position_embeddings, vocab_size, silu, rms_norm_eps, rope_theta, no rope_scaling,
no biases, tie_word_embeddings), or for a model with experts MixtralForCausalLM (those keys but
the biases', intermediate_size the width of one expert, num_local_experts, num_experts_per_tok,
router_aux_loss_coef, no sliding window); a Mixtral's tensors are named as its checkpoints on the
hub (block_sparse_moe.gate, block_sparse_moe.experts.E.w1/w3/w2), as picotrain's. A Llama's (and
a Mixtral's) tensors keep their names, none is transposed, and embed_tokens' and lm_head's rows
past vocab_size are zero-padded. GPT-2's tensors go into this
GPT-2 by Hugging Face's names ("transformer." + picotrain's name, wte and
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


def sparse_block(model, layer):
    """Whether block `layer` of a Llama is sparse (mixture of experts): the model has experts and
    (layer + 1) % moe.every == 0, as picotrain's moe section defines it."""
    moe = model.get("moe")
    return moe is not None and (layer + 1) % moe["every"] == 0


def llama_shapes(model):
    """Every Llama parameter's name (Hugging Face's LlamaForCausalLM state dict, as picotrain's
    checkpoints name them) and shape ([out, in] like nn.Linear), in picotrain's table order (the
    order of its gradients). A sparse block's MLP is named as Hugging Face's Mixtral's
    (block_sparse_moe: the router gate [E, C], each expert's w1 and w3 [H, C], then each w2
    [C, H]), its shared experts, if any, as DeepSeek's (mlp.shared_experts.*_proj, width
    n_shared_experts * H), before them."""
    C, L, V = model["d_model"], model["n_layers"], model["padded_vocab"]
    hd = C // model["n_heads"]
    Q, KV = model["n_heads"] * hd, model["n_kv_heads"] * hd
    shapes = {"model.embed_tokens.weight": (V, C)}
    for layer in range(L):
        h = "model.layers.%d." % layer
        for name, shape in (("input_layernorm.weight", (C,)),
                            ("self_attn.q_proj.weight", (Q, C)), ("self_attn.k_proj.weight", (KV, C)),
                            ("self_attn.v_proj.weight", (KV, C)), ("self_attn.o_proj.weight", (C, Q)),
                            ("post_attention_layernorm.weight", (C,))):
            shapes[h + name] = shape
        if not sparse_block(model, layer):
            F = model["ffn_hidden"]
            shapes.update({h + "mlp.gate_proj.weight": (F, C), h + "mlp.up_proj.weight": (F, C),
                           h + "mlp.down_proj.weight": (C, F)})
            continue
        moe = model["moe"]
        E, H, S = moe["n_experts"], moe["expert_hidden"], moe["n_shared_experts"] * moe["expert_hidden"]
        if S:
            x = h + "mlp.shared_experts."
            shapes.update({x + "gate_proj.weight": (S, C), x + "up_proj.weight": (S, C),
                           x + "down_proj.weight": (C, S)})
        x = h + "block_sparse_moe."
        shapes[x + "gate.weight"] = (E, C)
        for e in range(E):
            shapes[x + "experts.%d.w1.weight" % e] = (H, C)
            shapes[x + "experts.%d.w3.weight" % e] = (H, C)
        for e in range(E):
            shapes[x + "experts.%d.w2.weight" % e] = (C, H)
    shapes["model.norm.weight"] = (C,)
    if not model["tie_embeddings"]:
        shapes["lm_head.weight"] = (V, C)
    return shapes


ARCHITECTURES = ("gpt2", "llama")


def model_shapes(model):
    return llama_shapes(model) if model["arch"] == "llama" else gpt2_shapes(model)


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
    """(config, {picotrain name: float32 array}) of the folder, checked to hold `model`."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput("cannot read %s/config.json: %s" % (path, e))
    read = read_llama_folder if model["arch"] == "llama" else read_gpt2_folder
    return config, read(path, config, model)


def pad_vocab_rows(a, model):
    """picotrain's padded vocabulary rows (zero) under a Hugging Face [vocab_size, C] tensor."""
    return np.concatenate([a, np.zeros((model["padded_vocab"] - a.shape[0], a.shape[1]), dtype=np.float32)])


def check_folder_tensors(path, weights, model):
    expected = model_shapes(model)
    bad = sorted(set(expected) ^ set(weights)) + [n for n in expected if n in weights and weights[n].shape != expected[n]]
    if bad:
        raise BadInput("%s: tensors missing, unexpected or of the wrong shape: %s" % (path, ", ".join(bad)))


def read_llama_folder(path, config, model):
    """A LlamaForCausalLM folder, or for a Llama with experts a MixtralForCausalLM folder: its
    tensor names are picotrain's; nn.Linear weights are [out, in] as picotrain's (none is
    transposed); the embedding's and the head's rows stop at vocab_size. Mixtral's config has
    its experts' keys and intermediate_size is one expert's width; every block is sparse, with no
    shared experts."""
    hd = model["d_model"] // model["n_heads"]
    want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": model["d_model"],
            "num_hidden_layers": model["n_layers"], "num_attention_heads": model["n_heads"],
            "num_key_value_heads": model["n_kv_heads"], "head_dim": hd, "intermediate_size": model.get("ffn_hidden"),
            "max_position_embeddings": model["max_seq_len"], "vocab_size": model["vocab_size"],
            "hidden_act": "silu", "rms_norm_eps": model["norm_eps"], "rope_theta": model["rope_theta"],
            "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
            "tie_word_embeddings": model["tie_embeddings"]}
    kind = "Llama"
    if "moe" in model:
        moe, kind = model["moe"], "Mixtral"
        if moe["every"] != 1 or moe["n_shared_experts"] != 0:
            raise BadInput("%s: the checkpoint's moe %s has no Mixtral form" % (path, json.dumps(moe)))
        for llama_only in ("attention_bias", "mlp_bias", "pretraining_tp"):
            del want[llama_only]
        want.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                     "intermediate_size": moe["expert_hidden"], "num_local_experts": moe["n_experts"],
                     "num_experts_per_tok": moe["top_k"], "router_aux_loss_coef": moe["aux_loss_coef"],
                     "output_router_logits": False, "router_jitter_noise": 0.0, "sliding_window": None})
    wrong = ["%s=%r (want %r)" % (k, config.get(k), v) for k, v in want.items() if config.get(k) != v]
    if wrong:
        raise BadInput("%s/config.json does not describe the checkpoint's %s: %s" % (path, kind, ", ".join(wrong)))
    weights = read_safetensors(os.path.join(path, "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in weights:
            weights[name] = pad_vocab_rows(weights[name], model)
    check_folder_tensors(path, weights, model)
    return weights


def read_gpt2_folder(path, config, model):
    """A GPT2LMHeadModel folder: "transformer." + picotrain's names, Conv1D weights [in, out]."""
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
    if "wte" in weights:
        weights["wte"] = pad_vocab_rows(weights["wte"], model)
    check_folder_tensors(path, weights, model)
    return weights


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


def forward(w, model, tokens, routed=None, routing=None):
    """Logits [B, T, padded_vocab] of the checkpoint's architecture with weights w (name -> tensor);
    a Llama's sparse blocks append their balancing losses to `routed` and route as `routing` says
    when given (llama_forward)."""
    if model["arch"] == "llama":
        return llama_forward(w, model, tokens, routed, routing)
    return gpt2_forward(w, model, tokens)


def gpt2_forward(w, model, tokens):
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


# ---- Llama -----------------------------------------------------------------------------------------


def rope_angles(T, hd, theta, device):
    """[T, hd/2] angles pos * inv_freq as Hugging Face's Llama computes them: inv_freq =
    1 / theta^(2i/hd) and the product in float32 (the angles' rounding is part of the model at
    long positions); their cos and sin are then taken in float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.arange(T, dtype=torch.int64).float()
    return (pos[:, None] * inv_freq[None, :]).to(torch.float64).to(device)


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension: dimension i of a head
    pairs with i + hd/2 (not 2i with 2i+1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def sparse_moe(x, w, prefix, moe, routed, forced=None):
    """Hugging Face Mixtral's block_sparse_moe on the rows x [N, C]: router logits x @ gate^T, the
    probabilities their softmax over all E experts, each row's top_k most probable experts (a tie
    goes to the lower index: a stable descending sort), their probabilities renormalised to sum to
    1 as their weights, and the output sum_j weight_j * w2(silu(w1 x) * w3 x) over the chosen
    experts. Appends to `routed` (aux, margin, differing, shortfall, chosen): the balancing loss
    E * sum_i f_i P_i, with f_i the share of rows having expert i among their choices (a count: no
    gradient flows through it) and P_i the mean probability of expert i; and the smallest gap
    between a row's k-th and (k+1)-th probability (a routing that float32 could decide otherwise
    shows there). `forced` [N, k]: the
    experts to use instead of the top_k (a dump's choices), whose weights are then their
    probabilities renormalised; the appended entry also says how many rows it routes otherwise
    and the largest shortfall of a forced expert's probability below the row's k-th."""
    E, k = moe["n_experts"], moe["top_k"]
    probs = (x @ w[prefix + "gate.weight"].T).softmax(dim=-1)
    ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    chosen, weights = order[:, :k], ranked[:, :k]
    differing, shortfall = 0, 0.0
    if forced is not None:
        forced = torch.as_tensor(forced, dtype=torch.long, device=x.device)
        own = F.one_hot(chosen, E).sum(dim=1)
        differing = int((F.one_hot(forced, E).sum(dim=1) != own).any(dim=1).sum())
        chosen, weights = forced, probs.gather(1, forced)
        shortfall = float((ranked[:, k - 1] - weights.min(dim=1).values).max().clamp(min=0).detach())
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(E):
        rows, j = (chosen == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe, expert = x[rows], prefix + "experts.%d." % e
        ye = (F.silu(xe @ w[expert + "w1.weight"].T) * (xe @ w[expert + "w3.weight"].T)) @ w[expert + "w2.weight"].T
        out = out.index_add(0, rows, ye * weights[rows, j].unsqueeze(-1))
    f = F.one_hot(chosen, E).sum(dim=(0, 1)).to(probs.dtype) / x.shape[0]
    aux = E * (f * probs.mean(dim=0)).sum()
    margin = float((ranked[:, k - 1] - ranked[:, k]).min().detach()) if k < E else math.inf
    routed.append((aux, margin, differing, shortfall, chosen))
    return out


def llama_forward(w, model, tokens, routed=None, routing=None):
    """Logits [B, T, padded_vocab] of Hugging Face's LlamaForCausalLM with weights w on ids [B, T]:
    RMSNorm x * rsqrt(mean(x^2) + eps) * weight; RoPE (rotate-half) on q and k; grouped-query
    attention (query head h reads key/value head h // (n_heads / n_kv_heads)), causal, scaled by
    1/sqrt(head_dim); SwiGLU down(silu(gate(x)) * up(x)); no biases; the head lm_head, or the
    token embedding when tied. A sparse block's MLP is Mixtral's (sparse_moe) plus its shared
    experts' SwiGLU, if any; each sparse block appends its (aux, margin, rows routed otherwise,
    shortfall, the chosen experts [B*T, top_k]) to `routed`, routing as routing[s] (the s-th sparse
    block's [B*T, top_k]) when given."""
    B, T = tokens.shape
    C, NH, L = model["d_model"], model["n_heads"], model["n_layers"]
    NKV, eps = model["n_kv_heads"], model["norm_eps"]
    HD = C // NH
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    angles = torch.cat([rope_angles(T, HD, model["rope_theta"], tokens.device)] * 2, dim=-1)  # [T, HD]
    cos, sin = angles.cos().to(w["model.norm.weight"].dtype), angles.sin().to(w["model.norm.weight"].dtype)
    routed = [] if routed is None else routed

    def rms_norm(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

    def linear(x, name):
        return x @ w[name].T

    def swiglu(x, prefix):
        return linear(F.silu(linear(x, prefix + "gate_proj.weight")) * linear(x, prefix + "up_proj.weight"),
                      prefix + "down_proj.weight")

    def heads(x, n):
        return x.view(B, T, n, HD).transpose(1, 2)  # [B, n, T, HD]

    def rope(x):
        return x * cos + rotate_half(x) * sin

    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        h = "model.layers.%d." % layer
        a = rms_norm(x, h + "input_layernorm.weight")
        q = rope(heads(linear(a, h + "self_attn.q_proj.weight"), NH))
        k = rope(heads(linear(a, h + "self_attn.k_proj.weight"), NKV))
        v = heads(linear(a, h + "self_attn.v_proj.weight"), NKV)
        k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + linear(y, h + "self_attn.o_proj.weight")
        m = rms_norm(x, h + "post_attention_layernorm.weight")
        if not sparse_block(model, layer):
            x = x + swiglu(m, h + "mlp.")
            continue
        moe = model["moe"]
        forced = None if routing is None else routing[len(routed)]
        y = sparse_moe(m.reshape(B * T, C), w, h + "block_sparse_moe.", moe, routed, forced).view(B, T, C)
        if moe["n_shared_experts"]:
            y = y + swiglu(m, h + "mlp.shared_experts.")
        x = x + y
    x = rms_norm(x, "model.norm.weight")
    return x @ (w["model.embed_tokens.weight"] if model["tie_embeddings"] else w["lm_head.weight"]).T


def objective(w, model, tokens, targets, routing=None):
    """What picotrain's training pass computes on ids and targets [B, T] (torch): (logits [B*T, Vp],
    the loss, the balancing loss, the routing margin, the objective). The loss (picotrain's
    logged one) is (sum of per-token cross-entropies over the first vocab_size logits) / (B*T),
    targets of -1 ignored; a model with experts adds moe.aux_loss_coef times the mean of its
    sparse blocks' balancing losses (over every row of the batch) to it to make the objective,
    whose gradient picotrain's backward computes. Without experts the balancing loss and the
    margin are None and the objective is the loss. With experts, the margin is (the smallest gap,
    rows routed otherwise than float64 would, the largest shortfall: sparse_moe) and `routing`
    (a dump's choices [sparse blocks, B*T, top_k]) routes the tokens when given."""
    B, T = tokens.shape
    routed = []
    logits = forward(w, model, tokens, routed, routing).view(B * T, -1)
    loss = F.cross_entropy(logits[:, :model["vocab_size"]], targets.view(B * T), ignore_index=-1,
                           reduction="sum") / (B * T)
    if not routed:
        return logits, loss, None, None, loss
    aux = torch.stack([r[0] for r in routed]).mean()
    margin = (min(r[1] for r in routed), sum(r[2] for r in routed), max(r[3] for r in routed))
    return logits, loss, aux, margin, loss + model["moe"]["aux_loss_coef"] * aux


def reference(weights, model, tokens, targets, device, routing=None):
    """(logits [B*T, padded_vocab], loss, {name: gradient of the objective}, balancing loss,
    routing margin): arrays float64 numpy, the last two None without experts; routed as
    `routing` says when given (objective)."""
    w = {name: torch.tensor(a, dtype=torch.float64, device=device).requires_grad_(True) for name, a in weights.items()}
    tok = torch.tensor(tokens, dtype=torch.long, device=device)
    tgt = torch.tensor(targets, dtype=torch.long, device=device)
    logits, loss, aux, margin, total = objective(w, model, tok, tgt, routing)
    total.backward()
    # An expert no token chose takes no part in the graph: its gradient is zero.
    grads = {name: (t.grad if t.grad is not None else torch.zeros_like(t)).detach().cpu().numpy()
             for name, t in w.items()}
    return (logits.detach().cpu().numpy(), float(loss.item()), grads,
            None if aux is None else float(aux.item()), margin)


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


# ---- the self-test ---------------------------------------------------------------------------------


def naive_llama_logits(w, model, tokens):
    """Llama's logits one scalar at a time (numpy float64), written from the definitions without
    this script's tensor code: each position, head and dimension pair in a loop. It checks
    llama_forward's reshapes, the rotate-half pairing and the query -> key/value head map; with
    experts, each token's routing by repeated arg-max (a tie to the lower index), its weighted
    experts, and each sparse block's balancing loss from counts and sums over the batch. Returns
    (logits [B, T, padded_vocab], [balancing loss of each sparse block])."""
    C, NH, NKV, L = model["d_model"], model["n_heads"], model["n_kv_heads"], model["n_layers"]
    HD, eps, theta = C // NH, model["norm_eps"], model["rope_theta"]
    half, group = HD // 2, NH // NKV
    W = {n: np.asarray(a, dtype=np.float64) for n, a in w.items()}
    moe = model.get("moe")
    balance = {}  # sparse block -> (choices per expert, probability sums, tokens)

    def rms_norm(v, name):
        return v / math.sqrt(sum(e * e for e in v) / len(v) + eps) * W[name]

    def rotate(v, pos):  # dimension i pairs with i + HD/2
        out = np.empty(HD)
        for i in range(half):
            a = pos * theta ** (-2.0 * i / HD)
            out[i] = v[i] * math.cos(a) - v[i + half] * math.sin(a)
            out[i + half] = v[i + half] * math.cos(a) + v[i] * math.sin(a)
        return out

    def swiglu(v, gate, up, down):
        g = W[gate] @ v
        return W[down] @ (g / (1 + np.exp(-g)) * (W[up] @ v))

    def sparse(v, layer):
        prefix = "model.layers.%d.block_sparse_moe." % layer
        logits = W[prefix + "gate.weight"] @ v
        p = np.exp(logits - max(logits))
        p /= p.sum()
        chosen = []
        for _ in range(moe["top_k"]):
            best = None
            for e in range(moe["n_experts"]):
                if e not in chosen and (best is None or p[e] > p[best]):
                    best = e
            chosen.append(best)
        counts, sums, n = balance.get(layer, (np.zeros(moe["n_experts"]), np.zeros(moe["n_experts"]), 0))
        for e in chosen:
            counts[e] += 1
        balance[layer] = (counts, sums + p, n + 1)
        out = np.zeros(C)
        for e in chosen:
            x = prefix + "experts.%d." % e
            out += p[e] / sum(p[c] for c in chosen) * swiglu(v, x + "w1.weight", x + "w3.weight", x + "w2.weight")
        return out

    B, T = tokens.shape
    logits = np.empty((B, T, model["padded_vocab"]))
    for b in range(B):
        x = [W["model.embed_tokens.weight"][tokens[b, t]].copy() for t in range(T)]
        for layer in range(L):
            h = "model.layers.%d." % layer
            a = [rms_norm(x[t], h + "input_layernorm.weight") for t in range(T)]
            q = [W[h + "self_attn.q_proj.weight"] @ a[t] for t in range(T)]
            k = [W[h + "self_attn.k_proj.weight"] @ a[t] for t in range(T)]
            v = [W[h + "self_attn.v_proj.weight"] @ a[t] for t in range(T)]
            for t in range(T):
                y = np.empty(NH * HD)
                for head in range(NH):
                    kv = head // group
                    qh = rotate(q[t][head * HD:(head + 1) * HD], t)
                    s = [qh @ rotate(k[u][kv * HD:(kv + 1) * HD], u) / math.sqrt(HD) for u in range(t + 1)]
                    p = np.exp(np.array(s) - max(s))
                    p /= p.sum()
                    y[head * HD:(head + 1) * HD] = sum(p[u] * v[u][kv * HD:(kv + 1) * HD] for u in range(t + 1))
                x[t] = x[t] + W[h + "self_attn.o_proj.weight"] @ y
            for t in range(T):
                m = rms_norm(x[t], h + "post_attention_layernorm.weight")
                if not sparse_block(model, layer):
                    x[t] = x[t] + swiglu(m, h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight",
                                         h + "mlp.down_proj.weight")
                    continue
                x[t] = x[t] + sparse(m, layer)
                if moe["n_shared_experts"]:
                    s = h + "mlp.shared_experts."
                    x[t] = x[t] + swiglu(m, s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight")
        head_w = W["model.embed_tokens.weight"] if model["tie_embeddings"] else W["lm_head.weight"]
        for t in range(T):
            logits[b, t] = head_w @ rms_norm(x[t], "model.norm.weight")
    aux = [moe["n_experts"] * sum(counts / n * sums / n) for counts, sums, n in (balance[l] for l in sorted(balance))]
    return logits, aux


def self_test():
    """llama_forward against naive_llama_logits on tiny random models (grouped-query and not,
    tied and untied, with experts in every block and with a dense block then a sparse one with a
    shared expert), and the gradients of the objective against central differences (with
    experts: of the router, whose gradient carries the balancing loss's, and of an expert). The
    loop computes the angles in float64 where llama_forward rounds them to float32 as Hugging
    Face does: at positions < 8 that moves a logit by < 1e-6 of the logits' norm."""
    rng = np.random.default_rng(3)
    failed = []

    def report(label, err, bound=1e-6):
        print("%-10s %-48s %10.3e %8.0e  %s" % ("self-test", label[:48], err, bound, "ok" if err <= bound else "FAIL"))
        if not err <= bound:
            failed.append(label)

    every_block = {"n_experts": 4, "top_k": 2, "expert_hidden": 6, "every": 1, "n_shared_experts": 0,
                   "aux_loss_coef": 0.02}
    second_block = {"n_experts": 3, "top_k": 1, "expert_hidden": 5, "every": 2, "n_shared_experts": 1,
                    "aux_loss_coef": 0.1}
    router = "model.layers.1.block_sparse_moe.gate.weight"
    expert = "model.layers.1.block_sparse_moe.experts.1.w3.weight"
    for nkv, tied, moe in ((2, False, None), (4, True, None), (1, False, None), (2, False, every_block),
                           (1, True, second_block)):
        model = {"arch": "llama", "n_layers": 2, "d_model": 16, "n_heads": 4, "n_kv_heads": nkv, "ffn_hidden": 12,
                 "vocab_size": 11, "padded_vocab": 16, "max_seq_len": 8, "norm_eps": 1e-5, "rope_theta": 10000.0,
                 "tie_embeddings": tied}
        if moe:
            model["moe"] = moe
        weights = {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in llama_shapes(model).items()}
        for n in ("model.embed_tokens.weight", "lm_head.weight"):
            if n in weights:
                weights[n][model["vocab_size"]:] = 0
        tokens = rng.integers(0, model["vocab_size"], (2, 7))
        targets = rng.integers(0, model["vocab_size"], tokens.shape)
        targets[0, 1] = -1
        as64 = lambda: {n: torch.tensor(a, dtype=torch.float64) for n, a in weights.items()}
        with torch.no_grad():
            got, _, aux, margin, _ = objective(as64(), model, torch.tensor(tokens), torch.tensor(targets))
        want, want_aux = naive_llama_logits(weights, model, tokens)
        kind = "Llama n_kv_heads=%d %s head" % (nkv, "tied" if tied else "untied")
        if moe:
            kind = "Mixtral E=%d k=%d every=%d shared=%d" % (moe["n_experts"], moe["top_k"], moe["every"],
                                                            moe["n_shared_experts"])
        report(kind + " vs the loop", errors(got.numpy(), want.reshape(tokens.size, -1))[0])
        if moe:
            report("  balancing loss vs the loop", abs(float(aux) - np.mean(want_aux)) / abs(np.mean(want_aux)))
            print("%-10s   routing margin %.3e (central differences need it >> 1e-6)" % ("self-test", margin[0]))
            # A dump's routing: its own choices give the same logits, one token sent elsewhere is
            # counted, its shortfall measured, and its output changes.
            routed = []
            with torch.no_grad():
                forward(as64(), model, torch.tensor(tokens), routed)
                own = np.stack([r[4].numpy() for r in routed])
                same, _, _, same_margin, _ = objective(as64(), model, torch.tensor(tokens), torch.tensor(targets), own)
                other = own.copy()
                other[0, 3, 0] = next(e for e in range(moe["n_experts"]) if e not in own[0, 3])
                moved, _, _, moved_margin, _ = objective(as64(), model, torch.tensor(tokens), torch.tensor(targets),
                                                         other)
            report("  routed as its own choices: logits unchanged", errors(same.numpy(), got.numpy())[0], 0.0)
            report("  ... and no token counted as routed otherwise", same_margin[1] + same_margin[2], 0.0)
            report("  one token routed otherwise: counted once", abs(moved_margin[1] - 1), 0.0)
            report("  ... its shortfall > 0 and its logits moved",
                   float(not (moved_margin[2] > 0 and errors(moved.numpy(), got.numpy())[0] > 1e-6)), 0.0)
        # The float64 graph's gradient of some weight elements against central differences.
        _, _, grads, _, _ = reference(weights, model, tokens, targets, "cpu")
        checks = [("model.layers.1.self_attn.k_proj.weight", (3, 5))]
        if moe:
            checks += [(router, (1, 2)), (router, (2, 7)), (expert, (4, 9))]
        for name, at in checks:
            h, total = 1e-6, []
            for sign in (1, -1):
                w = as64()
                w[name][at] += sign * h
                with torch.no_grad():
                    total.append(float(objective(w, model, torch.tensor(tokens), torch.tensor(targets))[4]))
            fd = (total[0] - total[1]) / (2 * h)
            report("  grad %s%s vs finite difference" % (name.split(".", 2)[2], list(at)),
                   abs(grads[name][at] - fd) / max(abs(fd), 1e-12))
    print("torch_reference: self-test %s" % ("FAIL: " + ", ".join(failed) if failed else "passed"))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 all within bounds, 1 some not, 2 bad input")
    ap.add_argument("--checkpoint", help="a checkpoint directory (its latest) or a step_N directory")
    ap.add_argument("dumps", nargs="*", metavar="DUMP", help="folders written by reference_dump from that checkpoint")
    ap.add_argument("--tol-fp32", type=float, default=1e-5, help="bound for fp32 backends (default 1e-5)")
    ap.add_argument("--tol-bf16", type=float, default=2e-2, help="bound for the bf16 backend (default 2e-2)")
    ap.add_argument("--verbose", action="store_true", help="print every parameter, not only the worst")
    ap.add_argument("--hf", action="append", default=[], metavar="DIR",
                    help="a Hugging Face folder exported from the checkpoint (picotrain convert --format hf); "
                         "repeatable")
    ap.add_argument("--self-test", action="store_true",
                    help="check this script's Llama and Mixtral against a loop written from the definitions, "
                         "then exit")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.checkpoint or not args.dumps:
        ap.error("--checkpoint and at least one DUMP are required")

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
    if model["arch"] == "llama" and "moe" in model:
        moe = model["moe"]
        kind = "Llama with experts (%d kv heads, %d experts of %d, top %d, every %d, %d shared, aux weight %g, " \
               "eps %g, theta %g, %s head)" % (
                   model["n_kv_heads"], moe["n_experts"], moe["expert_hidden"], moe["top_k"], moe["every"],
                   moe["n_shared_experts"], moe["aux_loss_coef"], model["norm_eps"], model["rope_theta"],
                   "tied" if model["tie_embeddings"] else "untied")
    elif model["arch"] == "llama":
        kind = "Llama (%d kv heads, MLP %d, eps %g, theta %g, %s head)" % (
            model["n_kv_heads"], model["ffn_hidden"], model["norm_eps"], model["rope_theta"],
            "tied" if model["tie_embeddings"] else "untied")
    else:
        kind = "GPT-2"
    print("torch_reference: %s (step %d): %s %d layers, d_model %d, %d heads, vocab %d (padded %d); "
          "float64 on %s, torch %s" % (step_dir, manifest["step"], kind, model["n_layers"], model["d_model"],
                                       model["n_heads"], model["vocab_size"], model["padded_vocab"], device,
                                       torch.__version__))
    print("%-10s %-40s %10s %10s %8s  %s" % ("backend", "quantity", "rel L2", "max rel", "bound", "ok"))
    failed = []
    refs = {}  # the reference of each (weights rounding, batch) computed once
    for path, dump in zip(args.dumps, dumps):
        meta, tokens, targets = dump[0], dump[1], dump[2]
        bf16 = meta["compute_dtype"] == "bf16"
        routing = meta["routing_choices"]
        key = (bf16, tokens.tobytes(), targets.tobytes(), None if routing is None else routing.tobytes())
        if key not in refs:
            w = {name: round_bf16(a) if bf16 else a for name, a in weights.items()}
            refs[key] = reference(w, model, tokens, targets, device, routing)
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
