#!/usr/bin/env python3
"""Synthetic llm.c token shards for throughput benchmarks (no corpus needed on the GPU machine).

Token ids follow a Zipf-Mandelbrot law, p(id) ~ 1 / (id + 1 + 2.7), Mandelbrot's fit to English
word frequencies: the most frequent id is ~2.8% of the stream, about what GPT-2's most frequent
tokens are in English text. The distribution matters for speed: the embedding backward sums
the rows of repeated tokens, so uniform ids (no repeats) would flatter it, and a steeper law
(gpu_check.sh's Zipf 1.2: one id is 18% of the stream) would punish it.

Writes <out>/synthetic_train_000000.bin and <out>/synthetic_val_000000.bin in llm.c's format
(a 1024-byte header: magic 20240520, version 1, token count; then uint16 tokens), which
picotrain (data.train) and bench/torch_gpt2.py (--data) both read. Needs only torch.

    python3 bench/synthetic_shards.py OUT_DIR [--tokens 4000000]
"""
import argparse
import os
import struct
import sys

import torch


def write_shard(path, tokens):
    header = struct.pack("<3i", 20240520, 1, tokens.numel()) + bytes(1024 - 12)
    with open(path, "wb") as f:
        f.write(header)
        f.write(tokens.to(torch.int32).to(torch.int16).numpy().tobytes())  # low 16 bits = uint16 ids


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=4_000_000, help="train tokens (val: a tenth)")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)
    weights = 1.0 / (torch.arange(args.vocab, dtype=torch.float64) + 1 + 2.7)
    for split, n in (("train", args.tokens), ("val", max(args.tokens // 10, 2048))):
        tokens = torch.multinomial(weights, n, replacement=True, generator=gen)
        write_shard(os.path.join(args.out, "synthetic_%s_000000.bin" % split), tokens)
    print("synthetic_shards: %d train + %d val tokens in %s (top id %.1f%% of the stream)" % (
        args.tokens, max(args.tokens // 10, 2048), args.out, 100 * float(weights[0] / weights.sum())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
