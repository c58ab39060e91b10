"""The reader of a Hugging Face folder written by `picotrain convert --format hf`: its own
safetensors reader, config.json checked to describe the checkpoint's model (GPT2LMHeadModel,
LlamaForCausalLM or MixtralForCausalLM), the tensors renamed, transposed and padded back to
picotrain's names and shapes, and its tokenizer files, when it has them, checked (hf_tokenizer.py).
"""
import json
import os
import struct

import numpy as np
import torch

from . import BadInput
from .hf_tokenizer import check_hf_tokenizer
from .shapes import model_shapes


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
    weights = read(path, config, model)
    check_hf_tokenizer(path, config)  # when the folder has one: it fits the model and names its bos/eos
    return config, weights


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
