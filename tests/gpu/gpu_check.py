"""GPU checks for feedline's CUDA path (run by tests/gpu/run.sh on a machine with a GPU).

Prints, and writes as JSON: copy + conversion correctness against the CPU path for every dtype and
layout, stream ordering with torch work on a side stream, device memory and RSS over many epochs,
host-to-device GB/s of feedline's copy stage against a plain pinned copy of the same size, the
fraction of copy time hidden behind a simulated training step, and images/s.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

import feedline


def make_dataset(root, classes=4, per_class=64, seed=0):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.integers(300, 640)), int(rng.integers(240, 480))
            base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)
            img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
            arr = np.asarray(img).astype(np.int16) + rng.integers(-20, 20, (h, w, 3))
            Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(
                os.path.join(root, f"c{c}", f"{i:04d}.jpg"), quality=90)
    return root


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def check_correctness(root, results):
    ok = True
    for dtype in ("uint8", "float32", "float16", "bfloat16"):
        for layout in ("NCHW", "NHWC"):
            kw = dict(batch_size=32, size=96, resize_size=110, seed=5, layout=layout, dtype=dtype)
            cpu = [x for x, _ in feedline.ImageLoader(root, **kw)]
            gpu = []
            for x, y in feedline.ImageLoader(root, device="cuda", **kw):
                assert x.is_cuda and y.is_cuda
                gpu.append(x.cpu())
            same = len(cpu) == len(gpu) and all(torch.equal(a, b) for a, b in zip(cpu, gpu))
            worst = max(float((a.float() - b.float()).abs().max()) for a, b in zip(cpu, gpu))
            results[f"equal_{dtype}_{layout}"] = same
            results[f"maxdiff_{dtype}_{layout}"] = worst
            print(f"correctness {dtype:8s} {layout}: identical={same} max|diff|={worst:g}")
            ok &= worst <= (0 if dtype in ("uint8", "float32") else 1e-2)
    return ok


def check_stream_ordering(root, results):
    """Batches consumed on a side stream while that stream is busy: the values must be those of
    the CPU path (the stream waited for the copy), and buffers must not be overwritten while
    queued work still reads them."""
    kw = dict(batch_size=32, size=96, seed=9, dtype="float32")
    want = [float(x.double().sum()) for x, _ in feedline.ImageLoader(root, **kw)]
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    sums = []
    with torch.cuda.stream(side):
        loader = feedline.ImageLoader(root, device="cuda", prefetch=2, **kw)
        for x, _ in loader:
            for _ in range(4):  # keep the stream busy before and after reading the batch
                big = big @ big.t() / 4096
            sums.append(x.double().sum())
            del x  # released while the sum may still be queued
    torch.cuda.synchronize()
    got = [float(s) for s in sums]
    ok = len(got) == len(want) and all(abs(a - b) <= 1e-6 * max(1, abs(b)) for a, b in zip(got, want))
    results["stream_ordering_ok"] = ok
    print(f"stream ordering on a busy side stream: {'ok' if ok else 'MISMATCH'}")
    return ok


def check_dlpack_streams(root, results):
    """__dlpack__ with every stream value DLPack allows: None and 1 (legacy default stream), 2
    (per-thread default), a stream pointer, -1 (no synchronisation: the consumer synchronises).
    Each read right away, on that stream, while a long kernel runs on another: the values must
    be the CPU path's."""
    kw = dict(batch_size=16, size=64, seed=5, shuffle=False)
    want = [x.clone() for x, _ in feedline.ImageLoader(root, **kw)]
    busy = torch.randn(4096, 4096, device="cuda")
    ok = True
    for name in ("None", "1", "2", "pointer", "-1"):
        loader = feedline.ImageLoader(root, device="cuda", prefetch=2, **kw)
        epoch = loader._loader.start_epoch()
        side = torch.cuda.Stream()
        bad = 0
        for b in range(min(6, len(want))):
            images, _, _, _ = epoch.next()
            with torch.cuda.stream(side):
                busy = busy @ busy.t() / 4096  # the copy stage must not wait for this
            stream = {"None": None, "1": 1, "2": 2, "-1": -1,
                      "pointer": torch.cuda.current_stream().cuda_stream}[name]
            t = torch.utils.dlpack.from_dlpack(images.__dlpack__(stream=stream))
            if name in ("-1", "2"):
                # -1: synchronising is our promise; 2: the per-thread stream waited, but torch
                # reads on its own current stream, so wait for the device before reading
                torch.cuda.synchronize()
            got = t.cpu()
            bad += int(not torch.equal(got, want[b]))
            del t, images
        epoch.cancel()
        results[f"dlpack_stream_{name}_ok"] = bad == 0
        print(f"__dlpack__(stream={name}): {'ok' if bad == 0 else f'{bad} batches WRONG'}")
        ok &= bad == 0
    # cuda:N beyond the machine: a DeviceError (never DataError), the current device untouched
    before = torch.cuda.current_device()
    try:
        feedline.ImageLoader(root, device=f"cuda:{torch.cuda.device_count()}", **kw)
        refused = False
    except feedline.DeviceError:
        refused = True
    same = torch.cuda.current_device() == before
    results["missing_device_refused"] = refused and same
    print(f"cuda:{torch.cuda.device_count()} refused with DeviceError: {refused}; "
          f"current device untouched: {same}")
    return ok and refused and same


