"""Text loaders compared in one run (until feedline-bench has text workloads): feedline's
TextLoader and TokenLoader against torch's DataLoader with Python sentencepiece in workers and
a padding collate (1 and 2 workers), the single-thread tokenizer limit, and the nanoGPT-style
numpy memmap loop for token files. Corpus: 20k long-tailed documents (tests/python/test_text.py's
generator), a SentencePiece model trained here with spm_train; 50M random tokens.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/text_compare.py [WORKDIR]
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import sentencepiece
import torch

import feedline

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from test_text import _documents  # noqa: E402


def rate(loader, epochs, count):
    for _ in range(epochs):
        t, n = time.perf_counter(), 0
        for b in loader:
            n += count(b)
        dt = time.perf_counter() - t
    return n / dt  # the last epoch's


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="feedline-text-")
    docs = _documents(20000, seed=1)
    txt, prefix = os.path.join(work, "corpus.txt"), os.path.join(work, "m")
    with open(txt, "w", encoding="utf-8") as f:
        f.write("\n".join(docs) + "\n")
    subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={prefix}",
                    "--vocab_size=2000", "--hard_vocab_limit=false", "--pad_id=3",
                    "--character_coverage=1.0", "--minloglevel=2"], check=True,
                   capture_output=True)
    model = prefix + ".model"
    res = {}
    ld = feedline.TextLoader(txt, tokenizer=model, batch_size=32, max_length=2048)
    res["feedline TextLoader"] = rate(ld, 3, lambda b: int(b["lengths"].sum()))

    class Docs(torch.utils.data.Dataset):
        sp = None

        def __len__(self):
            return len(docs)

        def __getitem__(self, i):
            if self.sp is None:
                self.sp = sentencepiece.SentencePieceProcessor(model_file=model)
            return torch.tensor(self.sp.encode(docs[i])[:2048])

    def collate(xs):
        out = torch.full((len(xs), max(len(x) for x in xs)), 3, dtype=torch.long)
        for i, x in enumerate(xs):
            out[i, :len(x)] = x
        return out, torch.tensor([len(x) for x in xs])

    for w in (1, 2):
        dl = torch.utils.data.DataLoader(Docs(), batch_size=32, shuffle=True, num_workers=w,
                                         collate_fn=collate, persistent_workers=True)
        res[f"torch DataLoader, {w} worker(s)"] = rate(dl, 2, lambda b: int(b[1].sum()))
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    t = time.perf_counter()
    n = sum(len(sp.encode(d)) for d in docs)
    res["tokenizer limit, 1 thread"] = n / (time.perf_counter() - t)

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
