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