def check_leaks(root, results, epochs=30):
    loader = feedline.ImageLoader(root, batch_size=64, size=128, device="cuda", dtype="float16")
    for _ in range(3):
        for x, _ in loader:
            pass
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    rss0 = rss()
    for _ in range(epochs):
        for x, _ in loader:
            pass
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    growth_dev = free0 - free1
    growth_rss = rss() - rss0
    results["leak_device_bytes"] = growth_dev
    results["leak_rss_bytes"] = growth_rss
    print(f"{epochs} epochs: device memory growth {growth_dev / 2**20:.1f} MiB, "
          f"RSS growth {growth_rss / 2**20:.1f} MiB")
    # Pinned slots go back to the ring when their copy is done, not when the batch dies: a
    # consumer holding every device batch of two epochs makes no new pinned slot after the
    # first few (cudaHostAlloc mid-training synchronises the device).
    held_loader = feedline.ImageLoader(root, batch_size=64, size=128, device="cuda", prefetch=2)
    held = [x for x, _ in held_loader]
    created = held_loader.stats()["slots_created"]
    held += [x for x, _ in held_loader]
    grown = held_loader.stats()["slots_created"] - created
    results["pinned_slots_created"] = created
    results["pinned_slots_created_while_held"] = grown
    print(f"pinned slots: {created} made in epoch 1, {grown} more in epoch 2 with "
          f"{len(held)} device batches held")
    del held
    return growth_dev < 64 * 2**20 and growth_rss < 64 * 2**20 and grown == 0 and created <= 6


def check_throughput(root, results):
    """Fails unless the copy is hidden behind the step (>= 90%) and the copy stage reaches
    >= 0.8x a plain pinned cudaMemcpyAsync of the same size."""
    measure(root, results)
    ok = results.get("copy_hidden_fraction", 0) >= 0.9 and results.get("feedline_vs_plain", 0) >= 0.8
    print(f"throughput targets (hidden >= 90%, H2D >= 0.8x plain): {'met' if ok else 'NOT met'}")
    return ok


