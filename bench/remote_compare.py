"""Remote storage against local files, in one run: the bundled ImageFolder read from disk, and
the same files served by nginx on loopback (Debian's nginx-light) and read over HTTP, as they
are and with 20 ms added to every request by the server (tests/servers/nginx.py: a delay before
each answer, as a remote object store has it), all with automatic settings. Prints images/s of each, the ratio, and the remote run's
request figures and settings (the autotuner raises the I/O depth to cover the latency).

    PYTHONPATH=build/python /usr/bin/python3 bench/remote_compare.py [DATA_DIR] [--latency-ms 20]

DATA_DIR defaults to build/bench/data/imagenet-like-v1 (made by build/bench/feedline-bench).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import feedline

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "servers"))
import nginx  # noqa: E402  (tests/servers/nginx.py: the test suite's nginx on loopback)


def _cpu_s(pids):
    """CPU seconds of this process and of `pids` (nginx's), from /proc."""
    total = time.process_time()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def rate(loader, epochs, pids=()):
    """(images/s, CPU ms per image: ours + the server's) over the epochs after the first
    (warm-up: page cache, the tuner's moves)."""
    n, t, cpu = 0, 0.0, 0.0
    for e in range(epochs):
        t0, c0, k = time.perf_counter(), _cpu_s(pids), 0
        for x, _ in loader:
            k += x.shape[0]
        if e > 0:
            n, t, cpu = n + k, t + time.perf_counter() - t0, cpu + _cpu_s(pids) - c0
    return n / t, 1e3 * cpu / n


def _nginx_pids(master):
    pids = [master]
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == master:
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?",
                        default=os.path.join(here, "..", "build", "bench", "data",
                                             "imagenet-like-v1"))
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    root = os.path.abspath(args.data)
    work = tempfile.mkdtemp(prefix="feedline-remote-")
    local = feedline.ImageLoader(root, batch_size=args.batch_size)
    lst = os.path.join(work, "urls.txt")
    slow_lst = os.path.join(work, "slow-urls.txt")
    try:
        with nginx.serve(root, os.path.join(work, "plain")) as (base, master), \
                nginx.serve(root, os.path.join(work, "slow"), latency_ms=args.latency_ms) as (
                    slow_base, slow_master):
            for name, url in ((lst, base), (slow_lst, slow_base)):
                with open(name, "w") as f:
                    for path, label in local.samples:
                        f.write(f"{url}/{os.path.relpath(path, root)} {label}\n")
            pids = _nginx_pids(master) + _nginx_pids(slow_master)
            local_rate, local_cpu = rate(local, args.epochs)
            plain = feedline.ImageLoader(lst, batch_size=args.batch_size)
            plain_rate, plain_cpu = rate(plain, args.epochs, pids)
            remote = feedline.ImageLoader(slow_lst, batch_size=args.batch_size)
            remote_rate, remote_cpu = rate(remote, args.epochs, pids)
            s = remote.stats()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r = s["remote"]
    print(f"{len(local.samples)} images, batch {args.batch_size}, {args.epochs} epochs each "
          f"(figures over epochs 2..{args.epochs}), {os.cpu_count()} cores")
    print(f"  local files                      {local_rate:8.1f} images/s, {local_cpu:.2f} ms CPU/image "
          f"(workers {local.workers}, io_depth {local.io_depth})")
    print(f"  HTTP (nginx on the same cores)   {plain_rate:8.1f} images/s, {plain_cpu:.2f} ms CPU/image "
          f"with nginx's (workers {plain.workers}, io_depth {plain.io_depth})")
    print(f"  HTTP + {args.latency_ms:g} ms per request        {remote_rate:8.1f} images/s, "
          f"{remote_cpu:.2f} ms CPU/image with nginx's "
          f"(workers {remote.workers}, io_depth {remote.io_depth})")
    print(f"  HTTP + {args.latency_ms:g} ms / local: {remote_rate / local_rate:.2f}x; / HTTP alone: "
          f"{remote_rate / plain_rate:.2f}x (the latency's own cost); {r['requests']} requests, "
          f"{r['retries']} retried, {r['request_ms']:.1f} ms each, "
          f"{r['bytes'] / 1e6:.0f} MB; verdict: {s['bottleneck']} ({s['bottleneck_reason']})")


if __name__ == "__main__":
    main()
