#!/usr/bin/env python3
"""The summary of one bench/gpu_bench.sh run: issue #9's targets, ours against PyTorch, met or not.

Reads what gpu_bench.sh left in its output folder and writes bench_summary.md there:
  machine.txt                      the device (nvidia-smi), versions, date
  steps.tsv                        each step of the script: name, status, seconds, detail
  kernel_bench.json / .md          bench/kernel_bench: every op's time, work and share of the ceilings
  kernel_attention.json            bench/kernel_bench --model none: our attention, MHA and GQA 8:1
  attention_sdpa.json              bench/attention_sdpa.py: PyTorch's flash and cuDNN SDPA, same shapes
  picotrain_124m.jsonl, picotrain_1.5b.jsonl,  picotrain's metrics.jsonl of the training runs
  picotrain_llama1b.jsonl                        (GPT-2 124M and 1.5B, a Llama of Llama 3.2 1B's shape)
  picotrain_mixtral_small.jsonl                  (gpu_bench.sh MOE=1: configs/mixtral-small.json)
  picotrain_124m_graphs.jsonl,                   (gpu_bench.sh GRAPHS=1: the 124M and Llama 1B runs
  picotrain_llama1b_graphs.jsonl                  again with run.cuda_graphs=true)
  picotrain_124m_sm90bwd.jsonl,                  (gpu_bench.sh HOPPER_BWD=1: the same runs with
  picotrain_llama1b_sm90bwd.jsonl                 PICOTRAIN_FLASH_BACKWARD=auto)
  torch_124m.json (torch_1.5b.json)            bench/torch_gpt2.py at the same shapes
Any of them may be missing (a step failed or was skipped): its rows then say "n/a".

Training throughput over a run = tokens of the steps after the first --skip-* (warm-up) / their
summed step time; MFU the same way (picotrain logs it per step against its peak; the dt-weighted
mean is the MFU of the aggregate). Attention (issue #30) compares forward+backward TFLOP/s at
equal shapes and the same FLOP convention (causal counts half; backward 2.5 x forward; any NKV)
against the faster of PyTorch's flash and cuDNN back ends at that shape.

    python3 bench/bench_summary.py OUT_DIR [--skip-124m 5] [--skip-15b 3] [--skip-1b 3]
"""
import argparse
import json
import os
import sys

TARGET_SPEEDUP_124M = 1.3
TARGET_MFU_124M = 0.50
TARGET_MFU_15B = 0.55
TARGET_MFU_LLAMA_1B = 0.50
TARGET_FP8_15B = 1.25  # issue #35: FP8 tokens/s over bf16's, GPT-2 1.5B
TARGET_FP8_LLAMA_1B = 1.3  # and the 1B Llama
# Issue #30: attention fwd+bwd against the faster SDPA back end (flash, cuDNN) at every shape, more
# from T 4k on, and an absolute forward rate at head size 128, T 8k.
TARGET_ATTENTION = 1.0
TARGET_ATTENTION_LONG = 1.3
ATTENTION_LONG_T = 4096
TARGET_ATTENTION_FWD_TFLOPS = 500.0
TARGET_DECODE_BANDWIDTH = 0.6  # issue #30: decoding at Tk 8k, of the measured copy bandwidth
DECODE_TK = 8192
TARGET_RING_BLOCK = 1.0  # issue #30: ring attention's block kernels at the flash kernels' speed (fwd+bwd TFLOP/s)
ATTENTION_FWD_SHAPE = (128, 8192)  # (hd, T)
SDPA_BACKENDS = ("flash", "cudnn")
TARGET_BANDWIDTH = 0.70
# The phases of picotrain's step timeline (core/metrics/step_timeline.h): metrics.jsonl's <phase>_ms.
PHASES = ("forward", "backward", "pp_comm", "grad_sync", "optimizer")


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def picotrain_run(path, skip):
    """Aggregate tokens/s, MFU, TFLOP/s and step ms of a metrics.jsonl after `skip` steps."""
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        return None
    steps = [r for r in rows if "dt_ms" in r and r.get("step", 0) > skip]
    if not steps:
        return None
    dt = sum(r["dt_ms"] for r in steps) / 1e3
    tokens = sum(r["tokens_per_s"] * r["dt_ms"] / 1e3 for r in steps)
    out = {
        "timed_steps": len(steps),
        "first_timed_step": steps[0]["step"],
        "tokens_per_s": tokens / dt,
        "step_ms_mean": 1e3 * dt / len(steps),
        "mfu": sum(r["mfu"] * r["dt_ms"] for r in steps) / (1e3 * dt),
        "tflops": sum(r["tflops_per_gpu"] * r["dt_ms"] for r in steps) / (1e3 * dt),
        "loss_first": rows[0].get("loss"),
        "loss_last": steps[-1].get("loss"),
        "data_ms_mean": sum(r.get("data_ms", 0) for r in steps) / len(steps),
        # The device's time by phase (picotrain's step timeline), mean ms per step.
        "phases_ms_mean": {ph: sum(r.get(ph + "_ms", 0) for r in steps) / len(steps) for ph in PHASES
                           if any(ph + "_ms" in r for r in steps)},
    }
    if steps[0]["mfu"] > 0:
        out["peak_tflops"] = steps[0]["tflops_per_gpu"] / steps[0]["mfu"]
    return out


