"""Whole-process behaviour: interpreter exit with a loader mid-epoch, fork() after a loader
started (as torch's DataLoader workers do), and extreme images through the Python API."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
from PIL import Image

import feedline


def _run(code, timeout=60):
    env = dict(os.environ)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - start


def test_interpreter_exit_with_a_loader_mid_epoch(small_folder):
    p, seconds = _run(f"""
        import feedline
        loader = feedline.ImageLoader({small_folder!r}, batch_size=2, size=32, prefetch=1)
        it = iter(loader)
        next(it)            # workers now block on a full ring
        print("exiting")    # no cleanup: the interpreter tears everything down
    """)
    assert p.returncode == 0, p.stderr
    assert "exiting" in p.stdout
    assert seconds < 30


def test_fork_after_a_loader_started(small_folder):
    p, _ = _run(f"""
        import os, feedline
        loader = feedline.ImageLoader({small_folder!r}, batch_size=4, size=32, prefetch=1)
        it = iter(loader)
        next(it)
        pid = os.fork()
        if pid == 0:
            # The child (a DataLoader worker would be here): drops what it inherited, loads anew.
            del it, loader
            n = sum(x.shape[0] for x, _ in feedline.ImageLoader({small_folder!r}, batch_size=4,
                                                                 size=32))
            os._exit(0 if n == 26 else 3)
        _, status = os.waitpid(pid, 0)
        rest = sum(x.shape[0] for x, _ in it)
        print("child", os.waitstatus_to_exitcode(status), "parent", 4 + rest)
    """)
    assert p.returncode == 0, p.stderr
    assert "child 0 parent 26" in p.stdout, p.stdout + p.stderr


def test_thin_and_tiny_images(tmp_path):
    root = tmp_path / "thin" / "a"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, (w, h) in {"thin.jpg": (1, 20000), "wide.jpg": (9000, 2), "one.jpg": (1, 1)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / name)
    for transform in ("eval", "train"):
        loader = feedline.ImageLoader(str(tmp_path / "thin"), batch_size=3, size=64,
                                      transform=transform, shuffle=False)
        (x, y), = list(loader)
        assert x.shape == (3, 3, 64, 64)


_KILLED_PARENT = """
import os, sys, time
import torch
import feedline

class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        i = 0
        while True:          # endless: the workers block on a full queue
            yield torch.full((256,), float(i))
            i += 1

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(3600)     # a sample whose code never returns, in a worker process
        return i

kind = sys.argv[1]
if kind == "iterable":
    loader = feedline.DataLoader(Stream(), batch_size=4, num_workers=2, executor="process")
    it = iter(loader)
    next(it)
else:
    loader = feedline.DataLoader(Slow(), batch_size=1, num_workers=2, executor="process")
    import threading
    threading.Thread(target=lambda: next(iter(loader)), daemon=True).start()
    time.sleep(3)
print(" ".join(str(c.pid) for c in __import__("multiprocessing").active_children()), flush=True)
time.sleep(3600)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


import pytest  # noqa: E402


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_worker_processes_exit_with_a_killed_parent(kind, sig):
    """Schedulers end jobs with SIGTERM (then SIGKILL): the loader's worker processes must not
    outlive the training process (IterableDataset workers blocked in a queue put stayed forever,
    ~138 MB each; a worker in a sample's code that never returns too)."""
    import signal
    p = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT, kind], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        line = p.stdout.readline()
        children = [int(x) for x in line.split()]
        assert len(children) == 2, line
        assert all(_alive(c) for c in children)
        os.kill(p.pid, getattr(signal, sig))
        p.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(c) for c in children):
            time.sleep(0.1)
        assert not any(_alive(c) for c in children), children
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_loader_collected_in_a_forked_child_leaves_the_parents_workers_alone():
    """A copy of a DataLoader in a forked child (collected there by Python's garbage collector,
    as in a worker process of another loader) must not stop what the parent owns: it waited
    forever there for a request in flight in the parent at the fork (a whole test run hung)."""
    out = _run("""
        import os, threading, time, torch, torch.utils.data as tud, feedline
        class Slow(tud.Dataset):
            def __len__(self): return 8
            def __getitem__(self, i):
                time.sleep(1.5)
                return torch.tensor([i])
        loader = feedline.DataLoader(Slow(), batch_size=2, num_workers=2)
        it = iter(loader)
        got = []
        t = threading.Thread(target=lambda: got.append(next(it)))
        t.start()
        time.sleep(0.7)  # the worker processes are inside their first batch
        pid = os.fork()
        if pid == 0:
            loader.__del__()  # what the garbage collector runs when the child's copy goes
            os._exit(0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            raise SystemExit("the forked child hung dropping its copy of the loader")
        t.join()
        assert len(list(it)) == 3 and got  # the parent's epoch goes on
        print("ok")
    """, timeout=90)
    p, _ = out
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
