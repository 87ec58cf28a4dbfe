"""One contender of `feedline-bench --python-dataset`: a user's Python Dataset, loaded by torch's
DataLoader or by feedline.DataLoader, for a few epochs (one contender per process, so that its
peak memory is its own). Workloads:

  pil      torchvision ImageFolder with RandomResizedCrop(224) + RandomHorizontalFlip +
           PILToTensor (PIL decodes and resizes; torchvision's Python code holds the GIL between)
  numpy    a feature pipeline in numpy on 224x224x3 float32 arrays (its ufuncs release the GIL)
  python   pure-Python parsing of a text record per sample (holds the GIL throughout)

    /usr/bin/python3 bench/peer_pydataset.py --data DIR --workload pil --loader torch --workers 2
    /usr/bin/python3 bench/peer_pydataset.py --data DIR --workload pil --loader feedline

Prints `info ...` and `epoch ...` lines (see bench_proc.py).
"""

import argparse
import os
import sys

import bench_proc


def make_dataset(workload, data):
    import numpy as np
    import torch

    if workload == "pil":
        import torchvision
        from torchvision import transforms
        t = transforms.Compose([transforms.RandomResizedCrop(224),
                                transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
        return torchvision.datasets.ImageFolder(data, transform=t)

    class Numpy(torch.utils.data.Dataset):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.base = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(16)]
            self.mean = np.array([123.7, 116.3, 103.5], np.float32)
            self.std = np.array([58.4, 57.1, 57.4], np.float32)

        def __len__(self):
            return 2000

        def __getitem__(self, i):
            a = self.base[i % 16].astype(np.float32)
            a -= self.mean
            a /= self.std
            np.clip(a, -2.5, 2.5, out=a)
            return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))), i % 10

    class Python(torch.utils.data.Dataset):
        def __init__(self):
            self.lines = [",".join(f"{k}:{(k * 7919 + j) % 1000}" for k in range(300))
                          for j in range(64)]

        def __len__(self):
            return 16000

        def __getitem__(self, i):
            fields = dict(p.split(":") for p in self.lines[i % 64].split(","))
            v = [int(fields[str(k)]) for k in range(256)]
            return torch.tensor(v, dtype=torch.float32), i % 10

    return Numpy() if workload == "numpy" else Python()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--workload", choices=["pil", "numpy", "python"], required=True)
    p.add_argument("--loader", choices=["torch", "feedline"], required=True)
    p.add_argument("--workers", type=int, default=None, help="torch: num_workers")
    p.add_argument("--executor", default="auto", help="feedline: auto, thread or process")
    p.add_argument("--fixed-workers", default="auto", help="feedline: workers= (default auto)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.manual_seed(a.seed)
    ds = make_dataset(a.workload, a.data)
    if a.loader == "torch":
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                             num_workers=a.workers,
                                             persistent_workers=a.workers > 0)
        label = f"torch DataLoader ({a.workers} workers)"
    else:
        import feedline
        loader = feedline.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                     num_workers=a.workers, executor=a.executor,
                                     workers=a.fixed_workers if a.fixed_workers == "auto"
                                     else int(a.fixed_workers))
        label = f"feedline.DataLoader (executor {a.executor})"
    bench_proc.report("info", contender=a.loader, workload=a.workload, images=len(ds),
                      batches=len(loader))
    bench_proc.run_epochs(loader, a.epochs, label)
    if a.loader == "feedline":
        py = loader.stats()["python"]
        bench_proc.report("info", executor=py["executor"], reason=py["reason"],
                          workers=loader.stats().get("workers", 0),
                          gil_wait_s=py.get("gil_wait_s", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
