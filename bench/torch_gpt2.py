#!/usr/bin/env python3
"""PyTorch GPT-2 training throughput: the baseline picotrain is measured against (issue #9).

What it measures: tokens/s, step time and MFU of training a GPT-2 written here in plain
PyTorch the way a PyTorch user would make it fast, on synthetic tokens, with the same shape and
the same FLOPs per token as picotrain's `gpt2` model:
  - token + learned position embeddings, pre-LayerNorm blocks (eps 1e-5), causal attention with
    scale 1/sqrt(head_dim), 4x MLP with tanh-approximate GELU, final LayerNorm, LM head tied to
    the token embedding over the vocabulary padded to a multiple of 128 (50257 -> 50304); the
    loss is the cross-entropy over the first 50257 columns (padded columns are never predicted,
    as in picotrain);
  - precision: fp32 parameters (they are the fp32 master weights) with bf16 autocast for the
    forward and backward on CUDA, the usual PyTorch recipe (nanoGPT, build-nanogpt); fp32 on
    the CPU (smoke tests);
  - attention: F.scaled_dot_product_attention(is_causal=True) restricted to the flash backend
    (--sdpa-backend; torch 2.x), or a manual masked softmax where SDPA does not exist (torch
    1.13) or with --attention manual;
  - torch.compile of the model (--no-compile to disable; skipped where torch has none);
  - AdamW (fused=True on CUDA), weight decay on matrices only, gradient clipping at 1.0 (as
    picotrain's gpt2-124m config), gradient accumulation over --grad-accum micro-batches.
Data: a few micro-batches from --data (an llm.c shard, e.g. bench/synthetic_shards.py's, the one
picotrain trains on) or uniform random ids, made once on the device and reused in turn.
How: --warmup steps first (compilation, autotuning, allocator warm-up; not counted), then
--steps timed steps, each ended by torch.cuda.synchronize(). tokens/s = tokens of the timed
steps / their summed wall time.

MFU uses picotrain's PaLM formula (core/metrics/flops.cpp): FLOPs/token = 6 N + 12 L d T, N =
every parameter except the position embedding (the tied embedding counted once), T the trained
sequence length; the peak is picotrain's table of dense bf16 tensor-core peaks by device name
(989.4 TFLOP/s for H100 SXM and for H200, whose compute is the same GH100; 835.5 H200 NVL, 756 H100 PCIe, 835
H100 NVL), or --peak-tflops.

    python3 bench/torch_gpt2.py --model 124m -B 64 -T 1024 --grad-accum 8 --steps 20 --json out.json
    python3 bench/torch_gpt2.py --model tiny --device cpu --steps 3 --warmup 1     # smoke test

Runs on torch 1.13 (CPU) and 2.x (CUDA). Prints one summary line and writes --json.
"""
import argparse
import inspect
import json
import math
import statistics
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {  # n_layers, d_model, n_heads
    "tiny": (2, 64, 2),
    "124m": (12, 768, 12),
    "350m": (24, 1024, 16),
    "774m": (36, 1280, 20),
    "1.5b": (48, 1600, 25),
}

# picotrain's dense bf16 peaks by device name (core/metrics/flops.cpp, gpu_peak_tflops): the
# first entry whose text is in the name wins, so the order matters ("H100 PCIe" before "H100").
PEAK_TFLOPS = [
    ("GH200", 989.4), ("H200 NVL", 835.5), ("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0),
    ("H100", 989.4),
    ("B200", 2250.0), ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0), ("L4", 121.0),
    ("RTX 4090", 165.2), ("RTX 3090", 71.0),
]


def peak_tflops(device_name):
    for match, tflops in PEAK_TFLOPS:
        if match in device_name:
            return tflops
    return 0.0


