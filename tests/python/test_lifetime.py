"""Batch and thread lifetimes: held batches stay intact, stopping early cleans up, no leaks."""

import collections
import gc
import os
import time

import pytest
import torch

import feedline
import util

SETTLE_S = 3.0  # how long threads may take to go after an epoch is dropped


@pytest.fixture(autouse=True)
def _no_head_start(request, monkeypatch):
    """Thread counts between epochs are the loader's workers alone: no head start of the next
    epoch (whose read stage would be running), except in the tests of the head start itself."""
    if "head_start" not in request.node.name:
        monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")


@pytest.fixture(scope="module")
def baseline_threads(small_folder):
    """The process's thread count with no loader alive, after one full warm-up run (so that
    lazily started global pools, torch's or a library's, are counted in the baseline)."""
    torch.ones(1 << 20).sum()
    warm = feedline.ImageLoader(small_folder, batch_size=4, workers=3, size=32)
    for _ in warm:
        pass
    del warm
    gc.collect()
    time.sleep(0.2)
    return util.thread_count()


def _assert_threads_back(baseline, what, kept=0):
    """The epoch's threads are gone; `kept`: the loader's worker threads, which stay from epoch
    to epoch (persistent workers) until the loader goes."""
    n = util.wait_thread_count(baseline + kept, SETTLE_S)
    assert n <= baseline + kept, \
        f"{what}: {n} threads, {baseline} before + {kept} kept (after {SETTLE_S} s)"


def _full_epoch_ok(loader):
    with util.deadline(30, "a full epoch"):
        count = sum(int(x.shape[0]) for x, _ in loader)
    assert count == loader.num_samples


# --- held batches -------------------------------------------------------------------------

def test_held_batches_stay_intact(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=2, prefetch=2, workers=2, size=32,
                                  return_index=True)
    held, copies = [], []
    with util.deadline(60, "holding 2 epochs of batches with prefetch=2"):
        for _ in range(2):
            for x, y, idx in loader:
                held.append((x, y, idx))
                copies.append((x.clone(), y.clone(), idx.clone()))
    assert len(held) == 2 * len(loader) > 2 * 2  # far more batches than the ring's depth
    for k, (h, c) in enumerate(zip(held, copies)):
        for a, b in zip(h, c):
            assert torch.equal(a, b), f"held batch {k} changed after it was yielded"
    # distinct memory for every held batch
    ptrs = {x.data_ptr() for x, _, _ in held}
    assert len(ptrs) == len(held)


def test_held_batches_survive_cancelled_epoch_and_new_epochs(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=3, prefetch=2, size=32)
    held, copies = [], []
    with util.deadline(60, "holding batches across cancelled epochs"):
        for i, (x, y) in enumerate(loader):
            held.append((x, y))
            copies.append((x.clone(), y.clone()))
            if i == 2:
                break  # abandon the epoch while holding 3 batches
        for _ in range(2):
            for x, y in loader:  # later epochs reuse the ring
                x.fill_(0)       # and the consumer scribbles on its own batches
    del loader
    gc.collect()
    for (x, y), (cx, cy) in zip(held, copies):
        assert torch.equal(x, cx) and torch.equal(y, cy)


def test_holding_more_than_prefetch_does_not_deadlock(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=1, prefetch=1, workers=2, size=32)
    with util.deadline(30, "holding every batch of an epoch with prefetch=1"):
        held = [b for b in loader]
    assert len(held) == loader.num_samples


# --- stopping early -------------------------------------------------------------------------

