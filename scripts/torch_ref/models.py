"""The models, written from their definitions (see scripts/torch_reference.py's docstring): GPT-2,
and Hugging Face's Llama with, where the model has experts, Mixtral's sparse blocks (RoPE,
grouped-query attention, the router, the balancing loss, a dump's routing followed and checked).
Each returns the logits of token ids for weights given by name; forward picks the architecture.
"""
import math

import torch
import torch.nn.functional as F

from .shapes import sparse_block


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