def measure(root, results):
    bs, size = 256, 224
    batch_bytes = bs * 3 * size * size
    # Plain pinned copy of the same size (the reference).
    host = torch.empty(batch_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(batch_bytes, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dev.copy_(host, non_blocking=True)
    end.record()
    torch.cuda.synchronize()
    plain_gbs = 20 * batch_bytes / (start.elapsed_time(end) / 1e3) / 1e9

    # feedline: images/s, copy time, and the copy hidden behind a simulated training step.
    loader = feedline.ImageLoader(root, batch_size=bs, device="cuda", dtype="bfloat16")
    for _ in loader:  # warm up (slots, buffers, page cache)
        pass
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step(x):
        y = w
        for _ in range(6):
            y = y @ w
        return x.float().mean() + y.float().mean()

    t0 = time.perf_counter()
    n = 0
    for x, _ in loader:
        step(x)
        n += x.shape[0]
    torch.cuda.synchronize()
    t_loader = time.perf_counter() - t0
    s = loader.stats()
    const = torch.zeros(bs, 3, size, size, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    for _ in range(len(loader)):
        step(const)
    torch.cuda.synchronize()
    t_compute = time.perf_counter() - t0
    copy = s["stages"].get("copy", {})
    copy_s = copy.get("busy_s", 0.0)
    copy_batches = max(1, copy.get("items", 1))
    feedline_gbs = (copy_batches * batch_bytes / copy_s / 1e9) if copy_s > 0 else 0.0
    exposed = max(0.0, t_loader - t_compute)
    hidden = 1.0 - min(1.0, exposed / copy_s) if copy_s > 0 else 0.0
    results.update(plain_pinned_h2d_gbs=plain_gbs, feedline_h2d_gbs=feedline_gbs,
                   feedline_vs_plain=feedline_gbs / plain_gbs if plain_gbs else 0,
                   copy_hidden_fraction=hidden, images_per_s_with_step=n / t_loader,
                   images_per_s=s["images_per_s"], workers=s["workers"], prefetch=s["prefetch"],
                   bottleneck=s["bottleneck"])
    print(f"H2D: feedline {feedline_gbs:.1f} GB/s (copy + convert) vs plain pinned "
          f"{plain_gbs:.1f} GB/s = {feedline_gbs / plain_gbs:.2f}x")
    print(f"copy time hidden behind the step: {100 * hidden:.0f}% "
          f"(loop {t_loader:.2f} s, compute alone {t_compute:.2f} s, copy {copy_s:.2f} s)")
    print(f"images/s: {s['images_per_s']:.0f} (with the step: {n / t_loader:.0f}); "
          f"bottleneck: {s['bottleneck']} - {s['bottleneck_reason']}")


def check_dry_run(root, results):
    """No GPU (CI): the CPU-side parts. The CPU references of check_correctness, and a request
    for a GPU fails at once with DeviceError (never DataError, never a hang)."""
    ok = True
    for dtype in ("uint8", "float32", "float16", "bfloat16"):
        for layout in ("NCHW", "NHWC"):
            kw = dict(batch_size=32, size=96, resize_size=110, seed=5, layout=layout, dtype=dtype)
            n = sum(len(x) for x, _ in feedline.ImageLoader(root, **kw))
            ok &= n == 256
    results["cpu_references_ok"] = ok
    t = time.perf_counter()
    try:
        feedline.ImageLoader(root, device="cuda")
        refused = False
    except feedline.DeviceError:
        refused = True
    fast = time.perf_counter() - t < 2.0
    results["no_gpu_device_error"] = refused and fast
    print(f"CPU references: {'ok' if ok else 'WRONG'}; device='cuda' without a GPU: "
          f"DeviceError={refused} in {time.perf_counter() - t:.2f} s")
    return ok and refused and fast


def check_dataloader(root, results):
    """feedline.DataLoader(device="cuda"): batches collated in pinned slots and copied by the
    copy stage equal the CPU path's, for each executor, padded fields included; tensors are on
    the GPU, padded lengths stay on the host (as pack_padded_sequence wants them)."""
    import numpy as np

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 103

        def __getitem__(self, i):
            return {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4) * i,
                    "h": torch.full((5,), i, dtype=torch.bfloat16),
                    "ids": torch.arange(1 + i % 17), "a": np.full((2,), i, np.int16),
                    "y": i, "name": f"s{i}"}

    ok = True
    for executor in ("thread", "process"):
        kw = dict(batch_size=8, num_workers=2, executor=executor, pad=True)
        cpu = list(feedline.DataLoader(Samples(), **kw))
        gpu = list(feedline.DataLoader(Samples(), device="cuda", **kw))
        same = len(cpu) == len(gpu)
        for a, b in zip(cpu, gpu):
            for k in a:
                if isinstance(a[k], torch.Tensor):
                    want_cuda = k != "ids_lengths"
                    same &= b[k].is_cuda == want_cuda and torch.equal(a[k], b[k].cpu())
                else:
                    same &= a[k] == b[k]
        results[f"dataloader_{executor}"] = bool(same)
        print(f"DataLoader device='cuda' ({executor}): same as CPU = {same}")
        ok &= bool(same)
    return ok


_LIFETIME_CHILD = r'''
import os, sys, torch, feedline
root, mode = sys.argv[1], sys.argv[2]
loader = feedline.ImageLoader(root, batch_size=16, size=64, resize_size=72, device="cuda",
                              dtype="float16", shuffle=False)
x, y = next(iter(loader))
if mode == "exit":  # leave with a live GPU tensor and loader: no hang, no crash
    print("exiting with", x.shape, flush=True)
    sys.exit(0)
if mode == "fork":  # a child of a process with a live GPU loader loads on the CPU
    pid = os.fork()
    if pid == 0:
        n = sum(len(b) for b, _ in feedline.ImageLoader(root, batch_size=16, size=64,
                                                       resize_size=72))
        os._exit(0 if n == 256 else 3)
    _, status = os.waitpid(pid, 0)
    n = sum(len(b) for b, _ in loader)  # the parent's loader goes on
    torch.cuda.synchronize()
    sys.exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and n == 256 else 4)
'''


def check_lifetime(root, results):
    """A batch used after its loader is deleted; exit with a live GPU tensor; fork() with a live
    GPU loader (the child loads on the CPU, the parent's loader goes on)."""
    import gc
    import subprocess
    kw = dict(batch_size=16, size=64, resize_size=72, dtype="float16", shuffle=False)
    want = next(iter(feedline.ImageLoader(root, **kw)))[0]
    loader = feedline.ImageLoader(root, device="cuda", **kw)
    x, _ = next(iter(loader))
    del loader
    gc.collect()
    after_delete = bool(torch.equal(x.cpu(), want))
    del x
    gc.collect()
    torch.cuda.synchronize()
    results["batch_after_loader_deleted"] = after_delete
    ok = after_delete
    for mode in ("exit", "fork"):
        try:
            r = subprocess.run([sys.executable, "-c", _LIFETIME_CHILD, root, mode],
                               capture_output=True, text=True, timeout=60)
            good = r.returncode == 0
            if not good:
                print(r.stdout[-2000:], r.stderr[-2000:])
        except subprocess.TimeoutExpired:
            good = False
        results[f"lifetime_{mode}"] = good
        ok &= good
    print(f"lifetime: batch after its loader {after_delete}, exit with a live tensor "
          f"{results['lifetime_exit']}, fork with a live loader {results['lifetime_fork']}")
    return ok


def check_small(root, results):
    """A small run for compute-sanitizer (memcheck, synccheck): every dtype and layout, a
    consumer stream, batches dropped early."""
    s = torch.cuda.Stream()
    for dtype in ("uint8", "float16"):
        for layout in ("NCHW", "NHWC"):
            loader = feedline.ImageLoader(root, batch_size=32, size=48, resize_size=56,
                                          dtype=dtype, layout=layout, device="cuda")
            with torch.cuda.stream(s):
                for x, y in loader:
                    (x.float().sum() + y.sum()).item()
    torch.cuda.synchronize()
    return True


GPU_CHECKS = [("correctness", check_correctness), ("stream_ordering", check_stream_ordering),
              ("dlpack_streams", check_dlpack_streams), ("leaks", check_leaks),
              ("lifetime", check_lifetime), ("throughput", check_throughput),
              ("dataloader", check_dataloader)]
SMALL_CHECKS = [("small", check_small)]


class StepTimeout(Exception):
    pass


def run_checks(checks, root, results, out, step_timeout):
    """Runs every check even when one fails (its error is recorded), each under a time limit,
    and rewrites the JSON after each so that a killed run still leaves what it measured."""
    import signal
    import traceback

    def on_alarm(signum, frame):
        raise StepTimeout(f"over {step_timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)
    all_ok = True
    for name, fn in checks:
        t = time.perf_counter()
        print(f"== {name}", flush=True)
        signal.alarm(step_timeout)
        try:
            ok = bool(fn(root, results))
        except Exception as e:  # noqa: BLE001 (recorded, and the next check still runs)
            ok = False
            results.setdefault("errors", {})[name] = "".join(
                traceback.format_exception_only(type(e), e)).strip()
            traceback.print_exc()
        finally:
            signal.alarm(0)
        results.setdefault("checks", {})[name] = {"ok": ok,
                                                  "seconds": round(time.perf_counter() - t, 2)}
        all_ok &= ok
        results["ok"] = bool(all_ok)
        with open(out, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"{name}: {'ok' if ok else 'FAILED'}", flush=True)
    return all_ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: run the CPU-side parts only (CI)")
    ap.add_argument("--step-timeout", type=int, default=150, help="seconds per check")
    ap.add_argument("--small", action="store_true",
                    help="one small run only (under compute-sanitizer)")
    args = ap.parse_args()
    print("build_info:", feedline.build_info(), flush=True)
    results = {"dry_run": args.dry_run, "build_info": feedline.build_info()}
    if not args.dry_run and not torch.cuda.is_available():
        print("no GPU visible to torch (use --dry-run for the CPU-side parts)")
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        root = make_dataset(os.path.join(tmp, "data"))
        print(f"data set: 256 JPEGs in {time.perf_counter() - t:.1f} s", flush=True)
        checks = ([("dry_run", check_dry_run)] if args.dry_run
                  else SMALL_CHECKS if args.small else GPU_CHECKS)
        ok = run_checks(checks, root, results, args.out, args.step_timeout)
    print("GPU checks:", "PASSED" if ok else "FAILED", f"({args.out})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
