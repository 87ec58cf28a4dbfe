"""feedline from Python, for feedline-bench --compare-torch: feedline.ImageLoader with its
defaults (workers, prefetch, io depth and memory budget "auto"), consumed by a plain
`for images, labels in loader` loop, as a training script would.

    PYTHONPATH=build/python /usr/bin/python3 bench/feedline_py.py --data DIR --epochs 3

Prints `info ...` and one `epoch ...` line per epoch (see bench_proc.py).
"""

import argparse
import sys

import bench_proc


def count_or_auto(text):
    return text if text == "auto" else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="ImageFolder directory or list file")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=count_or_auto, default="auto")
    parser.add_argument("--prefetch", type=count_or_auto, default="auto")
    parser.add_argument("--io-depth", type=count_or_auto, default="auto")
    args = parser.parse_args()

    import torch  # noqa: F401  (the consumer's torch: batches arrive as torch tensors)
    import feedline

    loader = feedline.ImageLoader(args.data, batch_size=args.batch_size, seed=args.seed,
                                  workers=args.workers, prefetch=args.prefetch,
                                  io_depth=args.io_depth)
    bench_proc.report("info", contender="feedline-python", feedline=feedline.__version__,
                      images=len(loader.samples), batches=len(loader))
    bench_proc.run_epochs(loader, args.epochs, "feedline from Python")
    stats = loader.stats()
    bench_proc.report("info", workers=stats["workers"], prefetch=stats["prefetch"],
                      io_depth=stats["io_depth"], bottleneck=stats["bottleneck"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
