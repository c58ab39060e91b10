"""--self-test: the Llama and the Mixtral (models) against a loop that computes each position, head,
rotated pair and routed expert one scalar at a time (and the balancing loss from counts), a
dump's routing followed and counted, and autograd's gradients (the router's and an expert's too)
against central differences.
"""
import math

import numpy as np
import torch

from .compare import errors
from .models import forward
from .objective import objective, reference
from .shapes import llama_shapes, sparse_block


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