def test_break_after_one_batch(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    for _ in loader:
        break
    _assert_threads_back(baseline_threads, "break after 1 batch", kept=4)
    _full_epoch_ok(loader)
    _assert_threads_back(baseline_threads, "after a full epoch", kept=4)
    del loader
    _assert_threads_back(baseline_threads, "the loader gone")


def test_del_iterator_mid_epoch(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    it = iter(loader)
    next(it)
    next(it)
    assert util.thread_count() > baseline_threads  # the epoch's workers are running
    t0 = time.monotonic()
    del it
    _assert_threads_back(baseline_threads, "del iterator", kept=4)
    assert time.monotonic() - t0 < SETTLE_S
    _full_epoch_ok(loader)


def test_del_loader_after_break(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    for _ in loader:
        break
    del loader
    _assert_threads_back(baseline_threads, "del loader")


def test_exception_inside_loop(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    with pytest.raises(KeyError):
        for i, _ in enumerate(loader):
            if i == 1:
                raise KeyError("user code failed")
    _assert_threads_back(baseline_threads, "exception in the loop", kept=4)
    _full_epoch_ok(loader)


def test_iterator_never_started(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, size=32)
    it = iter(loader)
    del it
    _assert_threads_back(baseline_threads, "iterator dropped before its first batch", kept=4)
    _full_epoch_ok(loader)


def test_new_iter_cancels_unfinished_epoch(small_folder, baseline_threads):
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    first = iter(loader)
    next(first)
    second = iter(loader)  # starts the next epoch; the first one is cancelled
    n = sum(int(x.shape[0]) for x, _ in second)
    assert n == loader.num_samples
    with pytest.raises(RuntimeError, match="newer iter"):  # loudly: zip(loader, loader)
        next(first)
    del first, second
    _assert_threads_back(baseline_threads, "after a superseded epoch", kept=4)
    del loader
    _assert_threads_back(baseline_threads, "the loader gone")


def test_no_leak_over_many_loaders(image_folder, baseline_threads):
    def one():
        loader = feedline.ImageLoader(image_folder, batch_size=16, workers=2, size=96)
        for i, (x, _) in enumerate(loader):
            if i == 1:
                break
    for _ in range(5):  # warm-up: allocator pools, lazily loaded code
        one()
    gc.collect()
    rss0 = util.rss_bytes()
    for _ in range(30):
        one()
    gc.collect()
    grown = util.rss_bytes() - rss0
    # a loader owns ~3.5 MB here (ring slots of 16 x 3 x 96 x 96 bytes + read buffers): leaking
    # its slots alone would grow RSS by ~40 MB over 30 loaders
    assert grown < 24 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 30 loaders"
    _assert_threads_back(baseline_threads, "after 30 loaders")


# --- the loader's lifetime vs. its iterator --------------------------------------------------

def test_iterating_a_temporary_loader(small_folder):
    with util.deadline(30, "iterating a temporary loader"):
        n = sum(int(x.shape[0]) for x, _ in feedline.ImageLoader(small_folder, batch_size=4,
                                                                   size=32))
    assert n == 26


def test_iterator_outlives_loader(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32)
    it = iter(loader)
    n = int(next(it)[0].shape[0])
    del loader
    gc.collect()
    with util.deadline(30, "finishing an epoch whose loader was dropped"):
        n += sum(int(x.shape[0]) for x, _ in it)
    assert n == 26


# --- a consumer blocked in next() -----------------------------------------------------------

def test_signal_interrupts_a_blocked_next(tmp_path, small_folder):
    """A read that never completes (a FIFO named .jpg) blocks next(); a signal handler that
    raises (as Ctrl-C's does) still gets through promptly, and the loader recovers."""
    import os
    import shutil
    import threading
    root = tmp_path / "fifo"
    (root / "c").mkdir(parents=True)
    shutil.copyfile(os.path.join(small_folder, "x", "00.jpg"), root / "c" / "a.jpg")
    fifo = str(root / "c" / "b.jpg")
    os.mkfifo(fifo)
    loader = feedline.ImageLoader(str(root), batch_size=2, shuffle=False, size=32, workers=1,
                                  io_depth=1)

    def release():  # lets the blocked reader go on (it then sees an empty stream)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError:  # ENXIO: no reader has it open yet
                time.sleep(0.05)

    it = iter(loader)
    try:
        t0 = time.monotonic()
        with pytest.raises(util.DeadlineExceeded):
            with util.deadline(1.0, "next() on a FIFO"):
                next(it)
        assert time.monotonic() - t0 < 2.0, "the signal was not seen promptly"
    finally:
        releaser = threading.Thread(target=release)
        releaser.start()
        # the epoch goes on: the FIFO sample fails (a DataError naming it) or ends the epoch
        with util.deadline(20, "the epoch after the FIFO was released"):
            try:
                next(it)
            except feedline.DataError as e:
                assert "b.jpg" in str(e)
            except StopIteration:
                pass
        releaser.join()
        del it


def test_stats_from_another_thread_while_iterating(image_folder):
    import threading
    loader = feedline.ImageLoader(image_folder, batch_size=4, size=64, workers=2)
    seen, problems, stop = [], [], threading.Event()

    def poll():
        try:
            while not stop.is_set():
                seen.append(loader.stats()["images"])
        except Exception as e:  # pragma: no cover - reported below
            problems.append(repr(e))

    th = threading.Thread(target=poll)
    th.start()
    try:
        with util.deadline(30, "iterating while another thread reads stats()"):
            for _ in range(2):
                for _ in loader:
                    pass
    finally:
        stop.set()
        th.join()
    assert not problems
    assert len(seen) > 10
    assert all(a <= b for a, b in zip(seen, seen[1:])), "stats()['images'] went backwards"
    assert loader.stats()["images"] == 2 * len(loader.samples)


def _feedline_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # ended meanwhile
    return sorted(n for n in names if n.startswith("feedline"))


def test_head_start_threads_are_the_next_epochs_and_go_with_the_loader(small_folder,
                                                                       baseline_threads):
    """After a full epoch the next one's first batches are being made (the head start): the
    loader holds its workers and that epoch's readers, nothing else; iter() takes them over;
    they all go with the loader."""
    before = collections.Counter(_feedline_threads())  # other tests' loaders, not yet collected
    loader = feedline.ImageLoader(small_folder, batch_size=2, workers=4, prefetch=4, size=32)
    want = [_epoch_indices(loader) for _ in range(2)]
    time.sleep(0.3)
    held = collections.Counter(_feedline_threads()) - before
    assert held["feedline-map"] == 4, held
    assert set(held) == {"feedline-map", "feedline-read"}, held
    assert want[0] != want[1]
    with util.deadline(30, "a full epoch after the head start"):
        third = _epoch_indices(loader)
    assert sorted(third) == sorted(want[0])
    del loader
    _assert_threads_back(baseline_threads, "the loader gone with its head start")


def _epoch_indices(loader):
    loader_iter = iter(loader)
    return [int(i) for x, y in loader_iter for i in y]
