"""Offload on one machine: a trainer whose node has run out of cores, helped by a Dask worker.

The trainer's process is pinned to one core (os.sched_setaffinity: a node whose CPUs are all
taken), and one Dask worker process, started with the `dask` command-line tools the way a
cluster's are, is pinned to the other core (the remote CPU pool). Contenders, interleaved round
by round, each an epoch of ImageLoader(train transform) on the bundled images, or with
--workload pil of feedline.DataLoader over a torchvision ImageFolder (PIL decodes,
RandomResizedCrop(224), flip: the dataset itself goes to the worker):

  local   the loader alone on the trainer's core;
  hybrid  the same loader with offload=<the scheduler>: the worker makes part of each epoch;
  remote  (for the data plane's cost) every batch from the worker: the trainer's CPU per
          received batch, against its CPU per batch made locally.

Run by `feedline-bench --offload` (or directly: offload_compare.py DATA [--rounds N]).
Prints a table and, with --json, writes the figures.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_cluster(core):
    """A scheduler and one single-threaded worker on 127.0.0.1, pinned to `core`, started as a
    cluster's are (`dask scheduler`, `dask worker`); returns (address, processes)."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    pin = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    py = sys.executable
    scheduler = subprocess.Popen(
        pin + [py, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
               str(port), "--no-dashboard", "--no-show"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen(
        pin + [py, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--nworkers",
               "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return address, [worker, scheduler]


def _make(workload, data, batch_size, offload=None):
    import feedline
    if workload == "image":
        return feedline.ImageLoader(data, batch_size=batch_size, transform="train", seed=0,
                                    offload=offload)
    import torch
    import torchvision
    from torchvision import transforms
    t = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(data, transform=t)
    return feedline.DataLoader(ds, batch_size=batch_size, shuffle=True, offload=offload,
                               generator=torch.Generator().manual_seed(0))


def _cpu(loader):
    """CPU seconds of the trainer: this process's threads and a DataLoader's worker processes
    (their /proc stat, as they run: a child's own times reach os.times() only at its exit)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for proc in getattr(loader, "_procs", {}).values():
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return total


def _turn(loader, first_epoch, epochs):
    """Images/s over `epochs` consecutive epochs from `first_epoch`, and the trainer's CPU
    seconds per batch (every thread of this process and its worker processes: _cpu).
    The turn starts at an epoch no contender has begun: work a loader did for its next epoch
    while the others had their turns is dropped (set_epoch cancels it), and within the turn
    each epoch's head start counts as it would in training."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(first_epoch)
    t0, c0 = time.perf_counter(), _cpu(loader)
    n = batches = 0
    for _ in range(epochs):
        for images, _ in loader:
            n += images.shape[0]
            batches += 1
    rate, cpu = n / (time.perf_counter() - t0), (_cpu(loader) - c0) / batches
    # Its head start of the next epoch (and the cluster's) would run during the next turn,
    # another contender's: dropped now (set_epoch to an epoch other than the next; a
    # DataLoader's next order is drawn at iter(): its engine's head start is dropped).
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(first_epoch)
    elif loader._loader is not None:
        loader._loader.drop_ahead()
    return rate, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="an ImageFolder (feedline-bench's bundled set)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="consecutive epochs per turn")
    p.add_argument("--per-task", type=int, default=None,
                   help="batches per Dask task (default: the loader's own choice)")
    p.add_argument("--workload", choices=("image", "pil"), default="image")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("offload_compare: needs two cores (one for the trainer, one for the worker)")
    address, procs = _start_cluster(cores[1])
    os.sched_setaffinity(0, {cores[0]})  # before any thread of this process starts
    import distributed
    try:
        client = distributed.Client(address, timeout=30, set_as_default=False)
        client.wait_for_workers(1, timeout=60)
        local = _make(a.workload, a.data, a.batch_size)
        hybrid = _make(a.workload, a.data, a.batch_size, client)
        remote = _make(a.workload, a.data, a.batch_size, client)
        remote._offload.local = False  # every full batch from the worker
        if a.per_task is not None:
            hybrid._offload.batches_per_task = remote._offload.batches_per_task = a.per_task
        batches = len(local)
        for loader in (local, hybrid, remote):  # warm: threads, page cache, the worker's loader
            _turn(loader, 0, 1)
        rows = {"local": [], "hybrid": [], "remote": []}
        received = []  # the remote contender's CPU per batch and its local batches' share
        epoch = 1
        for r in range(a.rounds):
            order = [("local", local), ("hybrid", hybrid), ("remote", remote)]
            if r % 2:
                order.reverse()
            for name, loader in order:
                counts = dict(loader._offload.counts) if loader._offload else {}
                rows[name].append(_turn(loader, epoch, a.epochs))
                epoch += a.epochs
                if name == "remote":
                    c = loader._offload.counts
                    received.append((rows[name][-1][1], c["local"] + c["remade"] -
                                     counts.get("local", 0) - counts.get("remade", 0)))
        ratio = [h[0] / l[0] for h, l in zip(rows["hybrid"], rows["local"])]
        # What the two cores give apart (each contender in its own turn): the hybrid's ceiling.
        of_sum = [h[0] / (l[0] + r[0])
                  for h, l, r in zip(rows["hybrid"], rows["local"], rows["remote"])]
        cpu_local = sum(c for _, c in rows["local"]) / a.rounds  # per batch made here
        # The trainer's CPU per batch received: the remote contender's, less the batches it
        # made itself (an epoch's short last batch) at the local contender's cost.
        n = a.epochs * batches
        cpu_remote = sum((c * n - made * cpu_local) / (n - made)
                         for c, made in received) / a.rounds
        st = hybrid.stats()["offload"]
        out = {
            "workload": a.workload,
            "images": batches * a.batch_size,
            "batch_size": a.batch_size,
            "rounds": a.rounds,
            "epochs_per_turn": a.epochs,
            "batches_per_task": hybrid.stats()["offload"]["batches_per_lease"],
            "local_images_per_s": [round(x, 1) for x, _ in rows["local"]],
            "hybrid_images_per_s": [round(x, 1) for x, _ in rows["hybrid"]],
            "remote_images_per_s": [round(x, 1) for x, _ in rows["remote"]],
            "hybrid_over_local": [round(x, 3) for x in ratio],
            "hybrid_over_local_plus_remote": [round(x, 3) for x in of_sum],
            "trainer_cpu_ms_per_batch_local": round(1e3 * cpu_local, 2),
            "trainer_cpu_ms_per_batch_received": round(1e3 * cpu_remote, 2),
            "received_over_local_cpu": round(cpu_remote / cpu_local, 3),
            "hybrid_remote_fraction": round(st["remote_fraction"], 3),
            "remote_latency_ms": round(st["remote_latency_ms"], 1),
        }
        print(f"offload on one machine: trainer on core {cores[0]}, one Dask worker on core "
              f"{cores[1]}, {out['images']} images, batch {a.batch_size}, {a.workload} train transform, "
              f"{a.epochs} epochs a turn, "
              f"{out['batches_per_task']} batches a task")
        for name in ("local", "hybrid", "remote"):
            print(f"  {name:7s} " + "  ".join(f"{x:7.1f}" for x, _ in rows[name]) + " img/s")
        print(f"  hybrid / local, per round: " + "  ".join(f"{x:.2f}x" for x in ratio)
              + f"  (remote share {st['remote_fraction']:.2f})")
        print(f"  hybrid / (local + remote), per round: " + "  ".join(f"{x:.2f}x" for x in of_sum))
        print(f"  trainer CPU per batch: {out['trainer_cpu_ms_per_batch_local']} ms made here, "
              f"{out['trainer_cpu_ms_per_batch_received']} ms received "
              f"({100 * out['received_over_local_cpu']:.1f}%)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        client.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
