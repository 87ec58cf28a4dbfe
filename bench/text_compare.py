"""Token files compared in one run: feedline's TokenLoader against the nanoGPT-style numpy
memmap loop, on 50M random uint16 tokens. (The document workloads, tokenized and padded or
packed, are `feedline-bench --compare-text`.)

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/text_compare.py [WORKDIR]
"""
import os
import sys
import tempfile
import time

import numpy as np
import torch

import feedline


def rate(loader, epochs, count):
    for _ in range(epochs):
        t, n = time.perf_counter(), 0
        for b in loader:
            n += count(b)
        dt = time.perf_counter() - t
    return n / dt  # the last epoch's


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="feedline-text-")
    res = {}
    tok = os.path.join(work, "tokens.bin")
    np.random.default_rng(0).integers(0, 50257, 50_000_000).astype(np.uint16).tofile(tok)
    tl = feedline.TokenLoader(tok, seq_len=1024, batch_size=32)
    res["feedline TokenLoader (seq_len 1024)"] = rate(tl, 2, lambda b: b["input_ids"].numel())
    m = np.memmap(tok, dtype=np.uint16, mode="r")
    w = 1025
    perm = np.random.default_rng(0).permutation(len(m) // w)
    t, n = time.perf_counter(), 0
    for i in range(0, len(perm), 32):
        rows = np.stack([m[j * w:(j + 1) * w] for j in perm[i:i + 32]]).astype(np.int64)
        x = torch.from_numpy(rows[:, :-1])
        n += x.numel()
    res["numpy memmap loop (nanoGPT style)"] = n / (time.perf_counter() - t)
    for k, v in res.items():
        print(f"{k:40s} {v / 1e6:8.2f} M tokens/s")


if __name__ == "__main__":
    main()
