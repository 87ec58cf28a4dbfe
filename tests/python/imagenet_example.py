"""The data path of pytorch/examples' imagenet/main.py, for the DataLoader swap test.

pytorch/examples is not reachable from this machine (no network), so this script re-creates
the parts of its main.py that touch data, call for call: ImageFolder train/val with its
transforms (or FakeData for --dummy), DistributedSampler(train) and DistributedSampler(val,
shuffle=False, drop_last=True) when distributed, its two DataLoader calls (the ones a user
renames: `--loader feedline` makes them feedline.DataLoader), train_sampler.set_epoch, the
ProgressMeter's len(train_loader), and validate()'s tail: when len(val_loader.sampler) *
world_size < len(val_loader.dataset), an aux_val_loader (torch's DataLoader, as in main.py)
over a Subset of val_loader.dataset. The model is a small conv net (CPU).

Prints one `result` line per rank: batches and samples seen, and the validation accuracy.

    python3 imagenet_example.py DATA --loader feedline [--world-size 2] [--dummy]
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torch.utils.data import Subset


def main_worker(rank, args):
    if args.world_size > 1:
        dist.init_process_group(backend="gloo", init_method=args.dist_url,
                                world_size=args.world_size, rank=rank)
    torch.manual_seed(args.seed)
    if args.loader == "feedline":
        import feedline
        DataLoader = feedline.DataLoader
    else:
        DataLoader = torch.utils.data.DataLoader
    model = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, args.classes))
    if args.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)

    if args.dummy:
        train_dataset = datasets.FakeData(96, (3, 224, 224), args.classes, transforms.ToTensor())
        val_dataset = datasets.FakeData(37, (3, 224, 224), args.classes, transforms.ToTensor())
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), normalize]))
        val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
            transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
            normalize]))
    distributed = args.world_size > 1
    if distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False,
                                                                      drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    # The two calls a user renames.
    train_loader = DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    val_loader = DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    train_batches = train_samples = 0
    for epoch in range(args.epochs):
        if distributed:
            train_sampler.set_epoch(epoch)
        model.train()
        assert len(train_loader) > 0
        for i, (images, target) in enumerate(train_loader):
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_batches += 1
            train_samples += images.shape[0]

        # validate(): its progress meter's length and its aux loader for the remainder
        correct = torch.zeros(2)

        def run_validate(loader, base_progress=0):
            with torch.no_grad():
                for i, (images, target) in enumerate(loader):
                    i = base_progress + i
                    pred = model(images).argmax(1)
                    correct[0] += (pred == target).sum()
                    correct[1] += images.shape[0]

        meter_len = len(val_loader) + (distributed and (
            len(val_loader.sampler) * args.world_size < len(val_loader.dataset)))
        model.eval()
        run_validate(val_loader)
        if distributed:
            dist.all_reduce(correct)
        if distributed and (len(val_loader.sampler) * args.world_size < len(val_loader.dataset)):
            aux_val_dataset = Subset(val_loader.dataset,
                                     range(len(val_loader.sampler) * args.world_size,
                                           len(val_loader.dataset)))
            aux_val_loader = torch.utils.data.DataLoader(
                aux_val_dataset, batch_size=args.batch_size, shuffle=False,
                num_workers=args.workers, pin_memory=True)
            run_validate(aux_val_loader, len(val_loader))
    print(f"result rank={rank} train_batches={train_batches} train_samples={train_samples} "
          f"val_samples={int(correct[1])} meter_len={int(meter_len)} "
          f"executor={getattr(train_loader, 'executor', 'torch')}", flush=True)
    if distributed:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--loader", choices=["torch", "feedline"], default="torch")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dummy", action="store_true")
    p.add_argument("--dist-url", default="tcp://127.0.0.1:29517")
    args = p.parse_args()
    if args.world_size > 1:
        mp.spawn(main_worker, nprocs=args.world_size, args=(args,))
    else:
        main_worker(0, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
