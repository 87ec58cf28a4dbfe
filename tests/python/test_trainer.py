"""The trainer's share of the machine: feedline's workers run below the training thread's
priority (LoaderOptions::worker_nice), so that a training step's CPU part is not stretched by
them, and stats() says what the training thread got (its CPU between batches and its waits for
a core)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import torch
import torch.utils.data as tud

import feedline


def _nice():
    """The calling thread's nice value (Linux keeps one per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class Priorities(tud.Dataset):
    """Each sample: the nice value of the thread that made it, and its process id."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([_nice(), os.getpid()])


def _seen(loader):
    made = torch.cat(list(loader))
    return set(made[:, 0].tolist()), set(made[:, 1].tolist())


def test_worker_processes_run_below_the_trainer_and_worker_threads_at_its_priority():
    """Worker processes hold no lock of the trainer's: 19 levels below it. Worker threads run
    Python under the trainer's GIL: below it, one that holds the GIL would stall the trainer
    behind every other busy thread, so they keep its priority."""
    base = _nice()
    procs = feedline.DataLoader(Priorities(), batch_size=4, num_workers=2)
    nices, pids = _seen(procs)
    assert os.getpid() not in pids
    assert nices == {min(19, base + 19)}
    threads = feedline.DataLoader(Priorities(), batch_size=4, executor="thread", workers=2)
    nices, pids = _seen(threads)
    assert pids == {os.getpid()}
    assert nices == {base}
    assert _nice() == base  # the trainer's own thread is never touched


def test_image_loader_workers_yield_and_stats_show_the_trainers_share(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=8, size=32, workers=2)
    for _ in loader:
        end = time.thread_time() + 0.002  # a step that needs the CPU
        while time.thread_time() < end:
            pass
    st = loader.stats()
    assert st["worker_nice"] == 19
    assert st["consumer_cpu_s"] > 0.002 * (len(loader) - 1)
    assert 0 <= st["consumer_run_delay_s"] < 60


def test_the_autotuner_measures_the_trainers_cores(image_folder):
    """stats()["trainer"]: the cores the consumer's thread uses, as the autotuner measures them
    to size the workers (the rule itself is tested in the [tune] unit tests)."""
    loader = feedline.ImageLoader(image_folder, batch_size=4, size=32)  # workers: auto
    start = time.monotonic()
    while time.monotonic() - start < 2.0:  # whole epochs, ~2 s: several tuning intervals
        for _ in loader:
            end = time.thread_time() + 0.02  # a step that needs the CPU: most of a core
            while time.thread_time() < end:
                pass
    trainer = loader.stats()["trainer"]
    assert set(trainer) == {"cores", "cores_left", "reason"}
    assert 0.2 < trainer["cores"] <= 1.05, trainer
    assert trainer["cores_left"] in (0, 1) and isinstance(trainer["reason"], str)
    # A loader whose workers are fixed has no tuner to measure it.
    fixed = feedline.ImageLoader(image_folder, batch_size=4, size=32, workers=1, prefetch=2,
                                 io_depth=1)
    list(fixed)
    assert fixed.stats()["trainer"] == {"cores": 0.0, "cores_left": 0, "reason": ""}


def test_feedline_worker_nice_0_keeps_every_worker_at_the_trainers_priority(image_folder):
    """FEEDLINE_WORKER_NICE overrides the default for every face (a job that wants its loader to
    compete with other processes on equal terms)."""
    code = textwrap.dedent(f"""
        import os, threading, torch, torch.utils.data as tud, feedline
        class P(tud.Dataset):
            def __len__(self): return 8
            def __getitem__(self, i):
                return torch.tensor([os.getpriority(os.PRIO_PROCESS, threading.get_native_id())])
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen = set(torch.cat(list(feedline.DataLoader(P(), batch_size=4, num_workers=2))).flatten().tolist())
        assert seen == {{base}}, (seen, base)
        loader = feedline.ImageLoader({image_folder!r}, batch_size=8, size=32, workers=2)
        list(loader)
        assert loader.stats()["worker_nice"] == 0
        print("ok")
    """)
    env = dict(os.environ, FEEDLINE_WORKER_NICE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    env["FEEDLINE_WORKER_NICE"] = "25"
    out = subprocess.run([sys.executable, "-c", f"import feedline; feedline.ImageLoader("
                          f"{image_folder!r}, batch_size=8, size=32)"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "FEEDLINE_WORKER_NICE=25 must be in [0, 19]" in out.stderr


def test_worker_processes_map_style_and_iterable_run_at_the_resolved_nice_level():
    """feedline.DataLoader's worker processes, map-style and iterable, take the level the engine
    resolves (_feedline.worker_nice(): worker_nice's declared default, or FEEDLINE_WORKER_NICE),
    not a default of their own."""
    code = textwrap.dedent("""
        import os, threading, torch, torch.utils.data as tud, feedline
        from feedline import _feedline
        def prio():
            return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        class P(tud.Dataset):
            def __len__(self): return 8
            def __getitem__(self, i): return torch.tensor([prio()])
        class I(tud.IterableDataset):
            def __iter__(self):
                for _ in range(4):
                    yield torch.tensor([prio()])
        base = prio()
        want = min(19, base + _feedline.worker_nice())
        mapped = set(torch.cat(list(feedline.DataLoader(P(), batch_size=4, num_workers=2)))
                     .flatten().tolist())
        streamed = set(torch.cat(list(feedline.DataLoader(I(), batch_size=2, num_workers=2)))
                       .flatten().tolist())
        assert mapped == {want} and streamed == {want}, (mapped, streamed, base, want)
        print(_feedline.worker_nice())
    """)
    for env_value, level in (("7", 7), (None, 19)):
        env = dict(os.environ)
        env.pop("FEEDLINE_WORKER_NICE", None)
        if env_value is not None:
            env["FEEDLINE_WORKER_NICE"] = env_value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == str(level), out.stderr[-3000:]


def _first_batch_waits(folder, epochs=4, step_s=0.05):
    """The wait for the first batch of epochs 1.. (iter() included), with a consumer slower
    than the loader, and every epoch's (images, labels) bytes."""
    # Reads of 5 ms, 4 at a time: a batch takes ~20 ms to make, the step 50.
    loader = feedline.ImageLoader(folder, batch_size=16, size=64, workers=1, io_depth=4, seed=1,
                                  simulated_read_latency_ms=5.0)
    waits, seen = [], []
    for e in range(epochs):
        t0 = time.perf_counter()
        it = iter(loader)
        x, y = next(it)
        if e > 0:
            waits.append(time.perf_counter() - t0)
        batches = [(x.clone(), y.clone())]
        for x, y in it:
            time.sleep(step_s)  # the training step (its GPU part: no CPU)
            batches.append((x.clone(), y.clone()))
        seen.append(batches)
    return sum(waits) / len(waits), seen


def test_the_next_epochs_first_batch_is_made_before_it_is_asked_for(image_folder, monkeypatch):
    """With the head start the workers go on with the next epoch once every batch of this one
    is made, so that iter() for it does not wait for the pipeline to fill: the same batches,
    without the wait (FEEDLINE_EPOCH_HEAD_START=0 turns it off)."""
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    without, want = _first_batch_waits(image_folder)
    monkeypatch.delenv("FEEDLINE_EPOCH_HEAD_START")
    with_head_start, got = _first_batch_waits(image_folder)
    for e, (a, b) in enumerate(zip(want, got)):
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb) and torch.equal(xa, xb), e
    assert without > 0.008, without  # the bubble is real here
    assert with_head_start < 0.25 * without, (with_head_start, without)