def phase_table(runs):
    """Markdown lines: each run's mean step split by the device's clock (picotrain's step timeline)."""
    lines = ["Measured in the training runs, on the GPU's clock (CUDA events in the compute stream at each "
             "change of phase; mean ms per step over the timed steps; the rest of the step is data reading and "
             "host time outside the device timeline):", "",
             "| model | " + " | ".join(PHASES) + " | outside the timeline | step |",
             "|---|" + "---|" * (len(PHASES) + 2)]
    rows = 0
    for name, run in runs:
        ph = run.get("phases_ms_mean") or {}
        if not ph:
            continue
        step = run["step_ms_mean"]
        cells = ["%.1f (%.0f%%)" % (ph[p], 100 * ph[p] / step) if p in ph else "-" for p in PHASES]
        outside = max(0.0, step - sum(ph.values()))
        lines.append("| %s | %s | %.1f (%.0f%%) | %.1f |" % (name, " | ".join(cells), outside, 100 * outside / step, step))
        rows += 1
    return lines + [""] if rows else []


def fmt(x, spec, missing="n/a"):
    return missing if x is None else spec % x


def met(value, target):
    if value is None:
        return "n/a"
    return "**yes**" if value >= target else "no"


def attention_key(B, NH, NKV, T, hd):
    """A shape of the attention comparison; sorts multi-head first, then by head size and T."""
    return (NH // NKV, hd, T, B, NH, NKV)


def heads_label(key):
    group, NH, NKV = key[0], key[4], key[5]
    return "MHA %d" % NH if group == 1 else "GQA %d:%d" % (NH, NKV)


def ours_attention(kernel_jsons):
    """Our attention from kernel_bench's "attention" rows: {key: {"fwd", "bwd", "fwd_bwd": TFLOP/s,
    "fwd_sm90", "bwd_sm90", "fwd_bwd_sm90" where the Hopper kernels were timed beside, and "block_fwd",
    "block_fwd_bwd": ring attention's past block at that shape}}, and the shapes it did not time
    ("shape: why")."""
    ops = {"attention_forward": "fwd", "attention_backward": "bwd", "attention_fwd+bwd": "fwd_bwd",
           "attention_forward_sm90": "fwd_sm90", "attention_backward_sm90": "bwd_sm90",
           "attention_fwd+bwd_sm90": "fwd_bwd_sm90",
           "attention_block_forward": "block_fwd", "attention_block_fwd+bwd": "block_fwd_bwd",
           "attention_block_forward_sm90": "block_fwd_sm90", "attention_block_fwd+bwd_sm90": "block_fwd_bwd_sm90"}
    ours, not_timed = {}, []
    for kb in kernel_jsons:
        for r in (kb or {}).get("rows", []):
            if r["section"] == "attention" and r["op"] in ops:
                f = dict(kv.split("=") for kv in r["shape"].split())  # "B= NH= [NKV=] T= hd="
                key = attention_key(int(f["B"]), int(f["NH"]), int(f.get("NKV", f["NH"])), int(f["T"]), int(f["hd"]))
                ours.setdefault(key, {})[ops[r["op"]]] = r["rate"]
        not_timed += ["%s: %s" % (x["shape"], x["error"]) for x in (kb or {}).get("failures", [])
                      if x["section"] == "attention"]
    return ours, not_timed


def sdpa_attention(sdpa):
    """attention_sdpa.py's rows as {key: {backend: row}} (files before issue #30: flash, multi-head)."""
    theirs = {}
    for r in (sdpa or {}).get("rows", []):
        key = attention_key(r["B"], r["NH"], r.get("NKV", r["NH"]), r["T"], r["hd"])
        theirs.setdefault(key, {})[r.get("backend", "flash")] = r
    return theirs


def sdpa_ok(row):
    return row is not None and row.get("status", "ok") == "ok"


def sdpa_cell(row):
    if row is None:
        return "not run"
    if not sdpa_ok(row):
        return "unavailable"
    return "%.1f / %.1f / %.1f%s" % (row["fwd_tflops"], row["bwd_tflops"], row["fwd_bwd_tflops"],
                                     " (K/V expanded)" if row.get("kv_expanded") else "")


def met_all(results):
    """One verdict over shapes: each True, False or None (not measured)."""
    if not results:
        return "n/a"
    if False in results:
        return "no"
    missing = results.count(None)
    return "no: %d of %d shapes not measured" % (missing, len(results)) if missing else "**yes**"


def attention_report(kernel_jsons, sdpa):
    """Issue #30's attention comparison: (rows for the targets table, the per-shape section)."""
    ours, not_timed = ours_attention(kernel_jsons)
    theirs = sdpa_attention(sdpa)
    shapes = []
    for key in sorted(set(ours) | set(theirs)):
        o, backends = dict(ours.get(key, {})), theirs.get(key, {})
        # The targets hold for the faster of our two kernel pairs (the one the trainer would be set to run).
        for m in ("fwd", "bwd", "fwd_bwd"):
            if o.get(m + "_sm90") is not None:
                o["best_" + m] = max(o.get(m) or 0.0, o[m + "_sm90"])
            elif o.get(m) is not None:
                o["best_" + m] = o[m]
        ok = {b: r for b, r in backends.items() if sdpa_ok(r)}
        faster = max(ok, key=lambda b: ok[b]["fwd_bwd_tflops"]) if ok else None
        s = {"key": key, "ours": o, "backends": backends, "faster": faster,
             "ratio": o["best_fwd_bwd"] / ok[faster]["fwd_bwd_tflops"] if o.get("best_fwd_bwd") and faster else None,
             "min_ratio": TARGET_ATTENTION_LONG if key[2] >= ATTENTION_LONG_T else TARGET_ATTENTION,
             "min_fwd": TARGET_ATTENTION_FWD_TFLOPS if key[1:3] == ATTENTION_FWD_SHAPE else None}
        s["ratio_met"] = None if s["ratio"] is None else s["ratio"] >= s["min_ratio"]
        s["fwd_met"] = None if s["min_fwd"] is None or o.get("best_fwd") is None else o["best_fwd"] >= s["min_fwd"]
        shapes.append(s)

    # ---- the targets table: the worst shape of each fwd+bwd target, the forward rate
    targets = []
    long_shapes = [s for s in shapes if s["key"][2] >= ATTENTION_LONG_T]
    for what, subset, target in (("every shape", shapes, TARGET_ATTENTION),
                                 ("T >= %d" % ATTENTION_LONG_T, long_shapes, TARGET_ATTENTION_LONG)):
        if not subset:
            continue
        measured = [s for s in subset if s["ratio"] is not None]
        where, cells = "", ("n/a",) * 3
        if measured:
            w = min(measured, key=lambda s: s["ratio"])
            where = " (%s, hd %d, T %d)" % (heads_label(w["key"]), w["key"][1], w["key"][2])
            cells = ("%.1f" % w["ours"]["best_fwd_bwd"],
                     "%.1f (%s)" % (w["backends"][w["faster"]]["fwd_bwd_tflops"], w["faster"]), "%.2fx" % w["ratio"])
        targets.append("| attention fwd+bwd, causal bf16, %s (%d): worst ours / faster SDPA%s | %s | %s | %s | "
                       ">= %.1fx the faster SDPA back end (%s) | %s |" % (
                           what, len(subset), where, *cells, target, ", ".join(SDPA_BACKENDS),
                           met_all([None if s["ratio"] is None else s["ratio"] >= target for s in subset])))
    for s in shapes:
        if s["min_fwd"] is None:
            continue
        best_fwd = max((r["fwd_tflops"] for r in s["backends"].values() if sdpa_ok(r)), default=None)
        fwd = s["ours"].get("best_fwd")
        targets.append("| attention forward, causal bf16, %s, hd %d, T %d (B %d): TFLOP/s | %s | %s | %s | "
                       ">= %.0f TFLOP/s | %s |" % (
                           heads_label(s["key"]), s["key"][1], s["key"][2], s["key"][3], fmt(fwd, "%.1f"),
                           fmt(best_fwd, "%.1f"), fmt(fwd and best_fwd and fwd / best_fwd, "%.2fx"), s["min_fwd"],
                           met(fwd, s["min_fwd"])))
    # Ring attention's blocks against our causal kernels at the same shape (both fwd+bwd TFLOP/s).
    ring = [s for s in shapes if s["ours"].get("block_fwd_bwd") and s["ours"].get("fwd_bwd")]
    if ring:
        w = min(ring, key=lambda s: s["ours"]["block_fwd_bwd"] / s["ours"]["fwd_bwd"])
        r = w["ours"]["block_fwd_bwd"] / w["ours"]["fwd_bwd"]
        targets.append("| ring attention's blocks fwd+bwd, bf16 (%d shapes): worst ours / our causal kernels "
                       "(%s, hd %d, T %d) | %.1f | %.1f | %.2fx | >= %.1fx | %s |" % (
                           len(ring), heads_label(w["key"]), w["key"][1], w["key"][2], w["ours"]["block_fwd_bwd"],
                           w["ours"]["fwd_bwd"], r, TARGET_RING_BLOCK, met(r, TARGET_RING_BLOCK)))
    # Decoding against a KV cache: the K and V bytes at Tk 8k against the copy bandwidth.
    decode = [r for kb in kernel_jsons for r in (kb or {}).get("rows", [])
              if r["section"] == "attention" and r["op"] == "attention_decode" and "Tk=%d " % DECODE_TK in r["shape"]]
    if decode:
        w = min(decode, key=lambda r: r["fraction"])
        targets.append("| decoding against a KV cache, Tk %d (%d shapes): worst K/V read rate (%s) | %.0f GB/s "
                       "(%.0f%%) | | | >= %.0f%% of the copy bandwidth | %s |" % (
                           DECODE_TK, len(decode), w["shape"], w["rate"], 100 * w["fraction"],
                           100 * TARGET_DECODE_BANDWIDTH, met(w["fraction"], TARGET_DECODE_BANDWIDTH)))
    if not shapes:
        targets.append("| attention fwd+bwd (hd 64/128, T 1k-16k, MHA and GQA 8:1) | n/a | n/a | n/a | >= %.1fx the "
                       "faster SDPA (>= %.1fx at T >= %d) | n/a |" % (TARGET_ATTENTION, TARGET_ATTENTION_LONG,
                                                                     ATTENTION_LONG_T))

    # ---- the section: every shape
    section = ["## Attention (issue #30): ours against PyTorch SDPA", ""]
    if not shapes:
        return targets, section + ["No results: neither kernel_attention.json nor attention_sdpa.json has a row.", ""]
    tokens = sorted({s["key"][3] * s["key"][2] for s in shapes})
    hidden = sorted({s["key"][4] * s["key"][1] for s in shapes})
    section += ["Causal, bf16, B*T = %s tokens, NH*hd = %s; TFLOP/s with "
                "causal counted as half the T^2 pairs, backward = 2.5 x forward, whatever NKV. Ours: "
                "bench/kernel_bench; SDPA: bench/attention_sdpa.py, one back end at a time, fwd / bwd / fwd+bwd. The "
                "ratio is ours (the faster of the sm_80 and the Hopper kernels; files before the Hopper backward timed "
                "the Hopper forward with the sm_80 backward) against "
                "the faster back end at that shape, forward+backward. Ring block: ring attention's past block at that "
                "shape (T/2 queries against the T/2 keys before them, every pair visible: 4*B*NH*(T/2)^2*hd FLOPs "
                "forward), fwd / fwd+bwd, the Hopper kernels' in brackets where timed."
                % ("/".join(map(str, tokens)), "/".join(map(str, hidden))), "",
                "| heads | hd | T | B | ours fwd | ours bwd | ours fwd+bwd | Hopper fwd / bwd / fwd+bwd | "
                "ring block fwd / fwd+bwd | %s | ours / faster SDPA | target | met? |"
                % " | ".join("SDPA " + b for b in SDPA_BACKENDS), "|---" * (12 + len(SDPA_BACKENDS)) + "|"]
    notes = {}  # (back end, what it said) -> the shapes it said it at
    for s in shapes:
        o, key = s["ours"], s["key"]
        target = ">= %.1fx" % s["min_ratio"] + ("; fwd >= %.0f TFLOP/s" % s["min_fwd"] if s["min_fwd"] else "")
        checks = [s["ratio_met"]] + ([s["fwd_met"]] if s["min_fwd"] else [])
        verdict = "n/a" if None in checks else ("**yes**" if all(checks) else "no")
        cells = [heads_label(key), "%d" % key[1], "%d" % key[2], "%d" % key[3]]
        cells += [fmt(o.get(m), "%.1f") for m in ("fwd", "bwd", "fwd_bwd")]
        cells += ["%s / %s / %s" % (fmt(o.get("fwd_sm90"), "%.1f"), fmt(o.get("bwd_sm90"), "%.1f"),
                                    fmt(o.get("fwd_bwd_sm90"), "%.1f"))
                  if o.get("fwd_sm90") is not None else "not run"]
        ring = ("%s / %s" % (fmt(o.get("block_fwd"), "%.1f"), fmt(o.get("block_fwd_bwd"), "%.1f"))
                if o.get("block_fwd") is not None else "not run")
        if o.get("block_fwd_sm90") is not None:
            ring += " (Hopper %s / %s)" % (fmt(o.get("block_fwd_sm90"), "%.1f"), fmt(o.get("block_fwd_bwd_sm90"), "%.1f"))
        cells.append(ring)
        cells += [sdpa_cell(s["backends"].get(b)) for b in SDPA_BACKENDS]
        cells += [fmt(s["ratio"], "%.2fx vs " + (s["faster"] or "")), target, verdict]
        section.append("| %s |" % " | ".join(cells))
        for b, r in sorted(s["backends"].items()):
            said = r.get("why") or r.get("note")
            if said:
                where = "%s hd %d T %d" % (heads_label(key), key[1], key[2])
                notes.setdefault((b, said.replace("|", "/")), []).append(where)
    section.append("")
    if notes:
        section += ["What the SDPA back ends said (a back end that refused enable_gqa=True was timed with K/V "
                    "expanded by repeat_interleave inside the timed region):", ""]
        section += ["- %s at %s: %s" % (b, ", ".join(at), said) for (b, said), at in notes.items()]
        section.append("")
    if not_timed:
        section += ["Not timed by kernel_bench: " + "; ".join(x.replace("|", "/") for x in not_timed), ""]
    return targets, section


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--skip-124m", type=int, default=5, help="warm-up steps of the 124M runs not counted")
    p.add_argument("--skip-15b", type=int, default=3, help="warm-up steps of the 1.5B runs not counted")
    p.add_argument("--skip-1b", type=int, default=3, help="warm-up steps of the Llama 1B run not counted")
    args = p.parse_args(argv)
    d = args.out
    path = lambda name: os.path.join(d, name)  # noqa: E731

    kb = load_json(path("kernel_bench.json"))
    ka = load_json(path("kernel_attention.json"))
    sdpa = load_json(path("attention_sdpa.json"))
    t124 = load_json(path("torch_124m.json"))
    t15 = load_json(path("torch_1.5b.json"))
    p124 = picotrain_run(path("picotrain_124m.jsonl"), args.skip_124m)
    p124_timed = picotrain_run(path("picotrain_124m_timed.jsonl"), args.skip_124m)
    p124_graphs = picotrain_run(path("picotrain_124m_graphs.jsonl"), args.skip_124m)
    pl1_graphs = picotrain_run(path("picotrain_llama1b_graphs.jsonl"), args.skip_1b)
    p124_sm90bwd = picotrain_run(path("picotrain_124m_sm90bwd.jsonl"), args.skip_124m)
    pl1_sm90bwd = picotrain_run(path("picotrain_llama1b_sm90bwd.jsonl"), args.skip_1b)
    p15 = picotrain_run(path("picotrain_1.5b.jsonl"), args.skip_15b)
    pl1 = picotrain_run(path("picotrain_llama1b.jsonl"), args.skip_1b)
    p15_fp8 = picotrain_run(path("picotrain_1.5b_fp8.jsonl"), args.skip_15b)
    pl1_fp8 = picotrain_run(path("picotrain_llama1b_fp8.jsonl"), args.skip_1b)
    pmx = picotrain_run(path("picotrain_mixtral_small.jsonl"), args.skip_1b)

    md = ["# picotrain GPU benchmarks (issues #9, #30)", ""]
    try:
        md += ["```", open(path("machine.txt")).read().rstrip(), "```", ""]
    except OSError:
        md += ["(no machine.txt)", ""]

    # ---- the targets
    md += ["## Targets", "",
           "| what | picotrain | PyTorch | ratio | target | met? |",
           "|---|---|---|---|---|---|"]
    ours = p124 and p124["tokens_per_s"]
    theirs = t124 and t124["tokens_per_s"]
    ratio = ours / theirs if ours and theirs else None
    shape = ""
    if t124:
        shape = ", B %d x %d micro-batches" % (t124["batch"]["micro_batch_size"], t124["batch"]["grad_accum"])
        # The ratio means something only at equal tokens per step.
        if p124 and abs(p124["tokens_per_s"] * p124["step_ms_mean"] / 1e3 - t124["batch"]["tokens_per_step"]) > \
                1e-3 * t124["batch"]["tokens_per_step"]:
            shape += " (**picotrain ran another batch: not comparable**)"
            ratio = None
    md.append("| GPT-2 124M, T=1024, bf16%s: tokens/s | %s | %s | %s | >= %.1fx PyTorch (compile + flash SDPA) | %s |" % (
        shape, fmt(ours, "%.0f"), fmt(theirs, "%.0f"), fmt(ratio, "%.2fx"), TARGET_SPEEDUP_124M,
        met(ratio, TARGET_SPEEDUP_124M)))
    m_ours = p124 and p124["mfu"]
    md.append("| GPT-2 124M: MFU (PaLM formula) | %s | %s | | >= %.0f%% | %s |" % (
        fmt(m_ours and 100 * m_ours, "%.1f%%"), fmt(t124 and t124.get("mfu") and 100 * t124["mfu"], "%.1f%%"),
        100 * TARGET_MFU_124M, met(m_ours, TARGET_MFU_124M)))
    m15 = p15 and p15["mfu"]
    t15_tps = t15 and t15["tokens_per_s"]
    md.append("| GPT-2 1.5B: MFU (PaLM formula) | %s | %s | %s | >= %.0f%% | %s |" % (
        fmt(m15 and 100 * m15, "%.1f%%"), fmt(t15 and t15.get("mfu") and 100 * t15["mfu"], "%.1f%%", "not run"),
        fmt(p15 and t15_tps and p15["tokens_per_s"] / t15_tps, "%.2fx tokens/s", ""), 100 * TARGET_MFU_15B,
        met(m15, TARGET_MFU_15B)))
    ml1 = pl1 and pl1["mfu"]
    md.append("| Llama 1B (Llama 3.2 1B's shape, T 2048, configs/llama3-1b.json): MFU (PaLM formula) | %s | not run | "
              "| >= %.0f%% | %s |" % (fmt(ml1 and 100 * ml1, "%.1f%%"), 100 * TARGET_MFU_LLAMA_1B,
                                     met(ml1, TARGET_MFU_LLAMA_1B)))

    # FP8 (issue #35, FP8=1): tokens/s against the bf16 run of the same config in this call, and the
    # last step's loss gap (the target: within 1% after the run's steps).
    for label, fp8_run, bf16_run, target in (("GPT-2 1.5B", p15_fp8, p15, TARGET_FP8_15B),
                                             ("Llama 1B", pl1_fp8, pl1, TARGET_FP8_LLAMA_1B)):
        if not fp8_run:
            continue
        speedup = bf16_run and fp8_run["tokens_per_s"] / bf16_run["tokens_per_s"]
        gap = "n/a"
        if bf16_run and fp8_run["loss_last"] is not None and bf16_run["loss_last"]:
            gap = "%+.2f%%" % (100 * (fp8_run["loss_last"] - bf16_run["loss_last"]) / bf16_run["loss_last"])
        md.append("| %s, FP8 tensorwise: tokens/s (loss gap at the last step %s) | %s | %s (bf16) | %s | >= %.2fx bf16 | %s |"
                  % (label, gap,
                     fmt(fp8_run["tokens_per_s"], "%.0f"), fmt(bf16_run and bf16_run["tokens_per_s"], "%.0f"),
                     fmt(speedup, "%.2fx"), target, met(speedup, target)))

    # attention (issue #30): ours (kernel_bench's "attention" rows) against the faster SDPA back end
    attention_targets, attention_section = attention_report((kb, ka), sdpa)
    md += attention_targets

    # memory-bound kernels against the measured copy bandwidth
    if kb:
        mem = [r for r in kb["rows"] if r["unit"] == "byte" and r["section"] not in ("ceiling",) and r["work"] > 1e6]
        low = [r for r in mem if r["fraction"] < TARGET_BANDWIDTH]
        worst = ", ".join("%s [%s] %.0f%%" % (r["op"], r["section"].split(" ")[0], 100 * r["fraction"])
                          for r in sorted(low, key=lambda r: r["fraction"]))
        md.append("| memory-bound kernels (elementwise, norms, loss, optimizer) at >= 70%% of the copy bandwidth "
                  "(%.0f GB/s measured) | %d of %d below | | | all >= %.0f%% | %s |" % (
                      kb["bandwidth_ceiling_gbps"], len(low), len(mem), 100 * TARGET_BANDWIDTH,
                      "**yes**" if not low else "no: " + worst))
    else:
        md.append("| memory-bound kernels at >= 70% of bandwidth | n/a | | | all >= 70% | n/a |")
    md.append("")
    md += attention_section

    # ---- where a step's time goes: the kernel sum against the measured step
    md += ["## Where a step's time goes", ""]
    md += phase_table((name, run) for name, run in (("gpt2-124m", p124), ("gpt2-1.5b", p15), ("llama-1b", pl1))
                      if run)
    if kb:
        mm_shape = next((r["shape"] for r in kb["rows"] if r["section"] == "ceiling" and r["unit"] == "FLOP"), "?")
        md.append("Ceilings measured in this run: copy %.0f GB/s; matmul_forward %s %.0f TFLOP/s%s." % (
            kb["bandwidth_ceiling_gbps"], mm_shape, kb["flop_ceiling_tflops"],
            " (%.1f%% of the %.1f TFLOP/s datasheet peak used for MFU)" % (
                100 * kb["flop_ceiling_tflops"] / kb["datasheet_peak_tflops"], kb["datasheet_peak_tflops"])
            if kb.get("datasheet_peak_tflops") else ""))
        md.append("")
        md += ["| model | tokens/step | sum of kernel medians per step | measured picotrain step | not in kernels |",
               "|---|---|---|---|---|"]
        for name, run in (("gpt2-124m", p124), ("gpt2-1.5b", p15)):
            sm = kb.get("step_model", {}).get(name)
            if not sm:
                continue
            tok, kernel_ms = sm["tokens_per_step"], sm["kernel_ms_per_step"]
            if not run:
                md.append("| %s | %.0f | %.1f ms | n/a | n/a |" % (name, tok, kernel_ms))
                continue
            run_tok = run["tokens_per_s"] * run["step_ms_mean"] / 1e3
            # Comparable only when kernel_bench assumed the batch picotrain ran (B x accum).
            same = abs(run_tok - tok) < 1e-3 * tok
            md.append("| %s | %.0f | %.1f ms | %.1f ms per %.0f tokens | %s |" % (
                name, tok, kernel_ms, run["step_ms_mean"], run_tok,
                "%.1f ms (%.0f%%)" % (run["step_ms_mean"] - kernel_ms, 100 * (1 - kernel_ms / run["step_ms_mean"]))
                if same else "n/a: another batch"))
        md.append("")
        try:
            kmd = open(path("kernel_bench.md")).read()
            body = kmd.split("\n", 1)[1].strip().replace("\n## ", "\n### ")
            md += ["## Per-kernel table (bench/kernel_bench)", "", body, ""]
        except OSError:
            pass
    else:
        md += ["kernel_bench did not run.", ""]

    # ---- the runs
    md += ["## Training runs", "", "| run | timed steps | tokens/s | step ms | TFLOP/s | MFU | loss first -> last | notes |",
           "|---|---|---|---|---|---|---|---|"]
    runs = [("picotrain 124M", p124), ("picotrain 1.5B", p15), ("picotrain Llama 1B", pl1)]
    if p124_timed:  # gpu_bench.sh's TIMED_ALGOS=1
        runs.insert(1, ("picotrain 124M, precision.matmul_algos=timed", p124_timed))
    if p124_graphs:  # gpu_bench.sh's GRAPHS=1
        runs.insert(1, ("picotrain 124M, run.cuda_graphs=true", p124_graphs))
    if pl1_graphs:
        runs.append(("picotrain Llama 1B, run.cuda_graphs=true", pl1_graphs))
    if p124_sm90bwd:  # gpu_bench.sh's HOPPER_BWD=1
        runs.insert(1, ("picotrain 124M, PICOTRAIN_FLASH_BACKWARD=auto", p124_sm90bwd))
    if pl1_sm90bwd:
        runs.append(("picotrain Llama 1B, PICOTRAIN_FLASH_BACKWARD=auto", pl1_sm90bwd))
    if pmx:  # gpu_bench.sh's MOE=1
        runs.append(("picotrain small Mixtral (configs/mixtral-small.json)", pmx))
    for name, run in runs:
        if run:
            md.append("| %s | %d (from step %d) | %.0f | %.1f | %.1f | %.1f%% | %s -> %s | peak %s TFLOP/s; data %.1f ms/step |"
                      % (name, run["timed_steps"], run["first_timed_step"], run["tokens_per_s"], run["step_ms_mean"],
                         run["tflops"], 100 * run["mfu"], fmt(run["loss_first"], "%.3f"), fmt(run["loss_last"], "%.3f"),
                         fmt(run.get("peak_tflops"), "%.1f"), run["data_ms_mean"]))
        else:
            md.append("| %s | did not run or logged no step | | | | | | |" % name)
    for name, run in (("PyTorch 124M", t124), ("PyTorch 1.5B", t15)):
        if run:
            md.append("| %s | %d (after %d warm-up) | %.0f | %.1f | %.1f | %s | %s -> %s | torch %s, %s, %s, %s; peak %s |" % (
                name, run["timed_steps"], run["warmup_steps"], run["tokens_per_s"], run["step_ms_mean"] or 0,
                run["tflops"], fmt(run.get("mfu") and 100 * run["mfu"], "%.1f%%"), fmt(run["loss_first"], "%.3f"),
                fmt(run["loss_last"], "%.3f"), run["torch"], run["precision"], run["attention"],
                "compiled" if run["compiled"] else "eager", fmt(run.get("peak_tflops"), "%.1f")))
        elif name == "PyTorch 124M":
            md.append("| %s | did not run | | | | | | |" % name)
    md.append("")

    # ---- the script's steps
    try:
        steps = [line.rstrip("\n").split("\t") for line in open(path("steps.tsv")) if line.strip()]
        md += ["## Steps of gpu_bench.sh", "", "| step | status | s | detail |", "|---|---|---|---|"]
        md += ["| %s |" % " | ".join((s + ["", "", "", ""])[:4]) for s in steps]
        md.append("")
    except OSError:
        pass

    # ---- the raw results
    md += ["## Raw results", ""]
    for name, obj in (("picotrain 124M (aggregated from picotrain_124m.jsonl)", p124),
                      ("picotrain 124M with timed matmul algorithms (picotrain_124m_timed.jsonl)", p124_timed),
                      ("picotrain 1.5B (aggregated from picotrain_1.5b.jsonl)", p15),
                      ("picotrain Llama 1B (aggregated from picotrain_llama1b.jsonl)", pl1),
                      ("picotrain 1.5B in FP8 (picotrain_1.5b_fp8.jsonl)", p15_fp8),
                      ("picotrain Llama 1B in FP8 (picotrain_llama1b_fp8.jsonl)", pl1_fp8),
                      ("picotrain small Mixtral (picotrain_mixtral_small.jsonl)", pmx),
                      ("torch_124m.json", t124), ("torch_1.5b.json", t15), ("attention_sdpa.json", sdpa),
                      ("kernel_attention.json", ka), ("kernel_bench.json", kb)):
        if obj is not None:
            md += ["<details><summary>%s</summary>" % name, "", "```json", json.dumps(obj, indent=1), "```", "",
                   "</details>", ""]

    with open(path("bench_summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    # The targets table and the attention shapes on stdout, for the log of the device call.
    start = md.index("## Targets")
    end = md.index("", start + 2)
    print("\n".join(md[start:end] + [""] + attention_section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
