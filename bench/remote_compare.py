"""Remote storage against local files, in one run: the bundled ImageFolder read from disk, and
the same files served by nginx on loopback (Debian's nginx-light) and read over HTTP, as they
are and with 20 ms added to every request by the server (tests/servers/nginx.py: a delay before
each answer, as a remote object store has it); then WebDataset shards of the same images, read
locally, and over HTTP with the latency both ways the shard cache can read them (whole shards
downloaded once into the cache, or a range request per sample from the shard's catalog: cache
budget 0). All with automatic settings. Prints images/s of each, the ratios, and the remote
run's request figures and settings (the autotuner raises the I/O depth to cover the latency).

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


def make_shards(samples, out_dir, count):
    """WebDataset shards (key.jpg + key.cls) of the samples, in their order, `count` shards."""
    import io
    import tarfile
    os.makedirs(out_dir, exist_ok=True)
    per = (len(samples) + count - 1) // count
    for k in range(count):
        with tarfile.open(os.path.join(out_dir, f"train-{k:03d}.tar"), "w") as tar:
            for j in range(k * per, min(len(samples), (k + 1) * per)):
                path, label = samples[j]
                with open(path, "rb") as f:
                    data = f.read()
                for name, blob in ((f"{j:06d}.jpg", data), (f"{j:06d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
    return os.path.join(out_dir, "train-{000..%03d}.tar" % (count - 1))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?",
                        default=os.path.join(here, "..", "build", "bench", "data",
                                             "imagenet-like-v1"))
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--shards", type=int, default=8, help="shards of the set (0: skip them)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds over all contenders, in alternating order; means reported")
    args = parser.parse_args()
    root = os.path.abspath(args.data)
    work = tempfile.mkdtemp(prefix="feedline-remote-")
    bs = args.batch_size
    local = feedline.ImageLoader(root, batch_size=bs)
    www = os.path.join(work, "www")  # data/ (the folder) and shards/ (tar shards of it)
    os.makedirs(www)
    os.symlink(root, os.path.join(www, "data"))
    pattern = make_shards(local.samples, os.path.join(www, "shards"), args.shards) \
        if args.shards > 0 else None
    saved_env = {k: os.environ.get(k) for k in ("FEEDLINE_CACHE_DIR", "FEEDLINE_SHARD_CACHE_BYTES")}
    try:
        with nginx.serve(www, os.path.join(work, "plain"), file_cache=True) as (base, master), \
                nginx.serve(www, os.path.join(work, "slow"), latency_ms=args.latency_ms,
                            file_cache=True) as (slow_base, slow_master):
            lists = {}
            for name, url in (("plain", base), ("slow", slow_base)):
                lists[name] = os.path.join(work, f"{name}-urls.txt")
                with open(lists[name], "w") as f:
                    for path, label in local.samples:
                        f.write(f"{url}/data/{os.path.relpath(path, root)} {label}\n")
            pids = _nginx_pids(master) + _nginx_pids(slow_master)
            # The contenders: (name, loader, server pids, cache folder, extra text).
            contenders = [("local files", local, (), None, ""),
                          ("HTTP (nginx on the same cores)",
                           feedline.ImageLoader(lists["plain"], batch_size=bs), pids, None, ""),
                          (f"HTTP + {args.latency_ms:g} ms per request",
                           feedline.ImageLoader(lists["slow"], batch_size=bs), pids, None, "")]
            if pattern is not None:
                contenders.append(("local shards", feedline.ImageLoader(pattern, batch_size=bs),
                                   (), None, ""))
                url = slow_base + "/shards/" + os.path.basename(pattern)
                for label, budget in (("whole shards cached", None), ("range reads", "0")):
                    cache = os.path.join(work, f"cache-{budget}")
                    os.environ["FEEDLINE_CACHE_DIR"] = cache
                    if budget is None:
                        os.environ.pop("FEEDLINE_SHARD_CACHE_BYTES", None)
                    else:
                        os.environ["FEEDLINE_SHARD_CACHE_BYTES"] = budget
                    t0 = time.perf_counter()
                    loader = feedline.ImageLoader(url, batch_size=bs)
                    opened = time.perf_counter() - t0
                    contenders.append((f"shards + {args.latency_ms:g} ms, {label}", loader, pids,
                                       cache, f"; opened in {opened:.1f} s (download + catalog)"))
            # Rounds in alternating order (forward, backward, ...): a machine that speeds up or
            # slows down during the run weighs on every contender alike.
            totals = {name: [0.0, 0.0] for name, *_ in contenders}
            for k in range(args.rounds):
                for name, loader, server, cache, _ in (contenders if k % 2 == 0
                                                       else contenders[::-1]):
                    if cache is not None:
                        os.environ["FEEDLINE_CACHE_DIR"] = cache
                    r, c = rate(loader, args.epochs, server)
                    totals[name][0] += r / args.rounds
                    totals[name][1] += c / args.rounds
            rows = [(name, totals[name][0], totals[name][1], loader, extra)
                    for name, loader, _, _, extra in contenders]
            s = contenders[2][1].stats()
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(work, ignore_errors=True)
    rem = s["remote"]
    print(f"{len(local.samples)} images, batch {bs}, {args.epochs} epochs per round (figures "
          f"over epochs 2..{args.epochs}, mean of {args.rounds} rounds), {os.cpu_count()} cores, nginx on the same cores (CPU per "
          f"image includes nginx's)")
    for name, r, c, loader, extra in rows:
        print(f"  {name:<42} {r:8.1f} images/s  {r / rows[0][1]:.2f}x local  {c:.2f} ms CPU/image"
              f"  (workers {loader.workers}, io_depth {loader.io_depth}){extra}")
    print(f"  HTTP + {args.latency_ms:g} ms / local: {rows[2][1] / rows[0][1]:.2f}x; / HTTP alone: "
          f"{rows[2][1] / rows[1][1]:.2f}x (the latency's own cost); {rem['requests']} requests, "
          f"{rem['retries']} retried, {rem['request_ms']:.1f} ms each, "
          f"{rem['bytes'] / 1e6:.0f} MB; verdict: {s['bottleneck']} ({s['bottleneck_reason']})")


if __name__ == "__main__":
    main()
