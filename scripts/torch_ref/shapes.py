"""Every parameter's name and shape for each architecture picotrain's checkpoints hold (gpt2, llama,
and the llama with experts, Mixtral), in the order of picotrain's gradients, and which of a
Llama's blocks are sparse: the tables the readers check a checkpoint, a dump and a Hugging Face
folder against.
"""



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