class Block(nn.Module):
    def __init__(self, d, n_heads, attention):
        super().__init__()
        self.n_heads = n_heads
        self.attention = attention
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attend(self, x):
        B, T, C = x.shape
        hd = C // self.n_heads
        # [B, T, 3, NH, hd] -> three [B, NH, T, hd] views: the layout picotrain's qkv has.
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, hd).permute(2, 0, 3, 1, 4)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = s.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layers, d, n_heads, vocab, padded_vocab, max_seq_len, attention):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(padded_vocab, d)
        self.wpe = nn.Embedding(max_seq_len, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, attention) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        # GPT-2's init (as picotrain: N(0, 0.02), residual projections scaled by 1/sqrt(2L)).
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head over the padded vocabulary
        # The real vocabulary only; autocast computes cross_entropy in fp32.
        logits = logits[..., : self.vocab]
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def read_shard(path):
    """Token ids of an llm.c shard (1024-byte header: magic 20240520, version, count; uint16 ids)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic != 20240520:
        raise SystemExit("%s: not an llm.c token shard (magic %d)" % (path, magic))
    ids = torch.frombuffer(bytearray(data[1024:1024 + 2 * count]), dtype=torch.int16)
    return ids.to(torch.int32) & 0xFFFF  # uint16 ids (torch 1.13 has no uint16)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="124m", choices=sorted(MODELS), help="shape preset (default 124m)")
    p.add_argument("--n-layers", type=int, help="override the preset")
    p.add_argument("--d-model", type=int, help="override the preset")
    p.add_argument("--n-heads", type=int, help="override the preset")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--pad-vocab-multiple", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=1024, help="rows of the position embedding")
    p.add_argument("-B", "--batch", type=int, default=8, help="micro-batch (sequences)")
    p.add_argument("-T", "--seq-len", type=int, default=1024)
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed optimizer steps first (compilation)")
    p.add_argument("--no-compile", action="store_true", help="eager mode (no torch.compile)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. max-autotune (default: none)")
    p.add_argument("--attention", default="auto", choices=["auto", "sdpa", "manual"],
                   help="auto: SDPA where torch has it, else manual")
    p.add_argument("--sdpa-backend", default="flash", choices=["flash", "cudnn", "efficient", "math", "any"],
                   help="the only SDPA backend allowed on CUDA (default flash)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--grad-clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="MFU peak (default: picotrain's device table)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", help="an llm.c token shard to take the batches from (default: uniform random ids)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    L, d, h = MODELS[args.model]
    args.n_layers = args.n_layers or L
    args.d_model = args.d_model or d
    args.n_heads = args.n_heads or h
    if args.d_model % args.n_heads:
        p.error("--d-model %d is not a multiple of --n-heads %d" % (args.d_model, args.n_heads))
    if args.seq_len > args.max_seq_len:
        p.error("-T %d exceeds --max-seq-len %d" % (args.seq_len, args.max_seq_len))
    return args


def select_sdpa_backend(name):
    """Allows only the named SDPA backend, through the global switches (torch.compile honours them)."""
    b = torch.backends.cuda
    switches = {"flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp", "math": "enable_math_sdp",
                "cudnn": "enable_cudnn_sdp"}
    for backend, fn in switches.items():
        if hasattr(b, fn):
            getattr(b, fn)(name in ("any", backend))
    if name not in ("any", "math") and not hasattr(b, switches[name]):
        raise SystemExit("torch %s has no %s SDPA backend" % (torch.__version__, name))


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    attention = args.attention
    if attention == "auto":
        attention = "sdpa" if has_sdpa else "manual"
    if attention == "sdpa" and not has_sdpa:
        raise SystemExit("torch %s has no scaled_dot_product_attention; use --attention manual" % torch.__version__)
    attention_desc = "manual (masked softmax, T x T)"
    if attention == "sdpa":
        attention_desc = "sdpa"
        if cuda:
            select_sdpa_backend(args.sdpa_backend)
            attention_desc = "sdpa (%s backend only)" % args.sdpa_backend
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers outside autocast, as users set
        torch.backends.cudnn.allow_tf32 = True

    padded_vocab = -(-args.vocab // args.pad_vocab_multiple) * args.pad_vocab_multiple
    model = GPT2(args.n_layers, args.d_model, args.n_heads, args.vocab, padded_vocab, args.max_seq_len,
                 attention).to(dev)
    n_params = sum(p.numel() for p in model.parameters())  # the tied wte once
    n_matmul = n_params - model.wpe.weight.numel()
    flops_per_token = 6 * n_matmul + 12 * args.n_layers * args.d_model * args.seq_len

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    adamw_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    fused = cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if fused:
        adamw_kw["fused"] = True
    opt = torch.optim.AdamW(groups, **adamw_kw)

    compiled = False
    run_model = model
    if not args.no_compile:
        if hasattr(torch, "compile"):
            run_model = torch.compile(model, mode=args.compile_mode)
            compiled = True
        else:
            print("torch %s has no torch.compile: running eager" % torch.__version__, file=sys.stderr)

    # A few distinct micro-batches made once on the device and reused in turn, so no data loading
    # is timed: from --data (the shard picotrain trains on, same token distribution) or uniform ids.
    B, T, A = args.batch, args.seq_len, args.grad_accum
    n_pool = min(4, A + 1)
    if args.data:
        stream = read_shard(args.data)
        need = n_pool * B * T + 1
        if stream.numel() < need:
            stream = stream.repeat(-(-need // stream.numel()))
        pool = [torch.stack([stream[(i * B + b) * T:(i * B + b) * T + T + 1] for b in range(B)]).long().to(dev)
                for i in range(n_pool)]
    else:
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        pool = [torch.randint(0, args.vocab, (B, T + 1), generator=gen).to(dev) for _ in range(n_pool)]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else None
    precision = "bf16 autocast, fp32 params/master, fused AdamW" if cuda else "fp32 (CPU)"
    if cuda and not fused:
        precision = "bf16 autocast, fp32 params/master, AdamW (not fused: this torch lacks it)"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # Inputs and targets as contiguous tensors, all of one layout: torch.compile never recompiles.
    pool = [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in pool]

    def train_step(step):
        total = 0.0
        for micro in range(A):
            x, y = pool[(step * A + micro) % len(pool)]
            if autocast is not None:
                with autocast:
                    loss = run_model(x, y) / A
            else:
                loss = run_model(x, y) / A
            loss.backward()
            total += loss.detach()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    losses, step_s = [], []
    t_start = time.perf_counter()
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = train_step(step)
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= args.warmup:
            step_s.append(dt)
        print("step %3d%s loss %.4f  %.1f ms" % (step + 1, " (warm-up)" if step < args.warmup else "", losses[-1],
                                                dt * 1e3), file=sys.stderr)
    wall = time.perf_counter() - t_start

    tokens_per_step = B * T * A
    tokens_per_s = tokens_per_step * len(step_s) / sum(step_s) if step_s else 0.0
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    peak, peak_source = args.peak_tflops, "--peak-tflops"
    if peak <= 0:
        peak, peak_source = peak_tflops(device_name), "picotrain device table (core/metrics/flops.cpp)"
    tflops = flops_per_token * tokens_per_s / 1e12
    result = {
        "what": "bench/torch_gpt2.py: PyTorch GPT-2 training throughput",
        "torch": torch.__version__,
        "device": device_name,
        "precision": precision,
        "attention": attention_desc,
        "compiled": compiled,
        "compile_mode": args.compile_mode,
        "model": {"n_layers": args.n_layers, "d_model": args.d_model, "n_heads": args.n_heads,
                  "vocab_size": args.vocab, "padded_vocab": padded_vocab, "max_seq_len": args.max_seq_len},
        "batch": {"micro_batch_size": B, "seq_len": T, "grad_accum": A, "tokens_per_step": tokens_per_step},
        "params": n_params,
        "matmul_params": n_matmul,
        "flops_formula": "palm: 6N+12LdT, N = params except wpe (tied wte once)",
        "flops_per_token": flops_per_token,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "warmup_steps": args.warmup,
        "timed_steps": len(step_s),
        "tokens_per_s": tokens_per_s,
        "step_ms_mean": 1e3 * sum(step_s) / len(step_s) if step_s else None,
        "step_ms_median": 1e3 * statistics.median(step_s) if step_s else None,
        "tflops": tflops,
        "mfu": tflops / peak if peak > 0 else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "max_memory_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
        "data": args.data or "uniform random ids",
        "wall_s": wall,
        "step_ms": [1e3 * s for s in step_s],
    }
    mfu = "%.1f%%" % (100 * result["mfu"]) if result["mfu"] is not None else "n/a (no peak for %s)" % device_name
    print("torch_gpt2: %s L%d d%d B%d T%d x%d: %.0f tokens/s, %.1f ms/step, %.1f TFLOP/s, MFU %s (%s, %s%s)" % (
        device_name, args.n_layers, args.d_model, B, T, A, tokens_per_s, result["step_ms_mean"] or 0, tflops, mfu,
        precision, attention_desc, ", compiled" if compiled else ", eager"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
