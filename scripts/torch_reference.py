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

The code is the package beside this file, scripts/torch_ref/: the parameter tables (shapes), the
readers of the checkpoint, the dumps and the Hugging Face folders (checkpoint, dump, hf), the
models (models), the training pass on them (objective), the comparison (compare) and --self-test
(self_test); this file is the command line.

--mc-task FILE --mc-scores SCORES --mc-seq-len T checks `picotrain eval --task FILE --scores
SCORES --set batch.seq_len=T` instead: the task file is read and tokenized here (bytes), every
ending scored in float64 from the checkpoint's weights, and each example's token ids, summed and
mean losses (relative bound --tol-mc, 1e-4) and predictions compared (torch_ref/multiple_choice.py
defines the scoring; ctest torch_mc_reference).

Exit status: 0 every quantity within its bound, 1 something is not, 2 the checkpoint or a dump
is missing or malformed, or a dump was not made from this checkpoint (its master weights' chunk
checksums differ).
"""
import argparse
import sys

import torch

# The package beside this script (scripts/torch_ref/). test/torch_reference.sh imports this module
# and calls read_checkpoint and forward: they stay importable from here.
from torch_ref import BadInput
from torch_ref.checkpoint import read_checkpoint
from torch_ref.compare import compare, compare_hf
from torch_ref.dump import read_dump
from torch_ref.hf import read_hf_folder
from torch_ref.models import forward  # noqa: F401 (test/torch_reference.sh)
from torch_ref.multiple_choice import compare_scores, read_scores, score as score_multiple_choice
from torch_ref.objective import reference, round_bf16
from torch_ref.self_test import self_test


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
    ap.add_argument("--mc-task", metavar="JSONL",
                    help="a multiple-choice task (HellaSwag's JSONL): score it from the checkpoint and compare with "
                         "--mc-scores (see torch_ref/multiple_choice.py); no DUMP needed")
    ap.add_argument("--mc-scores", metavar="JSONL", help="what `picotrain eval --task JSONL --scores` wrote")
    ap.add_argument("--mc-seq-len", type=int, default=0, help="the eval's batch.seq_len (row length)")
    ap.add_argument("--mc-max-examples", type=int, default=0, help="the eval's --max-examples (0: all)")
    ap.add_argument("--tol-mc", type=float, default=1e-4, help="relative bound on the endings' losses (1e-4)")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.mc_task:
        return check_multiple_choice(args)
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


def check_multiple_choice(args):
    """--mc-task: the task scored here in float64 against picotrain's scores (exit 0, 1 or 2)."""
    if not args.checkpoint or not args.mc_scores or args.mc_seq_len < 2:
        print("torch_reference: --mc-task needs --checkpoint, --mc-scores and --mc-seq-len", file=sys.stderr)
        return 2
    try:
        step_dir, manifest, weights = read_checkpoint(args.checkpoint)
        theirs = read_scores(args.mc_scores)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        mine, skipped = score_multiple_choice(weights, manifest["model"], args.mc_task, args.mc_seq_len,
                                              args.mc_max_examples, device)
    except BadInput as e:
        print("torch_reference: %s" % e, file=sys.stderr)
        return 2
    print("torch_reference: %s (step %d): %s on %s, rows of %d" % (step_dir, manifest["step"],
                                                                  manifest["model"]["arch"], args.mc_task,
                                                                  args.mc_seq_len))
    bad = compare_scores(mine, skipped, theirs, args.tol_mc)
    print("torch_reference: %s" % ("FAIL: multiple choice" if bad else "all within bounds"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
