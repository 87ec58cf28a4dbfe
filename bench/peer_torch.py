"""The peer of feedline-bench --compare-torch: what users run today.

torch.utils.data.DataLoader over torchvision.datasets.ImageFolder with the standard training
transform (RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor: uint8 CHW, as feedline
delivers), shuffled, persistent workers. One worker count per process, so that each trial's peak
memory is its own; feedline-bench runs it once per count it tries and keeps the best.

    /usr/bin/python3 bench/peer_torch.py --data DIR --workers 2 --epochs 3 --batch-size 256

Prints `info ...` and one `epoch ...` line per epoch (see bench_proc.py).
"""

import argparse
import sys

import bench_proc


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="ImageFolder directory")
    parser.add_argument("--workers", type=int, required=True, help="DataLoader num_workers (>= 1)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers: persistent_workers needs at least one worker")

    import torch
    import torchvision
    from torchvision import transforms

    torch.manual_seed(args.seed)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, persistent_workers=True)
    bench_proc.report("info", contender="torch", torch=torch.__version__,
                      torchvision=torchvision.__version__, workers=args.workers,
                      images=len(dataset), batches=len(loader))
    plural = "" if args.workers == 1 else "s"
    bench_proc.run_epochs(loader, args.epochs, f"torch DataLoader ({args.workers} worker{plural})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
