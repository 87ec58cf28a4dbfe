"""The peer of feedline-bench --compare-text: what users run today for text.

torch.utils.data.DataLoader over a map-style data set of the corpus's documents, tokenized by
Python sentencepiece in the workers (truncated to 2048 ids), with a collate that pads each batch
to its longest; shuffled, persistent workers. One worker count per process (feedline-bench runs
it once per count and keeps the best).

    /usr/bin/python3 bench/peer_text.py --corpus corpus.txt --model m.model --workers 2

Prints `info ...` and one `epoch ... tokens=N ...` line per epoch (see bench_proc.py).
"""

import argparse
import sys
import time

import bench_proc


def torch_loader(corpus, model, batch_size, workers):
    """torch's DataLoader over the corpus's documents, tokenized in its workers; batches are
    {"input_ids": [B, longest] padded, "lengths": [B]}. Also bench/e2e_compare.py's text peer."""
    import sentencepiece
    import torch

    with open(corpus, encoding="utf-8") as f:
        docs = [line.rstrip("\n") for line in f if line.strip()]
    pad = max(sentencepiece.SentencePieceProcessor(model_file=model).pad_id(), 0)

    class Documents(torch.utils.data.Dataset):
        sp = None

        def __len__(self):
            return len(docs)

        def __getitem__(self, i):
            if self.sp is None:  # one processor per worker process
                self.sp = sentencepiece.SentencePieceProcessor(model_file=model)
            return torch.tensor(self.sp.encode(docs[i])[:2048])

    def collate(xs):
        out = torch.full((len(xs), max(len(x) for x in xs)), pad, dtype=torch.long)
        for i, x in enumerate(xs):
            out[i, :len(x)] = x
        return {"input_ids": out, "lengths": torch.tensor([len(x) for x in xs])}

    return torch.utils.data.DataLoader(Documents(), batch_size=batch_size, shuffle=True,
                                       num_workers=workers, collate_fn=collate,
                                       persistent_workers=workers > 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="one document per line")
    parser.add_argument("--model", required=True, help="SentencePiece model")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers: persistent_workers needs at least one worker")

    import torch

    torch.manual_seed(args.seed)
    loader = torch_loader(args.corpus, args.model, args.batch_size, args.workers)
    bench_proc.report("info", contender="torch", torch=torch.__version__, workers=args.workers,
                      documents=len(loader.dataset))
    for e in range(args.epochs):
        cpu0 = bench_proc.tree_cpu_seconds()
        t0 = time.perf_counter()
        n = tokens = slots = 0
        for batch in loader:
            ids, lengths = batch["input_ids"], batch["lengths"]
            n += int(ids.shape[0])
            tokens += int(lengths.sum())
            slots += ids.numel()
        t1 = time.perf_counter()
        bench_proc.report("epoch", index=e, images=n, tokens=tokens, slots=slots, seconds=t1 - t0,
                          cpu_seconds=bench_proc.tree_cpu_seconds() - cpu0)
        print(f"torch DataLoader ({args.workers} workers): epoch {e}: "
              f"{tokens / (t1 - t0) / 1e6:.2f} M tokens/s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
