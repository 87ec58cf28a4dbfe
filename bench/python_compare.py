"""`feedline-bench --python-dataset`: feedline.DataLoader against torch's DataLoader on user
Python datasets, in one run (see peer_pydataset.py for the workloads).

For each workload: torch's DataLoader at each num_workers given (its best is the reference),
feedline.DataLoader with automatic settings, and feedline forced to each executor (thread,
process). Every contender runs in a process of its own; the process tree's memory (RSS and PSS
summed over the contender and its workers) is sampled from here every 50 ms. Images/s are taken
over the epochs after the first (steady state); the first epoch's time is shown as startup.

    /usr/bin/python3 bench/python_compare.py --data DIR [--json F] [--torch-workers 0,1,2,4]
                                             [--rounds 2]
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = {"pil": 1.0, "numpy": 1.5, "python": 1.0}  # feedline auto / best torch
MEMORY_TARGET = 0.6  # feedline's peak memory / torch's, on pil


def _children():
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
                ppid = int(data[data.rindex(b")") + 2:].split()[1])
                kids.setdefault(ppid, []).append(int(name))
            except (OSError, ValueError):
                pass
    return kids


def _tree(root):
    """`root` and its descendants' pids."""
    kids = _children()
    todo, pids = [root], []
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(kids.get(p, []))
    return pids


