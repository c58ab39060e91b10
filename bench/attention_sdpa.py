#!/usr/bin/env python3
"""PyTorch's flash SDPA, causal, bf16: forward, backward and forward+backward TFLOP/s.

What it measures: F.scaled_dot_product_attention(q, k, v, is_causal=True) with only the flash
backend allowed (--backend), at the shapes bench/kernel_bench times picotrain's attention on:
head dim 64 and 128, T 1024, 4096, 8192, hidden NH*hd = 2048 and B*T = 16384 tokens
(FlashAttention's benchmark setup), plus optional extra shapes (--shape B,NH,T,hd). q, k and v
are views of one packed [B, T, 3, NH, hd] tensor permuted to [B, NH, T, hd], the layout a GPT-2's
qkv projection produces (and picotrain's attention reads), not three contiguous tensors; they are
leaves, so backward times the attention kernels alone.

FLOP convention (FlashAttention's benchmarks, also kernel_bench's): forward = 4*B*NH*T^2*hd,
halved for the causal mask (only the visible half of the T^2 pairs is counted); backward = 2.5 x
forward; forward+backward = 3.5 x forward. Recomputation inside a kernel is not counted.

How: CUDA events around each call (on the CPU: wall clock), --warmup untimed runs, then the
median of --reps runs. Forward: the SDPA call. Backward: out.backward(dout) after an untimed
forward. Forward+backward: both in one timed region.

    python3 bench/attention_sdpa.py --json sdpa.json
    python3 bench/attention_sdpa.py --device cpu --tokens 256 --seq-lens 64 128 --reps 2   # smoke test

Runs on torch 1.13 (CPU; without SDPA it times a manual masked softmax attention and says so)
and torch 2.x (CUDA).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def attention(q, k, v, use_sdpa):
    if use_sdpa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


class Timer:
    """Milliseconds of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __call__(self, fn, before=None):
        if before is not None:
            before()
        if self.cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)


def measure(B, NH, T, hd, dev, dtype, use_sdpa, warmup, reps):
    # q, k, v: [B, NH, T, hd] strided views of one packed [B, T, 3, NH, hd] buffer, made leaves so
    # that backward times the attention kernels alone (no gradient copy back into a packed tensor).
    packed = torch.randn(B, T, 3, NH, hd, device=dev, dtype=dtype)
    q, k, v = (t.detach().requires_grad_(True) for t in packed.permute(2, 0, 3, 1, 4).unbind(0))
    # The output's gradient in the layout a model hands back ([B, T, NH, hd] memory, from the
    # output projection), which is also the layout SDPA's output has: no copy before backward.
    dout = torch.randn(B, T, NH, hd, device=dev, dtype=dtype).transpose(1, 2)
    timer = Timer(dev.type == "cuda")
    state = {}

    def fwd():  # the training forward (autograd on: it keeps what backward needs)
        state["out"] = attention(q, k, v, use_sdpa)

    def bwd():
        state["out"].backward(dout)

    def fwd_bwd():
        fwd()
        bwd()

    def clear_grads():
        q.grad = k.grad = v.grad = None

    times = {}
    for name, fn, before in (("fwd", fwd, None), ("bwd", bwd, lambda: (clear_grads(), fwd())),
                             ("fwd_bwd", fwd_bwd, clear_grads)):
        for _ in range(warmup):
            timer(fn, before)
        times[name] = statistics.median(timer(fn, before) for _ in range(reps))
    fwd_flops = 4.0 * B * NH * T * T * hd / 2  # causal: half the pairs
    flops = {"fwd": fwd_flops, "bwd": 2.5 * fwd_flops, "fwd_bwd": 3.5 * fwd_flops}
    row = {"B": B, "NH": NH, "T": T, "hd": hd}
    for name in ("fwd", "bwd", "fwd_bwd"):
        row[name + "_ms"] = times[name]
        row[name + "_tflops"] = flops[name] / (times[name] * 1e-3) / 1e12
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--tokens", type=int, default=16384, help="B*T of each shape (B = tokens / T, at least 1)")
    p.add_argument("--hidden", type=int, default=2048, help="NH*hd of each shape")
    p.add_argument("--shape", action="append", default=[], metavar="B,NH,T,hd", help="an extra shape (repeatable)")
    p.add_argument("--backend", default="flash", choices=["flash", "cudnn", "efficient", "math", "any"],
                   help="the only SDPA backend allowed on CUDA (default flash)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    use_sdpa = hasattr(F, "scaled_dot_product_attention")
    impl = "sdpa" if use_sdpa else "manual masked softmax (this torch has no SDPA)"
    if cuda and use_sdpa:
        switches = {"flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp", "math": "enable_math_sdp",
                    "cudnn": "enable_cudnn_sdp"}
        for backend, fn in switches.items():
            if hasattr(torch.backends.cuda, fn):
                getattr(torch.backends.cuda, fn)(args.backend in ("any", backend))
        impl = "sdpa (%s backend only)" % args.backend
    dtype = torch.bfloat16 if cuda else torch.float32  # bf16 matmuls on a CPU are no benchmark

    shapes = [(max(1, args.tokens // T), args.hidden // hd, T, hd) for hd in args.head_dims for T in args.seq_lens]
    shapes += [tuple(int(x) for x in s.split(",")) for s in args.shape]
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    rows = []
    print("| B | NH | T | hd | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for B, NH, T, hd in shapes:
        r = measure(B, NH, T, hd, dev, dtype, use_sdpa, args.warmup, args.reps)
        rows.append(r)
        print("| %d | %d | %d | %d | %.3f | %.4g | %.3f | %.4g | %.3f | %.4g |" % (
            B, NH, T, hd, r["fwd_ms"], r["fwd_tflops"], r["bwd_ms"], r["bwd_tflops"], r["fwd_bwd_ms"],
            r["fwd_bwd_tflops"]), flush=True)
    result = {
        "what": "bench/attention_sdpa.py: PyTorch scaled_dot_product_attention, causal",
        "torch": torch.__version__,
        "device": device_name,
        "dtype": str(dtype).replace("torch.", ""),
        "implementation": impl,
        "layout": "q, k, v: leaf strided views of a packed [B, T, 3, NH, hd] tensor",
        "flops_convention": "fwd = 4*B*NH*T^2*hd / 2 (causal half), bwd = 2.5 x fwd, fwd_bwd = 3.5 x fwd",
        "timing": "median of %d reps after %d warm-up, %s" % (args.reps, args.warmup,
                                                              "CUDA events" if cuda else "wall clock"),
        "rows": rows,
    }
    print("attention_sdpa: %s, %s, %s" % (device_name, result["dtype"], impl), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
