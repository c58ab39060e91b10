#!/usr/bin/env python3
"""PyTorch's SDPA back ends, causal, bf16: forward, backward and forward+backward TFLOP/s.

What it measures: F.scaled_dot_product_attention(q, k, v, is_causal=True) with one back end
allowed at a time (torch.nn.attention.sdpa_kernel; --backends, default flash and cuDNN), at the
shapes bench/kernel_bench times picotrain's attention on: head dim 64 and 128, T 1k/2k/4k/8k/16k,
hidden NH*hd = 2048 and B*T = 16384 tokens (FlashAttention's benchmark setup), multi-head and
grouped-query 8:1 (--groups: query heads per key/value head, NKV = NH / group), plus optional
extra shapes (--shape B,NH,NKV,T,hd).

Grouped-query: first enable_gqa=True (torch >= 2.5: the back end reads each K/V head for its
whole group); a back end that refuses it gets K/V expanded to NH heads with repeat_interleave
instead, inside the timed region (what a model using that back end pays for GQA), and the row
says so. A back end that refuses a shape both ways, or is missing from this torch, is recorded as
unavailable with PyTorch's reason; the other rows go on.

Layout: q, k, v are leaf views of one packed [B, T, NH + 2*NKV, hd] tensor transposed to
[B, heads, T, hd]: the q | k | v rows a model's qkv projection writes (and picotrain's attention
reads), not contiguous tensors. Leaves, so backward times the attention kernels alone (plus the
expansion's reduction when K/V are expanded). Every input is fresh torch.randn (never zeros: a
zero input could take faster paths).

FLOP convention (FlashAttention's benchmarks, also kernel_bench's): forward = 4*B*NH*T^2*hd,
halved for the causal mask (only the visible half of the T^2 pairs is counted), whatever NKV;
backward = 2.5 x forward; forward+backward = 3.5 x forward. Recomputation inside a kernel is not
counted.

How: one untimed forward+backward per shape and back end (does it run at all? it also builds
cuDNN's graph), then per measurement --warmup untimed runs and the median of --reps runs, each
bracketed by CUDA events (on the CPU: wall clock). Forward: the SDPA call (autograd on, as in
training). Backward: out.backward(dout) after an untimed forward. Forward+backward: both in one
timed region. The JSON is rewritten after every shape, so a run cut short keeps what it measured.

    python3 bench/attention_sdpa.py --json sdpa.json
    python3 bench/attention_sdpa.py --seq-lens 8192 --head-dims 128 --groups 1   # one shape
    python3 bench/attention_sdpa.py --device cpu --tokens 256 --seq-lens 64 128 --reps 2   # smoke test

Runs on torch 2.3+ (torch.nn.attention.sdpa_kernel). On a torch without SDPA (the CPU's 1.13)
the only back end is "manual", a masked softmax written out, for smoke tests.
"""
import argparse
import contextlib
import json
import math
import re
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

# --backends names -> torch.nn.attention.SDPBackend members; "manual" calls no SDPA at all.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
EXPANDED = "K/V expanded to NH heads by repeat_interleave, inside the timed region"


class Unavailable(RuntimeError):
    """This torch cannot run the back end at all (no sdpa_kernel, no such SDPBackend)."""