def _rss(pids):
    """RSS in bytes summed over `pids`, from /proc/<pid>/status (the kernel's counters: cheap,
    no walk of the page tables)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            pass
    return total


# Shared-memory objects (the kernel's shmem: memfds, POSIX and System V shared memory, shared
# anonymous mappings) by the path /proc shows for them.
_SHARED = ("/memfd:", "/dev/shm/", "/SYSV", "/dev/zero")


def _shared_objects(pid, objects):
    """Adds to `objects` ((device, inode) -> bytes allocated) each shared-memory object `pid`
    maps or holds open. False when one could not be measured."""
    found = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if (len(parts) == 6 and parts[1].endswith("s")
                        and parts[5].startswith(_SHARED)):
                    found[f"/proc/{pid}/map_files/{parts[0]}"] = None
        for fd in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith(_SHARED):
                    found[path] = None
            except OSError:
                pass  # closed meanwhile
        sizes = {}
        for path in found:
            st = os.stat(path)
            sizes[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    except OSError:
        return False
    objects.update(sizes)
    return True


def _pss(pids):
    """The memory of the processes `pids`, in bytes: their proportional set sizes (a page mapped
    by k of them counts 1/k in each), with each shared-memory object counted whole, once, by the
    pages it holds, whether it is mapped or only held open (torch's DataLoader passes each batch
    from a worker as a shared-memory file that no process may map until the loop takes it, and a
    loop that only reads part of a batch maps only that part: Pss alone misses the rest).
    Where an object cannot be measured (another user's process), its mapped share stands in."""
    total, objects = 0, {}
    for p in pids:
        fields = {}
        try:
            with open(f"/proc/{p}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith((b"Pss:", b"Pss_Shmem:")):
                        fields[line.split(b":")[0]] = int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
        total += fields.get(b"Pss", 0)
        if _shared_objects(p, objects):
            total -= fields.get(b"Pss_Shmem", 0)
    return total + sum(objects.values())


def run_sampled(cmd, env):
    """Runs `cmd` to its end, sampling its process tree's memory meanwhile: (the finished
    Popen, stdout, stderr, peak {"rss", "pss", "processes"})."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    peak = {"rss": 0, "pss": 0, "processes": 0}
    done = threading.Event()

    def sample():
        # The RSS sum every 50 ms; the process list every 0.5 s (it changes rarely; scanning
        # /proc is not free); PSS (_pss) when the RSS sum reaches a new peak, at most twice a
        # second, as feedline-bench's own sampler (bench/process_tree.h) does, and every 2 s.
        # Reading smaps_rollup every 50 ms walked the page tables of the contender under its
        # mmap lock: a measurement that slowed what it measured, a multithreaded process most.
        pids, listed, pss_at = [proc.pid], 0.0, 0.0
        while not done.wait(0.05):
            now = time.monotonic()
            if now - listed >= 0.5:
                pids, listed = _tree(proc.pid), now
                peak["processes"] = max(peak["processes"], len(pids))
            rss = _rss(pids)
            # Also every 2 s: shared memory that no process maps is in no RSS.
            if (rss > peak["rss"] and now - pss_at >= 0.5) or now - pss_at >= 2.0:
                peak["pss"], pss_at = max(peak["pss"], _pss(pids)), now
            peak["rss"] = max(peak["rss"], rss)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    return proc, out, err, peak


def run(args, extra, name):
    cmd = [sys.executable, os.path.join(HERE, "peer_pydataset.py"), "--data", args.data,
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)] + extra
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [HERE, env.get("PYTHONPATH", "")] if p)
    proc, out, err, peak = run_sampled(cmd, env)
    if proc.returncode != 0:
        sys.stderr.write(err)
        raise SystemExit(f"python-dataset: {name} failed ({' '.join(cmd)})")
    epochs, info = [], {}
    for line in out.splitlines():
        words = line.split()
        if not words:
            continue
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if words[0] == "epoch":
            epochs.append({k: float(v) for k, v in fields.items()})
        elif words[0] == "info":
            info.update(fields)
    steady = epochs[1:] or epochs
    images = sum(e["images"] for e in steady)
    seconds = sum(e["seconds"] for e in steady)
    cpu = sum(e["cpu_seconds"] for e in steady)
    r = {"name": name, "images_per_s": images / seconds, "cpu_ms_per_image": 1e3 * cpu / images,
         "first_epoch_s": epochs[0]["seconds"], "peak_rss_bytes": peak["rss"],
         "peak_pss_bytes": peak["pss"], "processes": peak["processes"], "info": info}
    if not args.quiet:
        _show(r)
    return r


def _show(r):
    print(f"    {r['name']:44s} {r['images_per_s']:9.1f} /s  {r['cpu_ms_per_image']:7.3f} ms CPU"
          f"  first epoch {r['first_epoch_s']:6.2f} s  peak PSS {r['peak_pss_bytes'] / 2**20:7.1f}"
          f" MiB (RSS {r['peak_rss_bytes'] / 2**20:.1f}, {r['processes']} proc)", flush=True)


def _mean_of(runs):
    """One contender over the rounds: mean rates and times, the highest peaks."""
    n = len(runs)
    out = dict(runs[-1])
    for k in ("images_per_s", "cpu_ms_per_image", "first_epoch_s"):
        out[k] = sum(r[k] for r in runs) / n
    for k in ("peak_rss_bytes", "peak_pss_bytes", "processes"):
        out[k] = max(r[k] for r in runs)
    out["rounds"] = [{k: r[k] for k in ("images_per_s", "cpu_ms_per_image")} for r in runs]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder directory (the bundled set)")
    p.add_argument("--workloads", default="pil,numpy,python")
    p.add_argument("--torch-workers", default="0,1,2,4")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2,
                   help="runs of every contender, interleaved; figures are their means")
    p.add_argument("--json", default="")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    results = {"mode": "python_dataset", "cores": len(os.sched_getaffinity(0)),
               "epochs": args.epochs, "batch_size": args.batch_size, "workloads": {}}
    verdicts = []
    for w in args.workloads.split(","):
        if not args.quiet:
            print(f"  workload {w}:", flush=True)
        base = ["--workload", w]
        contenders = [(base + ["--loader", "torch", "--workers", str(n)],
                       f"torch DataLoader (num_workers={n})")
                      for n in map(int, args.torch_workers.split(","))]
        contenders.append((base + ["--loader", "feedline"], "feedline.DataLoader (automatic)"))
        contenders += [(base + ["--loader", "feedline", "--executor", e],
                        f"feedline.DataLoader (executor={e})") for e in ("thread", "process")]
        # Rounds interleave the contenders (a machine that drifts, or a contender that leaves
        # the page cache or memory in another state, biases whoever runs next); each figure is
        # the mean over the rounds.
        rounds = {name: [] for _, name in contenders}
        for k in range(args.rounds):
            if not args.quiet and args.rounds > 1:
                print(f"   round {k + 1} of {args.rounds}", flush=True)
            for extra, name in contenders:
                rounds[name].append(run(args, extra, name))
        merged = {name: _mean_of(runs) for name, runs in rounds.items()}
        if not args.quiet and args.rounds > 1:
            print("   means over the rounds:")
            for _, name in contenders:
                _show(merged[name])
        torch_runs = [merged[name] for extra, name in contenders if "torch" in extra]
        best = max(torch_runs, key=lambda r: r["images_per_s"])
        auto = merged["feedline.DataLoader (automatic)"]
        forced = [merged[f"feedline.DataLoader (executor={e})"] for e in ("thread", "process")]
        better = max(forced, key=lambda r: r["images_per_s"])
        speed = auto["images_per_s"] / best["images_per_s"]
        vs_forced = auto["images_per_s"] / better["images_per_s"]
        # Memory as --compare-torch counts it: the RSS summed over the process tree (PSS, which
        # splits the pages forked workers share with their parent, is shown beside it).
        mem = auto["peak_rss_bytes"] / max(best["peak_rss_bytes"], 1)
        mem_pss = auto["peak_pss_bytes"] / max(best["peak_pss_bytes"], 1)
        chosen = auto["info"].get("executor", "?")
        reason = auto["info"].get("reason", "").replace("_", " ")
        lines = [f"  {w}: feedline automatic / best torch ({best['name']}): {speed:.2f}x "
                 f"(target >= {TARGETS[w]}x)",
                 f"  {w}: automatic / better forced executor ({better['name']}): "
                 f"{vs_forced:.2f}x (target >= 0.9x); chose {chosen}: {reason}",
                 f"  {w}: peak memory (RSS of the process tree) feedline / best torch: "
                 f"{mem:.2f}x" + (f" (target <= {MEMORY_TARGET}x)" if w == "pil" else "")
                 + f"; PSS {mem_pss:.2f}x"]
        verdicts += lines
        results["workloads"][w] = {
            "torch": torch_runs, "feedline_auto": auto, "feedline_forced": forced,
            "speed_vs_best_torch": speed, "speed_target": TARGETS[w],
            "auto_vs_better_forced": vs_forced, "memory_vs_best_torch": mem,
            "pss_vs_best_torch": mem_pss,
            "executor_chosen": chosen, "executor_reason": reason}
    print("\n".join(verdicts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