def only_backend(name):
    """A context manager that lets SDPA use the back end `name` alone."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3
    except ImportError:
        raise Unavailable("torch %s has no torch.nn.attention.sdpa_kernel" % torch.__version__)
    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise Unavailable("torch %s has no SDPBackend.%s" % (torch.__version__, SDPA_BACKENDS[name]))
    return sdpa_kernel([member])


def manual_attention(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def attention_fn(backend, group, kv):
    """attention(q, k, v) for a back end; kv: "native" (enable_gqa when group > 1) or "expanded"."""
    def attention(q, k, v):
        if kv == "expanded" and group > 1:
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        if backend == "manual":
            return manual_attention(q, k, v)
        if group > 1 and kv == "native":  # only passed when needed: torch < 2.5 has no enable_gqa
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attention


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


def time_attention(attention, B, NH, NKV, T, hd, dev, dtype, warmup, reps):
    """Median ms of forward, backward and forward+backward; raises what the back end raises."""
    packed = torch.randn(B, T, NH + 2 * NKV, hd, device=dev, dtype=dtype)
    q, k, v = (packed[:, :, a:b].transpose(1, 2).detach().requires_grad_(True)
               for a, b in ((0, NH), (NH, NH + NKV), (NH + NKV, NH + 2 * NKV)))
    # The output's gradient in the layout a model hands back ([B, T, NH, hd] memory, from the
    # output projection), which is also the layout SDPA's output has: no copy before backward.
    dout = torch.randn(B, T, NH, hd, device=dev, dtype=dtype).transpose(1, 2)
    timer = Timer(dev.type == "cuda")
    state = {}

    def fwd():  # the training forward (autograd on: it keeps what backward needs)
        state["out"] = attention(q, k, v)

    def bwd():
        state["out"].backward(dout)

    def fwd_bwd():
        fwd()
        bwd()

    def clear_grads():
        q.grad = k.grad = v.grad = None

    timer(fwd_bwd, clear_grads)  # the probe: a refusal surfaces here, before any timing
    times = {}
    for name, fn, before in (("fwd", fwd, None), ("bwd", bwd, lambda: (clear_grads(), fwd())),
                             ("fwd_bwd", fwd_bwd, clear_grads)):
        for _ in range(warmup):
            timer(fn, before)
        times[name] = statistics.median(timer(fn, before) for _ in range(reps))
    return times


def reason(exc, caught):
    """PyTorch's why, short: the exception and the warnings a refusing back end emits first, each
    without its "(Triggered internally at <source file>)"."""
    lines = [str(exc)] + [str(w.message) for w in caught]
    lines = [re.sub(r"\s*\(Triggered internally at [^)]*\)", "", line.strip().split("\n")[0]) for line in lines]
    unique = list(dict.fromkeys(line for line in lines if line))
    return "; ".join(unique)[:400]


def measure(backend, B, NH, NKV, T, hd, dev, dtype, warmup, reps):
    """One row: a back end at one shape, timed natively or with expanded K/V, or unavailable."""
    group = NH // NKV
    row = {"backend": backend, "B": B, "NH": NH, "NKV": NKV, "T": T, "hd": hd}
    if group == 1:
        tries = ["native"]
    elif backend == "manual":  # the written-out attention has no grouped path
        tries = ["expanded"]
    else:
        tries = ["native", "expanded"]
    refusals = []
    for kv in tries:
        label = "" if group == 1 else ("enable_gqa=True: " if kv == "native" else "expanded K/V: ")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # a refusing back end says why in warnings
            try:
                with contextlib.nullcontext() if backend == "manual" else only_backend(backend):
                    times = time_attention(attention_fn(backend, group, kv), B, NH, NKV, T, hd, dev, dtype, warmup,
                                           reps)
            except Unavailable as e:  # nothing else to try with this torch
                refusals.append(str(e))
                break
            except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:  # a refusal, OOM included
                refusals.append(label + reason(e, caught))
                continue
        row["status"] = "ok"
        row["gqa"] = None if group == 1 else ("enable_gqa=True" if kv == "native" else EXPANDED)
        row["kv_expanded"] = group > 1 and kv == "expanded"
        if refusals:
            row["note"] = "refused " + "; then ".join(refusals)
        fwd_flops = 4.0 * B * NH * T * T * hd / 2  # causal: half the pairs; the same for any NKV
        flops = {"fwd": fwd_flops, "bwd": 2.5 * fwd_flops, "fwd_bwd": 3.5 * fwd_flops}
        for name in ("fwd", "bwd", "fwd_bwd"):
            row[name + "_ms"] = times[name]
            row[name + "_tflops"] = flops[name] / (times[name] * 1e-3) / 1e12
        return row
    row["status"] = "unavailable"
    row["why"] = "; then ".join(refusals)
    return row


def table_line(r):
    shape = "| %s | %d | %d | %d | %d | %d |" % (r["backend"], r["B"], r["NH"], r["NKV"], r["T"], r["hd"])
    if r["status"] != "ok":
        return shape + " unavailable | | | | | | %s |" % r["why"]
    notes = "; ".join(x for x in (r.get("gqa"), r.get("note")) if x)
    return shape + " %.3f | %.4g | %.3f | %.4g | %.3f | %.4g | %s |" % (
        r["fwd_ms"], r["fwd_tflops"], r["bwd_ms"], r["bwd_tflops"], r["fwd_bwd_ms"], r["fwd_bwd_tflops"], notes)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--groups", type=int, nargs="+", default=[1, 8],
                   help="query heads per key/value head (1: multi-head; 8: grouped-query 8:1)")
    p.add_argument("--tokens", type=int, default=16384, help="B*T of each shape (B = tokens / T, at least 1)")
    p.add_argument("--hidden", type=int, default=2048, help="NH*hd of each shape")
    p.add_argument("--shape", action="append", default=[], metavar="B,NH,NKV,T,hd", help="an extra shape (repeatable)")
    have_sdpa = hasattr(F, "scaled_dot_product_attention")
    p.add_argument("--backends", nargs="+", choices=sorted(SDPA_BACKENDS) + ["manual"],
                   default=["flash", "cudnn"] if have_sdpa else ["manual"],
                   help="back ends to time, one at a time (default flash cudnn; manual: masked softmax, no SDPA)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs of each measurement (after one probe)")
    p.add_argument("--reps", type=int, default=10, help="timed runs of each measurement; the median is reported")
    p.add_argument("--json", help="write the results here (rewritten after every shape)")
    args = p.parse_args(argv)
    if not have_sdpa and set(args.backends) != {"manual"}:
        p.error("torch %s has no scaled_dot_product_attention: only --backends manual" % torch.__version__)

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # bf16 matmuls on a CPU are no benchmark
    shapes = []
    for group in args.groups:
        for hd in args.head_dims:
            NH = args.hidden // hd
            if group < 1 or NH % group:
                p.error("%d query heads per key/value head do not divide NH = %d (hd %d)" % (group, NH, hd))
            shapes += [(max(1, args.tokens // T), NH, NH // group, T, hd) for T in args.seq_lens]
    shapes += [tuple(int(x) for x in s.split(",")) for s in args.shape]
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    result = {
        "what": "bench/attention_sdpa.py: PyTorch scaled_dot_product_attention, causal, one back end at a time",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": device_name,
        "dtype": str(dtype).replace("torch.", ""),
        "backends": args.backends,
        "layout": "q, k, v: leaf [B, heads, T, hd] views of a packed [B, T, NH + 2*NKV, hd] tensor",
        "flops_convention": "fwd = 4*B*NH*T^2*hd / 2 (causal half, any NKV), bwd = 2.5 x fwd, fwd_bwd = 3.5 x fwd",
        "timing": "median of %d reps after a probe and %d warm-up, %s" % (
            args.reps, args.warmup, "CUDA events" if cuda else "wall clock"),
        "rows": [],
    }
    print("attention_sdpa: %s, torch %s, %s, back ends %s" % (device_name, torch.__version__, result["dtype"],
                                                              " ".join(args.backends)), file=sys.stderr)
    print("| backend | B | NH | NKV | T | hd | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd ms | "
          "fwd+bwd TFLOP/s | notes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for B, NH, NKV, T, hd in shapes:
        for backend in args.backends:
            r = measure(backend, B, NH, NKV, T, hd, dev, dtype, args.warmup, args.reps)
            result["rows"].append(r)
            print(table_line(r), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
    # Unavailable back ends are results; nothing measured at all means a broken setup.
    return 0 if any(r["status"] == "ok" for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
