"""feedline.DataLoader against torch's DataLoader: same batches, errors, resume, workers.

Every comparison runs torch's own DataLoader on the same dataset as the reference.
"""

import collections
import os
import random
import signal
import struct
import threading
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import feedline

EXECUTORS = ["thread", "process"]
Point = collections.namedtuple("Point", "x label")


class Mixed(tud.Dataset):
    """Every kind of leaf default_collate handles, nested."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": torch.arange(12, dtype=torch.float32).reshape(3, 4) + i,
            "half": torch.full((2,), i, dtype=torch.bfloat16),
            "mask": torch.tensor([i % 2 == 0, True]),
            "array": np.arange(5, dtype=np.int16) * i,
            "label": i,
            "weight": i / 7,
            "flag": i % 3 == 0,
            "np_scalar": np.float32(i) / 3,
            "name": f"sample-{i}" * (i % 3),
            "raw": bytes([i % 256]) * 3,
            "point": Point(torch.tensor([i, -i]), i * 2),
            "pair": (i, torch.tensor(float(i))),
            "list": [np.uint8(i), "x"],
        }


def assert_same(a, b, where="batch"):
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{where}: {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{where}: {a.shape} vs {b.shape}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_batches(ref, got):
    ref, got = list(ref), list(got)
    assert len(ref) == len(got)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert_same(a, b, f"batch {i}")


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("batch_size,drop_last", [(8, False), (8, True), (1, False)])
def test_same_batches_as_torch(executor, batch_size, drop_last):
    ref = tud.DataLoader(Mixed(), batch_size=batch_size, drop_last=drop_last)
    loader = feedline.DataLoader(Mixed(), batch_size=batch_size, drop_last=drop_last,
                                 num_workers=2, executor=executor)
    assert len(loader) == len(ref)
    assert_batches(ref, loader)
    assert_batches(ref, loader)  # a second epoch, on the same (persistent) workers
    assert loader.stats()["python"]["executor"] == executor


def test_num_workers_zero_runs_in_the_calling_thread():
    seen = set()

    class Where(tud.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            seen.add(threading.get_ident())
            return i

    loader = feedline.DataLoader(Where(), batch_size=3, num_workers=0)
    assert_batches(tud.DataLoader(Where(), batch_size=3), loader)
    assert seen == {threading.get_ident()}
    assert loader.stats()["python"]["executor"] == "main"


def test_torch_attributes_and_argument_checks():
    ds = Mixed(10)
    loader = feedline.DataLoader(ds, batch_size=4, shuffle=True)
    assert loader.dataset is ds and loader.batch_size == 4 and len(loader) == 3
    assert isinstance(loader.sampler, tud.RandomSampler)
    assert isinstance(loader.batch_sampler, tud.BatchSampler)
    with pytest.raises(ValueError, match="mutually exclusive"):
        feedline.DataLoader(ds, sampler=tud.SequentialSampler(ds), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler"):
        feedline.DataLoader(ds, batch_size=4, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="non-negative"):
        feedline.DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="executor"):
        feedline.DataLoader(ds, executor="gpu")
    # prefetch_factor with num_workers=0: whatever the installed torch accepts (its default
    # there: 2 in torch 1.13, none from 2.0), feedline accepts; what it refuses, feedline too.
    for pf in (1, 2, 4):
        try:
            tud.DataLoader(ds, num_workers=0, prefetch_factor=pf)
        except ValueError:
            with pytest.raises(ValueError, match="prefetch_factor"):
                feedline.DataLoader(ds, num_workers=0, prefetch_factor=pf)
        else:
            assert len(list(feedline.DataLoader(ds, num_workers=0, prefetch_factor=pf))) == 10


@pytest.mark.parametrize("executor", EXECUTORS)
def test_shuffle_follows_torch_rng(executor):
    torch.manual_seed(11)
    ref = list(tud.DataLoader(Mixed(), batch_size=5, shuffle=True, num_workers=0))
    torch.manual_seed(11)
    got = list(feedline.DataLoader(Mixed(), batch_size=5, shuffle=True, num_workers=2,
                                   executor=executor))
    assert_batches(ref, got)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_samplers_batch_samplers_and_collate_fn(executor):
    ds = Mixed(23)
    irregular = [[0, 1, 2], [5], [7, 3, 9, 11], [22, 21]]
    assert_batches(tud.DataLoader(ds, batch_sampler=irregular),
                   feedline.DataLoader(ds, batch_sampler=irregular, num_workers=2,
                                       executor=executor))
    assert_batches(tud.DataLoader(ds, batch_size=None),
                   feedline.DataLoader(ds, batch_size=None, num_workers=2, executor=executor))

    def per_sample(sample):  # batch_size=None: the collate_fn takes each sample alone
        return {"twice": sample["image"] * 2, "label": sample["label"]}

    assert_batches(tud.DataLoader(ds, batch_size=None, collate_fn=per_sample),
                   feedline.DataLoader(ds, batch_size=None, collate_fn=per_sample,
                                       num_workers=2, executor=executor))

    def collate(batch):
        return {"sum": torch.stack([b["image"] for b in batch]).sum(0), "n": len(batch)}

    assert_batches(tud.DataLoader(ds, batch_size=6, collate_fn=collate),
                   feedline.DataLoader(ds, batch_size=6, collate_fn=collate, num_workers=2,
                                       executor=executor))
    for rank in range(2):
        s1 = tud.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        s2 = tud.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        s1.set_epoch(3)
        s2.set_epoch(3)
        loader = feedline.DataLoader(ds, batch_size=4, sampler=s2, num_workers=2,
                                     executor=executor)
        assert len(loader.sampler) == len(s1)
        assert_batches(tud.DataLoader(ds, batch_size=4, sampler=s1), loader)


def test_samples_torch_cannot_stack_collate_in_python():
    class Ragged(tud.Dataset):
        def __len__(self):
            return 9

        def __getitem__(self, i):
            return {"ids": torch.arange(i + 1), "meta": None}

    def pad(batch):
        return torch.nn.utils.rnn.pad_sequence([b["ids"] for b in batch], batch_first=True)

    assert_batches(tud.DataLoader(Ragged(), batch_size=4, collate_fn=pad),
                   feedline.DataLoader(Ragged(), batch_size=4, collate_fn=pad, num_workers=2))
    # None leaves: torch's default_collate raises its TypeError, so does feedline
    class WithNone(tud.Dataset):
        def __len__(self):
            return 9

        def __getitem__(self, i):
            return {"ids": torch.arange(3), "meta": None}

    with pytest.raises(TypeError, match="default_collate"):
        list(tud.DataLoader(WithNone(), batch_size=4))
    with pytest.raises(TypeError, match="default_collate"):
        list(feedline.DataLoader(WithNone(), batch_size=4, num_workers=2))

    class Shapes(tud.Dataset):  # the first sample's shape differs from a later one's
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.zeros(3 if i < 5 else 4)

    with pytest.raises(RuntimeError):
        list(tud.DataLoader(Shapes(), batch_size=4))
    loader = feedline.DataLoader(Shapes(), batch_size=4, num_workers=2)
    # The first epoch is collated by torch's default_collate in the workers (its error), the
    # next ones in place, in the layout learned from the first batch (feedline's, naming both).
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(loader)
    with pytest.raises(RuntimeError, match=r"shape \[4\].*\[3\]"):
        list(loader)


class Faulty(tud.Dataset):
    def __init__(self, n=40, bad=(), sleep=()):
        self.n, self.bad, self.sleep = n, set(bad), set(sleep)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"no such sample: {i}")
        if i in self.sleep:
            time.sleep(30)
        return torch.tensor([i])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_dataset_exception_reaches_the_loop_with_its_type_and_traceback(executor):
    loader = feedline.DataLoader(Faulty(bad={13}), batch_size=4, num_workers=2,
                                 executor=executor)
    it = iter(loader)
    got = []
    with pytest.raises(KeyError) as info:
        for b in it:
            got.append(b)
    text = str(info.value)
    assert "dataset[13]" in text and "no such sample: 13" in text and "Traceback" in text
    assert "__getitem__" in text
    assert len(got) == 3  # the batches before the failing one, in order
    rest = list(it)  # as in torch, the loop may go on after the failed batch
    assert [int(b[0]) for b in rest] == list(range(16, 40, 4))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_on_error_skip_replaces_and_counts(executor):
    loader = feedline.DataLoader(Faulty(bad={3, 17}), batch_size=4, num_workers=2,
                                 executor=executor, on_error="skip")
    values = torch.cat(list(loader)).flatten().tolist()
    assert len(values) == 40 and 3 not in values and 17 not in values
    assert loader.stats()["error_count"] == 2
    if executor == "thread":  # whole batches: a failed one's place is taken by another batch
        assert len(set(values)) == 32


def test_timeout_fails_the_batch_in_time():
    loader = feedline.DataLoader(Faulty(sleep={5}), batch_size=4, num_workers=2,
                                 executor="process", timeout=1)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1"):
        list(loader)
    assert time.monotonic() - t0 < 10


def test_the_first_samples_errors_reach_the_loop_at_their_batch():
    """The first sample teaches the workers the batch layout. When it fails, iter() still
    succeeds (as torch's: no user code runs there), the error comes at the batch it belongs to,
    the loop goes on with the next batches, and the next epoch learns the layout again."""
    loader = feedline.DataLoader(Faulty(bad={0}), batch_size=4, num_workers=2)
    for _ in range(2):
        it = iter(loader)
        with pytest.raises(KeyError, match="dataset\\[0\\]"):
            next(it)
        assert torch.cat(list(it)).flatten().tolist() == list(range(4, 40))
    assert loader.executor == "process"


def test_a_hung_first_sample_times_out_in_its_worker():
    """timeout= also bounds the sample that teaches the layout (it used to run in the training
    process, outside timeout=, and a hung one blocked forever)."""
    loader = feedline.DataLoader(Faulty(sleep={0}), batch_size=4, num_workers=2, timeout=1)
    it = iter(loader)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1"):
        next(it)
    assert time.monotonic() - t0 < 10


class Segfaults(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            import ctypes
            ctypes.string_at(0)  # a segfault, as a broken C extension makes one
        return torch.tensor([i])


def test_a_segfault_in_the_first_sample_is_a_worker_crash():
    """torch's test_segfault: the training process survives and gets a RuntimeError (the
    probe used to run the sample in the training process, which died with it)."""
    loader = feedline.DataLoader(Segfaults(), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: "
                                           r"Segmentation fault \(SIGSEGV\)"):
        next(iter(loader))


_HUNG_THREAD = """
import threading, time, torch, feedline
import torch.utils.data as tud

class Hangs(tud.Dataset):
    def __init__(self):
        self.hang = True
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i == 5 and self.hang:
            threading.Event().wait()  # forever
        return torch.tensor([i])

ds = Hangs()
# persistent_workers=False (torch's default): each epoch's workers see the dataset as it is at
# iter(loader) (their own copies are made anew), so the change below reaches them.
loader = feedline.DataLoader(ds, batch_size=4, num_workers=2, executor="thread", timeout=1,
                             persistent_workers=False)
t0 = time.monotonic()
try:
    for b in loader:
        pass
except RuntimeError as e:
    print("raised", "timed out after 1" in str(e), round(time.monotonic() - t0, 1), flush=True)
ds.hang = False
t0 = time.monotonic()
print("next epoch", sum(len(b) for b in loader), round(time.monotonic() - t0, 1), flush=True)
"""


def test_timeout_with_worker_threads_raises_and_nothing_waits_for_the_hung_thread():
    """torch's DataLoader(timeout=) raises when a batch does not come in time. A worker thread
    cannot be killed as a process can: the wait for the batch is timed instead. The thread stuck
    in __getitem__ then must not hang the loop's next epoch, the iterator's release or the
    interpreter's exit (the epoch's destruction waited for it: the script never ended)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _HUNG_THREAD], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split("\n")
    raised = lines[0].split()
    assert raised[:2] == ["raised", "True"] and float(raised[2]) < 10, r.stdout
    nxt = lines[1].split()
    assert nxt[:3] == ["next", "epoch", "16"] and float(nxt[3]) < 10, r.stdout


class KillsItsWorker(tud.Dataset):
    """Sample `victim` kills the worker process loading it: once (a marker file), or always."""

    def __init__(self, marker, victim=7, always=False):
        self.marker, self.victim, self.always = marker, victim, always

    def __len__(self):
        return 30

    def __getitem__(self, i):
        if i == self.victim and tud.get_worker_info() is not None:
            if self.always or not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


class LiesInItsReply(tud.Dataset):
    """Sample `victim` makes its worker process send a malformed reply header."""

    def __init__(self, header):
        self.header = header

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5 and tud.get_worker_info() is not None:
            from feedline import _worker
            real = _worker._write_all
            header = self.header

            def lie(fd, data):
                _worker._write_all = real
                real(fd, _worker._HEADER.pack(*header))
            _worker._write_all = lie
        return torch.tensor([i])


@pytest.mark.parametrize("header", [(0, 1, 1 << 40, 0), (0, 1, (1 << 62), 0), (0, 0, 1 << 40, 0),
                                    (0, 1, -5, 0), (7, 0, 8, 0), (0, 3, 8, 0)])
def test_a_malformed_worker_reply_is_the_samples_error_and_the_worker_is_replaced(header):
    """A reply that claims a 1 TiB inline payload once threw bad_alloc in the process executor:
    the worker slot was never released and training waited forever for its batch."""
    loader = feedline.DataLoader(LiesInItsReply(header), batch_size=1, num_workers=2,
                                 executor="process", timeout=60)
    t = time.monotonic()
    it = iter(loader)
    got = [int(next(it)) for _ in range(5)]
    with pytest.raises(RuntimeError, match="malformed reply"):
        next(it)
    got += [int(b) for b in it]
    assert got == [i for i in range(12) if i != 5]
    assert loader.stats()["python"]["malformed_replies"] == 1
    assert time.monotonic() - t < 30


def test_a_dead_worker_is_replaced_and_its_sample_retried(tmp_path):
    loader = feedline.DataLoader(KillsItsWorker(str(tmp_path / "m")), batch_size=4,
                                 num_workers=2, executor="process")
    values = torch.cat(list(loader)).flatten().tolist()
    assert values == list(range(30))
    st = loader.stats()["python"]
    assert st["worker_deaths"] == 1 and st["retries"] == 1


def test_a_sample_that_always_kills_its_worker_is_a_clear_error(tmp_path):
    loader = feedline.DataLoader(KillsItsWorker(str(tmp_path / "m"), always=True),
                                 batch_size=4, num_workers=2, executor="process")
    # torch's words first (its test_segfault looks for them), then the samples it was making.
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: "
                                           r"Killed \(SIGKILL\)\. \(loading the batch of "
                                           r"dataset\[4, 5, 6, 7\]\)"):
        list(loader)


class BurnsCpu(tud.Dataset):
    """Each sample costs `ms` of its worker's CPU."""

    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.thread_time() + self.ms / 1e3
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.full((16,), i)


def test_the_autotuner_costs_a_sample_by_its_worker_process_cpu():
    """The engine's thread only waits on the worker process: the tuner once took that wait's
    CPU for the sample's cost (0.06 ms for a 3 ms PIL sample), saw capacity for 30,000 samples/s
    where there was 600, took the consumer's waits for jitter and deepened the ring to its
    memory limit (12 batches of 38 MB). The process reports its CPU with each reply."""
    loader = feedline.DataLoader(BurnsCpu(240, 3.0), batch_size=16, executor="process")
    for _ in range(3):
        for _ in loader:
            pass
    s = loader.stats()
    assert 2.0 < s["map_ms_per_sample"] < 30, s["map_ms_per_sample"]
    assert s["bottleneck"] == "map", s["bottleneck_reason"]
    assert not any("consumer waited" in d["reason"] for d in s["tuning"]), s["tuning"]


class _CpuLie:
    """A reply header whose CPU word claims 146 years."""
    def __init__(self, real):
        self.real, self.size = real, real.size

    def pack(self, status, inline, nbytes, cpu_ns):
        return self.real.pack(status, inline, nbytes, 1 << 62)


class LiesAboutItsCpu(BurnsCpu):
    def __getitem__(self, i):
        if tud.get_worker_info() is not None:
            from feedline import _worker
            if not isinstance(_worker._HEADER, _CpuLie):
                _worker._HEADER = _CpuLie(_worker._HEADER)
        return super().__getitem__(i)


def test_a_worker_process_that_lies_about_its_cpu_does_not_mislead_the_autotuner():
    """The CPU word of a reply is the process's word (146 years here): it is bounded by the
    request's wall time times the cores, so samples cannot cost more than the worker processes
    could have spent making them."""
    t = time.monotonic()
    loader = feedline.DataLoader(LiesAboutItsCpu(160, 2.0), batch_size=16, executor="process")
    for _ in range(2):
        assert sum(len(b) for b in loader) == 160
    elapsed_ms = (time.monotonic() - t) * 1e3
    s = loader.stats()
    py = s["python"]
    # At most what the processes could have spent: each request's wall time x cores (their
    # start-up included, in the first requests' wall time).
    bound = elapsed_ms * os.cpu_count() * py["processes"] / py["samples"]
    assert 1.0 < s["map_ms_per_sample"] < bound, (s["map_ms_per_sample"], bound)


class Megabyte(tud.Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((1 << 20,), i % 251, dtype=torch.uint8)


def _kib_of_children(field="Pss_Shmem"):
    """A memory figure (KiB, /proc/PID/smaps_rollup's `field`) of each child of this process
    (a child that exits while it is read, or a thread that ends, is left out: an earlier test's
    worker process may end at any time)."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/children") as f:
                pids = f.read().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as r:
                    for line in r:
                        if line.startswith(field + ":"):
                            out[int(pid)] = int(line.split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def test_worker_processes_keep_no_whole_batch_after_learning_the_layout():
    """The first batch of each worker process is made whole (16 MiB here: the layout is learned
    from it), then samples go into the slots in place. The whole batch's memory must not stay:
    torch's collate puts it in shared memory in a worker, and it crossed in the staging area,
    whose pages stayed too (2 x 36 MiB per worker on the PIL benchmark)."""
    others = set(_kib_of_children())  # children of earlier tests' loaders
    loader = feedline.DataLoader(Megabyte(), batch_size=16, num_workers=2, executor="process")
    it = iter(loader)
    for b in it:
        assert b.shape == (16, 1 << 20)
    shared = {p: kib for p, kib in _kib_of_children().items() if p not in others}
    assert len(shared) == 2 and all(kib < 4096 for kib in shared.values()), shared


def _workers_private_kib(keep_heap):
    from feedline import _worker
    others = set(_kib_of_children())
    trim = _worker._trim_heap
    if keep_heap:  # (the workers fork from here: they see it)
        _worker._trim_heap = lambda: None
    try:
        loader = feedline.DataLoader(Megabyte(), batch_size=16, num_workers=2,
                                     executor="process")
        for _ in loader:
            pass
    finally:
        _worker._trim_heap = trim
    mine = [k for p, k in _kib_of_children("Private_Dirty").items() if p not in others]
    assert len(mine) == 2
    del loader
    return min(mine)


def test_worker_processes_give_back_the_heap_of_the_batch_they_learned_from():
    """The samples of that whole batch (16 x 1 MiB) were freed into a heap that keeps up to 64
    MiB (_keep_heap: for speed while samples come one at a time), for the worker's life."""
    assert _workers_private_kib(keep_heap=True) - _workers_private_kib(keep_heap=False) > 8192


def _status_kib(field, pid="self"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_peak_and_record(directory):
    """worker_init_fn: this process's peak RSS (VmHWM) reset to its RSS now, which is recorded."""
    def init(worker_id):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open(os.path.join(directory, str(os.getpid())), "w") as f:
            f.write(str(_status_kib("VmRSS")))
    return init


def test_a_whole_batch_from_a_worker_process_exists_once_in_each_process(tmp_path):
    """A batch made whole in a worker process (the batches a layout is learned from, here 32
    MiB; batch mode) crossed as a pickle: in the worker the batch, its pickle and the pickle's
    copy in the staging area were alive at once (3x the batch), and in the loader the reply, a
    bytes copy of it and the unpickled batch (taking the batch added 2x). Now the batch's
    tensors are written into the staging area once, and the loader's batch is a view of the
    reply it holds."""
    loader = feedline.DataLoader(Megabyte(), batch_size=32, num_workers=2, executor="process",
                                 worker_init_fn=_reset_peak_and_record(str(tmp_path)))
    it = iter(loader)
    deadline = time.monotonic() + 60
    while loader.stats()["python"]["samples"] < 2:  # both replies held by the loader
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    first = next(it)
    grew = _status_kib("VmHWM") - before
    assert first.shape == (32, 1 << 20) and int(first[5, 0]) == 5
    assert grew < 8 << 10, f"the loader's peak grew {grew} KiB taking a 32 MiB batch"
    second = next(it)
    assert second.shape == (16, 1 << 20) and int(second[-1, -1]) == 47
    assert torch.equal(first[:, :4096], torch.arange(32, dtype=torch.uint8)[:, None].expand(32, 4096))
    for name in os.listdir(tmp_path):
        pid, started = int(name), int((tmp_path / name).read_text())
        grew = _status_kib("VmHWM", pid) - started
        # The batch while collated from its samples, then the batch and its copy in the
        # staging area: 2x. The pickle beside them made it 3x (96 MiB).
        assert grew < 80 << 10, f"worker {pid}'s peak grew {grew} KiB making a 32 MiB batch"
    del it, loader


class Holder:
    def __init__(self, tensor):
        self.tensor = tensor


def _odd_batch(samples):
    """A user collate_fn (batch mode) whose batch holds tensors of every kind a batch may."""
    n = len(samples)
    base = torch.arange(n * 3000, dtype=torch.float32).reshape(n, 3000) + samples[0]
    shared = torch.arange(4000, dtype=torch.int64) * samples[0]
    return {
        "half": base.half(), "bfloat": base.bfloat16(), "flags": base > 100,
        "complex": torch.complex(base, -base), "transposed": base.t(),
        "whole": shared, "view": shared[100:], "empty": torch.empty(0, 7),
        "small": torch.tensor(samples), "numpy": base.numpy().copy(),
        "grad": torch.ones(2000, requires_grad=True), "held": Holder(base * 2),
        "big": torch.full((70 << 20,), samples[0] % 7, dtype=torch.uint8) if samples[0] == 4
        else None,
    }


def test_whole_batches_from_worker_processes_keep_every_tensor_as_made():
    """Batch mode's batches cross with their large tensors beside the pickle: dtypes, shapes,
    strides, autograd flags and user objects come out as collate_fn made them,
    and a batch larger than the staging area (70 MiB: through the pipe) too."""
    data = list(range(12))
    ours = feedline.DataLoader(data, batch_size=4, num_workers=2, collate_fn=_odd_batch,
                               executor="process")
    theirs = tud.DataLoader(data, batch_size=4, num_workers=0, collate_fn=_odd_batch)
    got = list(ours)
    for a, b in zip(got, theirs):
        for k in a:
            x, y = a[k], b[k]
            if k == "held":
                x, y = x.tensor, y.tensor
            if k == "numpy":
                assert isinstance(x, np.ndarray) and np.array_equal(x, y)
                continue
            if y is None:
                assert x is None
                continue
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), k
            assert x.requires_grad == y.requires_grad and torch.equal(x, y), k
        a["transposed"][0, 0] = -1  # the batch is the loop's to change
    assert len(got) == 3 and got[1]["big"].shape == (70 << 20,) and got[1]["big"][-1] == 4


class Small(tud.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.arange(10, dtype=torch.float32) + i, i % 7


def test_small_samples_go_to_worker_processes_many_per_exchange(monkeypatch):
    """A sample of a few hundred bytes costs its worker process about what its hand-off does (a
    pipe round trip): in place, up to 64 of a batch's small samples go in one exchange (the
    pure-Python workload of `feedline-bench --python-dataset`: 0.67x torch's DataLoader with one
    exchange per sample, 1.4x with chunks). The batches are torch's. It counts exactly two
    epochs' exchanges, so the third epoch's head start (its first batches made while the second
    one's last are taken, at a time no test can fix) is off."""
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    loader = feedline.DataLoader(Small(), batch_size=64, num_workers=2, executor="process")
    theirs = list(tud.DataLoader(Small(), batch_size=64))
    for _ in range(2):
        got = list(loader)
        assert len(got) == 4
        for (x, y), (tx, ty) in zip(got, theirs):
            assert torch.equal(x, tx) and torch.equal(y, ty)
    # Epoch 0: 2 whole batches (the layout learned), the layout sent to both processes, 2
    # batches in place; epoch 1: 4 in place (one exchange per sample: 388 in all).
    assert loader.stats()["python"]["exchanges"] == 10


class FailsInAChunk(tud.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i in (21, 22):
            raise KeyError(f"no sample {i}")
        return torch.tensor([i, i])


def test_samples_of_one_exchange_fail_and_are_replaced_each_on_its_own():
    loader = feedline.DataLoader(FailsInAChunk(), batch_size=10, num_workers=2,
                                 executor="process", on_error="skip")
    got = torch.cat([b for b in loader])[:, 0].tolist()
    # Each failed sample's place is taken by another sample (on_error="skip").
    assert len(got) == 40 and set(got) == {i for i in range(40) if i not in (21, 22)}
    strict = iter(feedline.DataLoader(FailsInAChunk(), batch_size=10, num_workers=2,
                                      executor="process"))
    assert int(next(strict)[0, 0]) == 0 and int(next(strict)[0, 0]) == 10
    with pytest.raises(KeyError, match="no sample 21"):
        next(strict)
    assert int(next(strict)[0, 0]) == 30


class _LyingTable:
    """A chunk reply's table entry that points past the reply."""
    size = 24

    def pack_into(self, view, offset, status, at, size):
        struct.pack_into("<qqq", view, offset, status, 1 << 40, size)


class LiesInItsChunk(tud.Dataset):
    def __init__(self, marker):
        self.marker = marker

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 9 and tud.get_worker_info() is not None and not os.path.exists(self.marker):
            open(self.marker, "w").close()  # once: the replacement process tells the truth
            from feedline import _worker
            _worker._ENTRY = _LyingTable()
        return torch.tensor([i])


def test_a_malformed_chunk_reply_is_its_first_samples_error_and_the_worker_is_replaced(tmp_path):
    loader = feedline.DataLoader(LiesInItsChunk(str(tmp_path / "lied")), batch_size=4, num_workers=2,
                                 executor="process", on_error="skip", timeout=60)
    got = torch.cat([b for b in loader])[:, 0].tolist()
    # Batches 0 and 1 are made whole (the layout learned); 8-11 are one chunk, whose reply lies:
    # its first sample fails (another takes its place: skip), the others are made again by the
    # new process.
    assert len(got) == 12 and set(got) == {i for i in range(12) if i != 8}
    assert loader.stats()["python"]["malformed_replies"] == 1


class Slow(tud.Dataset):
    def __len__(self):
        return 300

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i])


def test_soak_random_worker_kills_lose_no_sample():
    loader = feedline.DataLoader(Slow(), batch_size=10, num_workers=2, executor="process")
    rng = random.Random(5)
    stop = threading.Event()

    seen = {}  # pid -> when the killer first saw it
    last_kill = [0.0]

    def killer():
        # A worker that dies twice on one sample is an error by design (the retry runs on a
        # fresh process): kill only workers that have lived 0.5 s, and none for 1 s after a
        # kill, so each retry (a fork and one sample, ~0.1 s) finishes even on a loaded machine
        # (a retry that took over 0.5 s there was killed too).
        while not stop.wait(rng.uniform(0.03, 0.1)):
            now = time.monotonic()
            procs = [p for p in loader._procs.values()
                     if p.is_alive() and now - seen.setdefault(p.pid, now) > 0.5]
            if procs and now - last_kill[0] > 1.0:
                try:
                    os.kill(rng.choice(procs).pid, signal.SIGKILL)
                    last_kill[0] = now
                except ProcessLookupError:
                    pass

    for _ in range(12):
        t = threading.Thread(target=killer)
        t.start()
        try:
            values = torch.cat(list(loader)).flatten().tolist()
        finally:
            stop.set()
            t.join()
        stop.clear()
        assert values == list(range(300))
    assert loader.stats()["python"]["worker_deaths"] >= 3  # 5 in three runs here


@pytest.mark.parametrize("executor", EXECUTORS)
def test_resume_mid_epoch_is_exact(executor):
    def make(workers):
        return feedline.DataLoader(Mixed(), batch_size=4, shuffle=True, num_workers=2,
                                   executor=executor, workers=workers, seed=9)

    loader = make(1)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    tail = list(it)
    assert len(head) + len(tail) == len(loader)
    resumed = make(2)
    resumed.load_state_dict(state)
    assert_batches(tail, list(resumed))
    # A state taken between epochs resumes at the next epoch's start.
    assert len(list(resumed)) == len(loader)


def test_a_state_is_validated_before_use(small_folder):
    loader = feedline.DataLoader(Mixed(), batch_size=4, shuffle=True, num_workers=2)
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    del it
    image_state = feedline.ImageLoader(small_folder, batch_size=4).state_dict()
    with pytest.raises(ValueError, match="ImageLoader"):
        loader.load_state_dict(image_state)
    for change, error, match in [
            ({"batches_done": -1}, ValueError, "batches_done"),
            ({"batches_done": 10**9}, ValueError, "batches_done"),
            ({"batches_done": 1.5}, TypeError, "batches_done"),
            ({"epochs_started": -2}, ValueError, "epochs_started"),
            ({"order": None}, ValueError, "order"),
            ({"rng_state": 5}, ValueError, "rng_state"),
            ({"version": 2}, ValueError, "version"),
            ({"iterable": True}, ValueError, "IterableDataset")]:
        bad = dict(good, **change)
        with pytest.raises(error, match=match):
            loader.load_state_dict(bad)
    no_order = dict(good)
    del no_order["order"]
    with pytest.raises(ValueError, match="order"):
        loader.load_state_dict(no_order)
    with pytest.raises(TypeError):
        loader.load_state_dict([1])
    loader.load_state_dict(good)  # still takes a good one
    assert len(list(loader)) == len(loader) - 1


def test_resume_with_a_distributed_sampler():
    ds = Mixed(30)
    sampler = tud.DistributedSampler(ds, num_replicas=2, rank=1, seed=2)
    sampler.set_epoch(5)
    loader = feedline.DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    tail = list(it)
    sampler2 = tud.DistributedSampler(ds, num_replicas=2, rank=1, seed=2)
    loader2 = feedline.DataLoader(ds, batch_size=3, sampler=sampler2, num_workers=2)
    loader2.load_state_dict(state)
    assert sampler2.epoch == 5
    assert_batches(tail, list(loader2))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_dropped_batch_frees_its_slot_without_the_cycle_collector(executor):
    """A batch the loop drops gives its slot back at once (reference counting), not when
    Python's cycle collector next runs: with worker processes the main thread allocates so few
    objects that the collector ran rarely, and the ring made a new slot for every batch
    (hundreds of MB on an ImageFolder). The collector is off here: only references count."""
    import gc
    import weakref
    loader = feedline.DataLoader(Mixed(96), batch_size=4, num_workers=2, executor=executor)
    gc.collect()
    gc.disable()
    try:
        it = iter(loader)
        batch = next(it)
        image = weakref.ref(batch["image"])
        point = weakref.ref(batch["point"].x)
        del batch
        assert image() is None and point() is None, "the dropped batch's tensors are alive"
        allocated = []
        for batch in it:
            allocated.append(loader.stats()["slots_allocated"])
        del batch
        assert len(allocated) == 23
        bound = loader.stats()["prefetch"] + 3  # in flight + the one the loop holds
        assert max(allocated) <= bound, allocated
    finally:
        gc.enable()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_dropped_loader_is_freed_at_once_with_its_workers(executor):
    """The loader and its iterator do not keep each other alive: dropping both frees the loader
    by reference counting (the collector is off here), and its worker processes exit."""
    import gc
    import weakref
    gc.collect()
    gc.disable()
    try:
        loader = feedline.DataLoader(Mixed(64), batch_size=4, num_workers=2, executor=executor)
        it = iter(loader)
        next(it)
        pids = [p.pid for p in loader._procs.values()]
        assert (executor == "process") == bool(pids)
        ref = weakref.ref(loader)
        del loader
        assert ref() is not None  # the iterator still uses it
        del it
        assert ref() is None, "a dropped loader waits for the cycle collector"
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), "its worker processes outlive it"
    finally:
        gc.enable()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class WhoAmI(tud.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        w = tud.get_worker_info()
        return torch.tensor([w.id, w.num_workers] if w is not None else [-1, -1])


def _record_init(directory):
    def init(worker_id):
        info = tud.get_worker_info()
        assert info is not None and info.id == worker_id
        name = f"{worker_id}-{os.getpid()}-{threading.get_ident()}"
        with open(os.path.join(directory, name), "w"):
            pass
    return init


@pytest.mark.parametrize("executor", EXECUTORS)
def test_worker_ids_and_worker_init_fn_as_torchs_workers(executor, tmp_path):
    """Inside the dataset get_worker_info() gives ids below num_workers, the same ids in every
    epoch; worker_init_fn runs in the worker, once per worker id (the workers persist), before
    that worker's first sample. With threads the ids used to be new for every sample (0..191
    after 3 epochs of 64) and worker_init_fn never ran."""
    loader = feedline.DataLoader(WhoAmI(), batch_size=8, num_workers=2, executor=executor,
                                 workers=2, worker_init_fn=_record_init(str(tmp_path)))
    used = set()
    for _ in range(3):
        seen = torch.cat(list(loader))
        ids, counts = seen[:, 0], seen[:, 1]
        assert bool((ids >= 0).all()) and bool((ids < counts).all()), seen
        used |= set(ids.tolist())
    assert used and used <= {0, 1}
    inits = [int(n.split("-")[0]) for n in os.listdir(tmp_path)]
    assert sorted(inits) == sorted(set(inits)), "worker_init_fn ran twice for an id"
    assert used <= set(inits) <= {0, 1}


class WorkerOfEachSample(tud.Dataset):
    """(the id worker_init_fn stored on this worker's dataset copy, num_workers, the sample, the
    torch seed), as torch's TestWorkerQueueDataset."""

    def __init__(self, n):
        self.n = n
        self.worker_id = None

    def init(self, worker_id):
        self.worker_id = worker_id

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return self.worker_id, info.num_workers, i, torch.initial_seed()


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("persistent", [True, False])
def test_num_workers_n_makes_n_processes_and_batch_k_is_worker_k_mod_n(num_workers, persistent):
    """num_workers=N is torch's N worker processes: ids 0..N-1 (3 on this 2-core machine too;
    before, the count was one per core whatever N said), num_workers=N in get_worker_info(),
    and batch k of every epoch made by worker k mod N (before: whichever worker was idle), in
    the first epoch (learning the layout) and the later ones (in place). The per-sample torch
    seed is a non-negative int64, as torch's worker seeds, so default_collate takes it."""
    ds = WorkerOfEachSample(96)
    loader = feedline.DataLoader(ds, batch_size=8, num_workers=num_workers, timeout=20,
                                 worker_init_fn=ds.init, persistent_workers=persistent)
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == 12
        for k, (worker, n, index, seed) in enumerate(batches):
            assert worker.tolist() == [k % num_workers] * 8, (epoch, k)
            assert n.tolist() == [num_workers] * 8
            assert index.tolist() == list(range(8 * k, 8 * k + 8))
            assert bool((seed >= 0).all())
    assert loader.stats()["python"]["processes"] == num_workers


_local = threading.local()


class ThreadLocalState(tud.Dataset):
    """Each sample: what worker_init_fn left in this thread's threading.local, and the thread."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([getattr(_local, "worker", -1), threading.get_ident()])


def _init_local(worker_id):
    _local.worker = worker_id


def test_thread_workers_keep_their_thread_and_its_local_data_across_epochs():
    """As torch's persistent workers keep their processes, feedline's thread workers are the same
    threads in every epoch: what worker_init_fn set up in threading.local (a database handle, a
    tokenizer) is still there. The engine used to make new threads each epoch: from the second
    epoch on, every sample saw -1."""
    loader = feedline.DataLoader(ThreadLocalState(), batch_size=8, executor="thread", workers=2,
                                 worker_init_fn=_init_local)
    # Which of the two threads makes which batch is the scheduler's business (an epoch may run
    # on one of them alone on a loaded machine), so the test counts the threads over all the
    # epochs: two at most, where new threads each epoch made six or more.
    threads = set()
    for epoch in range(3):
        seen = torch.cat(list(loader))
        assert set(seen[:, 0].tolist()) <= {0, 1} and -1 not in seen[:, 0].tolist(), epoch
        threads |= set(seen[:, 1].tolist())
    # An epoch left early does not cost the workers their state either.
    it = iter(loader)
    next(it)
    del it
    seen = torch.cat(list(loader))
    threads |= set(seen[:, 1].tolist())
    assert -1 not in seen[:, 0].tolist()
    assert len(threads) <= 2, f"{len(threads)} threads: new ones in later epochs"


def test_persistent_workers_false_runs_worker_init_fn_each_epoch():
    """As torch's workers made anew at each epoch run it again: once per worker id that made a
    sample, in every epoch (with the default, persistent_workers=True: once in all)."""
    for persistent, most in ((False, 6), (True, 2)):
        calls = []
        loader = feedline.DataLoader(ThreadLocalState(), batch_size=8, executor="thread",
                                     workers=2, worker_init_fn=calls.append,
                                     persistent_workers=persistent)
        for _ in range(3):
            assert len(torch.cat(list(loader))) == 64
        assert (3 if not persistent else 1) <= len(calls) <= most, (persistent, calls)
        assert set(calls) <= {0, 1}


class Offset(tud.Dataset):
    """Samples i + start, and the pid that made them."""

    def __init__(self):
        self.start = 0

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i + self.start, os.getpid()])


def test_persistent_workers_false_makes_new_worker_processes_each_epoch():
    """As torch's: each epoch's workers are forked anew, so they see the dataset as it is at
    iter(loader) and run worker_init_fn again; persistent workers keep theirs (and their copy
    of the dataset, torch's test_dataset_not_reset)."""
    import multiprocessing as mp
    for persistent in (False, True):
        inits = mp.Value("l", 0)

        def init(worker_id, inits=inits):
            with inits.get_lock():
                inits.value += 1

        ds = Offset()
        loader = feedline.DataLoader(ds, batch_size=4, num_workers=2, workers=2,
                                     persistent_workers=persistent, worker_init_fn=init)
        pids = []
        for epoch in range(3):
            ds.start = 100 * epoch
            got = torch.cat(list(loader))
            first = 100 * epoch if not persistent else 0
            assert got[:, 0].tolist() == list(range(first, first + 16)), (persistent, epoch)
            pids.append(set(got[:, 1].tolist()))
        assert os.getpid() not in set.union(*pids)
        if persistent:
            assert len(set.union(*pids)) <= 2 and inits.value == 2
        else:
            assert not (pids[0] & pids[1]) and not (pids[1] & pids[2]) and inits.value == 6


class StridedViews(tud.Dataset):
    """Tensors that are views with strides, as transforms return them: PILToTensor's CHW view of
    an HWC image, a transpose, a strided slice, an expanded row, a bfloat16 permute."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        hwc = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=g)
        m = torch.randn(6, 4, generator=g)
        return {"chw": hwc.permute(2, 0, 1), "t": m.t(), "every_other": m[::2, 1:],
                "expanded": (torch.arange(4, dtype=torch.int16) + i).expand(3, 4),
                "half": torch.randn(2, 3, generator=g).to(torch.bfloat16).t(),
                "wide": torch.randn(3, 8, 16, generator=g).permute(1, 2, 0), "i": i}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_strided_views_give_torchs_batches(executor):
    """Thread workers copy strided tensors into the slot themselves (no contiguous() copy
    first); the batches are torch's, byte for byte."""
    data = StridedViews()
    sample = data[0]
    assert not any(sample[k].is_contiguous() for k in ("chw", "t", "every_other", "expanded",
                                                         "half", "wide"))
    got = list(feedline.DataLoader(data, batch_size=5, num_workers=2, executor=executor))
    ref = list(tud.DataLoader(data, batch_size=5, num_workers=0))
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert_same(a, b)


class PerThreadHandle(tud.Dataset):
    """Opens a costly handle (a file, a database connection) once per thread, in a
    threading.local, as datasets read from LMDB or HDF5 do; counts the opens."""

    def __init__(self, n=240):
        # A list: each worker thread has its own (shallow) copy of the dataset, as each of
        # torch's worker processes has, and they all count here.
        self.n, self.local, self.counted, self.lock = n, threading.local(), [], threading.Lock()

    @property
    def opens(self):
        return len(self.counted)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if getattr(self.local, "handle", None) is None:
            with self.lock:
                self.counted.append(threading.get_ident())
            self.local.handle = threading.get_ident()
        return torch.tensor([i, self.local.handle == threading.get_ident()])


def test_thread_workers_keep_their_thread_local_data_between_samples():
    """A worker thread keeps one Python thread state for its life: data a dataset keeps in a
    threading.local lasts from one sample to the next. It used to be lost after every sample
    (a thread state made and freed per sample): a handle opened 240 times for 240 samples."""
    data = PerThreadHandle()
    loader = feedline.DataLoader(data, batch_size=8, num_workers=2, executor="thread")
    for _ in range(2):
        got = torch.cat(list(loader))
        assert sorted(got[:, 0].tolist()) == list(range(len(data)))
        assert bool(got[:, 1].all())
    # Worker threads are made anew at each epoch; a few per epoch, never one per sample.
    assert 1 <= data.opens <= 2 * 8, data.opens


_GC_IN_WORKER = """
import gc, time
import torch, torch.utils.data as tud
import feedline

class CollectsGarbage(tud.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        gc.collect(1)  # as allocations in a dataset's code trigger it, on the worker thread
        return torch.tensor([i])

loader = feedline.DataLoader(CollectsGarbage(), batch_size=4, num_workers=2,
                             executor="thread")
for _ in range(10):
    it = iter(loader)
    next(it)
    cycle = [it]
    cycle.append(cycle)  # the abandoned iterator is freed by the next collection
    del it, cycle
    time.sleep(0.05)
print("batches", sum(1 for _ in loader))
"""


def test_an_iterator_freed_by_a_collection_in_a_worker_does_not_kill_the_process():
    """An abandoned iterator in a reference cycle is freed by whichever thread runs the cycle
    collector: often a worker thread inside the dataset's code. Its epoch was then destroyed
    there, joining its own thread: std::terminate, the process aborted. (Worker processes run
    their collections in their own process: threads only.)"""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _GC_IN_WORKER], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "batches 250" in r.stdout, r.stdout


def test_a_second_iter_stops_the_first_loudly():
    loader = feedline.DataLoader(Mixed(), batch_size=4, num_workers=2)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        next(first)
    assert len(list(second)) == len(loader)


class Shards(tud.IterableDataset):
    """Splits itself across workers with get_worker_info(), as torch's recipes do."""

    def __init__(self, n=27):
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            yield {"x": torch.tensor([i]), "name": f"s{i}"}


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("executor", ["auto", "thread"])
def test_iterable_dataset_same_batches_as_torch(num_workers, executor):
    with warnings.catch_warnings():  # torch warns about 3 workers on 2 cores
        warnings.simplefilter("ignore")
        ref = list(tud.DataLoader(Shards(), batch_size=4, num_workers=num_workers))
    got = list(feedline.DataLoader(Shards(), batch_size=4, num_workers=num_workers,
                                   executor=executor))
    assert_batches(ref, got)


def test_the_automatic_executor_is_processes_stable_and_chosen_without_the_dataset():
    """Processes, as torch's workers, whatever the dataset does (the choice used to time the
    dataset in the training process and flipped from run to run); threads only for keys a
    process cannot take."""
    class ReleasesGil(tud.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.tensor([i])

    class Named(tud.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, key):
            return torch.tensor([len(key)])

    for _ in range(2):
        a = feedline.DataLoader(ReleasesGil(), batch_size=8, num_workers=2)
        assert torch.cat(list(a)).flatten().tolist() == list(range(64))
        assert a.executor == "process", a.stats()["python"]["reason"]
    names = feedline.DataLoader(Named(), sampler=["a", "bb", "ccc"], batch_size=2, num_workers=2)
    assert [b.flatten().tolist() for b in names] == [[1, 2], [3]]
    assert names.executor == "thread" and "not ints" in names.stats()["python"]["reason"]


class CallLog(tud.Dataset):
    """Counts every __getitem__ in every process (shared memory), and remembers the ones made
    in the training process's own thread."""

    def __init__(self, n=64, random_aug=False):
        import multiprocessing as mp
        self.n, self.random_aug = n, random_aug
        self.calls = mp.Value("l", 0)
        self.main = (os.getpid(), threading.get_ident())
        self.in_main = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.calls.get_lock():
            self.calls.value += 1
        if (os.getpid(), threading.get_ident()) == self.main:
            self.in_main.append(i)
        if self.random_aug:  # as torchvision's random transforms and numpy augmentations draw
            return torch.rand(2) + i, random.random(), np.random.rand(1)
        return torch.tensor([i])


@pytest.mark.parametrize("executor", ["auto"] + EXECUTORS)
def test_with_workers_the_training_thread_never_calls_the_dataset(executor, monkeypatch):
    """Every __getitem__ is one torch makes, in a worker: two epochs of 64 samples make 128
    calls, as torch's (the third epoch's head start off: it makes that epoch's first batches
    ahead, test_dataloader_epochs). The loader used to call the dataset in the training thread
    to learn the batch layout and to time it: thousands of calls, before worker_init_fn,
    outside timeout=."""
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    ds = CallLog()
    loader = feedline.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, executor=executor)
    for _ in range(2):
        assert sorted(torch.cat(list(loader)).flatten().tolist()) == list(range(64))
    assert ds.in_main == []
    assert ds.calls.value == 128


def _seeded_run(num_workers, executor, resume_at=None):
    """Two epochs of random augmentations, the way a training script seeds: torch.manual_seed
    then a loader; optionally stopped after `resume_at` batches and resumed in a new loader."""
    torch.manual_seed(1234)
    ds = CallLog(n=48, random_aug=True)
    kw = dict(batch_size=8, shuffle=True, num_workers=num_workers, executor=executor)
    loader = feedline.DataLoader(ds, **kw)
    out = []
    for epoch in range(2):
        it = iter(loader)
        for k, b in enumerate(it):
            out.append(b)
            if resume_at is not None and epoch == 1 and k + 1 == resume_at:
                state = loader.state_dict()
                loader.close()
                torch.manual_seed(999)  # the resumed run's own seed: the state decides
                loader = feedline.DataLoader(ds, **kw)
                loader.load_state_dict(state)
                out.extend(loader)
                break
    loader.close()
    return out


def test_random_augmentations_are_the_same_for_any_worker_count_and_after_a_resume():
    """Each sample's torch, random and numpy RNGs are seeded from (the epoch's base seed, its
    index in the epoch): the same batches with 1, 2 or 4 workers, any executor choice that runs
    processes, twice, and across a mid-epoch resume."""
    ref = _seeded_run(1, "process")
    flat = [torch.cat([b[0].flatten(), b[1].flatten(), b[2].flatten().float()]) for b in ref]
    assert len(ref) == 12 and len({tuple(x.tolist()) for x in flat}) == 12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning for 4 workers on 2 cores
        runs = [_seeded_run(w, e) for w in (1, 2, 4) for e in ("auto", "process")]
    runs.append(_seeded_run(2, "process", resume_at=3))
    for got in runs:
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert all(torch.equal(x, y) for x, y in zip(a, b))


class InitialSeed(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.initial_seed() % 1000003, random.random()


def _reseed_torch(worker_id):
    torch.manual_seed(12345)


def test_an_rng_that_worker_init_fn_seeds_is_not_seeded_per_sample():
    """torch's test_worker_init_fn: a worker_init_fn that seeds torch's RNG keeps its seed
    (torch.initial_seed() is 12345 in every sample); the RNGs it left alone are still seeded
    per sample."""
    loader = feedline.DataLoader(InitialSeed(), batch_size=2, num_workers=2,
                                 worker_init_fn=_reseed_torch)
    got = list(loader)
    assert [int(x) for b in got for x in b[0]] == [12345] * 8
    again = list(feedline.DataLoader(InitialSeed(), batch_size=2, num_workers=2,
                                     generator=torch.Generator().manual_seed(5),
                                     worker_init_fn=_reseed_torch))
    other = list(feedline.DataLoader(InitialSeed(), batch_size=2, num_workers=1,
                                     generator=torch.Generator().manual_seed(5),
                                     worker_init_fn=_reseed_torch))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(again, other))


def test_num_workers_0_draws_as_torch_and_workers_draw_only_torchs_base_seed():
    """With num_workers=0 the samples are torch's own; with workers the training process's RNG
    moves only by torch's draws (the base seed, the sampler's), so the loop's own random numbers
    after an epoch are torch's."""
    def seed():
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)

    seed()
    ref = list(tud.DataLoader(CallLog(n=24, random_aug=True), batch_size=8, shuffle=True))
    after_ref = torch.rand(3)
    seed()
    got = list(feedline.DataLoader(CallLog(n=24, random_aug=True), batch_size=8, shuffle=True,
                                   num_workers=0))
    assert torch.equal(torch.rand(3), after_ref)
    for a, b in zip(got, ref):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(7)
    list(tud.DataLoader(CallLog(n=24), batch_size=8, shuffle=True, num_workers=2))
    after_torch_workers = torch.rand(3)
    torch.manual_seed(7)
    list(feedline.DataLoader(CallLog(n=24), batch_size=8, shuffle=True, num_workers=2))
    assert torch.equal(torch.rand(3), after_torch_workers)


def test_a_dataset_that_sets_torchs_global_rng_gives_torchs_samples():
    """FakeData's way (save, seed, draw, restore torch's global RNG state) in worker processes,
    never in the training process's threads (two threads would interleave their draws, and
    torch 1.13 can deadlock between the generator's lock and the GIL)."""
    import torchvision
    threads = set()

    class Reseeds(tud.Dataset):
        def __len__(self):
            return 96

        def __getitem__(self, i):
            threads.add(threading.get_ident())
            with torch.random.fork_rng():
                torch.manual_seed(i)
                x = torch.randn(3, 16, 16)
            return x, i

    ref = list(tud.DataLoader(Reseeds(), batch_size=8))
    threads.clear()
    loader = feedline.DataLoader(Reseeds(), batch_size=8, num_workers=2)
    got = list(loader)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got))
    assert loader.executor == "process" and threads == set()
    fake = torchvision.datasets.FakeData(size=16, image_size=(3, 8, 8),
                                         transform=torchvision.transforms.PILToTensor())
    loader = feedline.DataLoader(fake, batch_size=4, num_workers=2)
    for a, b in zip(tud.DataLoader(fake, batch_size=4), loader):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --- pad=: variable-length fields padded in place, against torch's pad_sequence -------------
class Sequences(tud.Dataset):
    """Token-like samples, a fixed feature, a label. Lengths are long-tailed, and the long ones
    sit at odd indices past 100, which the loader's probe of every 4th sample of a sequential
    order never sees: the bound it learns must grow during the epoch."""

    def __init__(self, n=150, longest=300):
        self.n, self.longest = n, longest

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        short = i < 100 or i % 2 == 0
        length = 1 + (i * 7919) % 13 if short else 1 + (i * 104729) % self.longest
        return {"ids": torch.arange(length, dtype=torch.int64) + i,
                "feat": np.full((4,), i, np.float32), "label": i}


def padded_reference(dataset, batches, pad_value=0):
    out = []
    for b in batches:
        samples = [dataset[i] for i in b]
        ids = [s["ids"] for s in samples]
        out.append({"ids": torch.nn.utils.rnn.pad_sequence(ids, batch_first=True,
                                                           padding_value=pad_value),
                    "feat": torch.stack([torch.from_numpy(s["feat"]) for s in samples]),
                    "label": torch.tensor([s["label"] for s in samples]),
                    "ids_lengths": torch.tensor([len(x) for x in ids])})
    return out


@pytest.mark.parametrize("executor", EXECUTORS + ["main"])
@pytest.mark.parametrize("pad", [True, {"ids": True}])
def test_pad_equals_pad_sequence_and_grows_its_bound(executor, pad):
    ds = Sequences()
    loader = feedline.DataLoader(ds, batch_size=8, num_workers=0 if executor == "main" else 2,
                                 pad=pad, pad_value=-1,
                                 executor="auto" if executor == "main" else executor)
    restarts = []
    # Worker processes: each one's first batch is padded whole (as a collate_fn would) while
    # they learn the layout, the rest in place, the bound grown by the long samples; the grown
    # bound is kept, so the second epoch does not restart.
    for epoch in range(2):
        got = list(loader)
        restarts.append(loader.stats()["python"]["pad_restarts"])
        if executor != "process":  # padded in Python (whole batches): no bound, no restart
            restarts[-1] = 1
        ids_seen = sorted(int(x) for b in got for x in b["label"])
        assert ids_seen == list(range(len(ds))), "every sample once"
        batches = [[int(x) for x in b["label"]] for b in got]
        for b, ref in zip(got, padded_reference(ds, batches, pad_value=-1)):
            assert list(b) == ["ids", "feat", "label", "ids_lengths"]
            for k in ref:
                assert b[k].dtype == ref[k].dtype and torch.equal(b[k], ref[k]), k
    bounds = loader.stats()["python"]["pad_bounds"]
    assert executor != "process" or bounds["sample['ids']"][0] >= 300
    assert restarts[0] >= 1 and restarts[1] == restarts[0]


@pytest.mark.parametrize("executor", EXECUTORS + ["main"])
def test_pad_with_irregular_batches_pads_each_batch(executor):
    """A batch_sampler of varying batch sizes: the batches are made whole in Python (in the
    workers, or the calling thread), padded there as pad= asks."""
    ds = Sequences(n=200, longest=60)
    rng = np.random.default_rng(5)
    order = list(rng.permutation(len(ds)))
    batches, at = [], 0
    while at < len(order):
        n = int(rng.integers(1, 9))
        batches.append([int(i) for i in order[at:at + n]])
        at += n
    loader = feedline.DataLoader(ds, batch_sampler=batches, pad=True, pad_value=-1,
                                 num_workers=0 if executor == "main" else 2,
                                 executor="auto" if executor == "main" else executor)
    got = list(loader)
    assert [[int(x) for x in b["label"]] for b in got] == batches
    for b, ref in zip(got, padded_reference(ds, batches, pad_value=-1)):
        assert list(b) == ["ids", "feat", "label", "ids_lengths"]
        for k in ref:
            assert b[k].dtype == ref[k].dtype and torch.equal(b[k], ref[k]), k


def test_pad_with_skip_never_drops_an_overflowing_sample():
    ds = Sequences()
    loader = feedline.DataLoader(ds, batch_size=10, num_workers=2, pad=True, on_error="skip",
                                 executor="thread")
    got = list(loader)
    assert [int(x) for b in got for x in b["label"]] == list(range(len(ds)))
    assert max(int(b["ids_lengths"].max()) for b in got) > 100


def test_pad_tuple_samples_give_padded_and_lengths_pairs():
    class Pairs(tud.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return torch.ones(1 + i % 5, 3) * i, i

    loader = feedline.DataLoader(Pairs(), batch_size=4, num_workers=1, pad={0: 64})
    (x, lengths), y = next(iter(loader))
    assert x.shape == (4, 4, 3) and lengths.tolist() == [1, 2, 3, 4]
    ref = torch.nn.utils.rnn.pad_sequence([Pairs()[i][0] for i in range(4)], batch_first=True)
    assert torch.equal(x, ref) and y.tolist() == [0, 1, 2, 3]


def test_pad_fixed_bound_overflow_is_grown_and_without_pad_is_torchs_error():
    ds = Sequences(n=120, longest=40)
    loader = feedline.DataLoader(ds, batch_size=16, num_workers=2, pad={"ids": 4})
    for _ in range(2):  # whole batches, then in place
        got = list(loader)
        assert sum(len(b["label"]) for b in got) == 120
    assert loader.stats()["python"]["pad_restarts"] >= 1
    with pytest.raises(RuntimeError, match="pad=True"):
        list(feedline.DataLoader(ds, batch_size=16, num_workers=2))


def test_pad_arguments_are_checked():
    with pytest.raises(TypeError, match="pad"):
        feedline.DataLoader(Sequences(), pad="yes")
    with pytest.raises(ValueError, match=r"pad\['ids'\]"):
        feedline.DataLoader(Sequences(), pad={"ids": -3})
    with pytest.raises(ValueError, match="collate_fn"):
        feedline.DataLoader(Sequences(), pad=True, collate_fn=lambda b: b)
    with pytest.raises(ValueError, match="no tensor field named 'nope'"):
        next(iter(feedline.DataLoader(Sequences(), batch_size=4, num_workers=1,
                                      pad={"nope": True})))


# --- where the work runs -------------------------------------------------------------------
def test_the_layout_is_learned_once_in_a_worker_after_worker_init_fn():
    """The first sample is made in a worker process, after worker_init_fn, with
    get_worker_info() set; the processes then keep what worker_init_fn set up (it runs once
    per process, also when the layout is learned and when a padded bound grows)."""
    import multiprocessing as mp
    inits = mp.Value("l", 0)

    class NeedsInit(tud.Dataset):
        handle = None

        def __len__(self):
            return 150

        def __getitem__(self, i):
            info = tud.get_worker_info()
            assert info is not None and self.handle == ("opened", info.id), (info, self.handle)
            # Long samples only at odd indices past 100: the learned bound must grow.
            longest = 13 if i < 100 or i % 2 == 0 else 300
            return {"ids": torch.arange(1 + (i * 7919) % longest)}

    def init(worker_id):
        with inits.get_lock():
            inits.value += 1
        info = tud.get_worker_info()
        info.dataset.handle = ("opened", worker_id)

    loader = feedline.DataLoader(NeedsInit(), batch_size=8, num_workers=2, workers=2, pad=True,
                                 worker_init_fn=init)
    for _ in range(2):
        assert len(list(loader)) == 19
    py = loader.stats()["python"]
    assert py["pad_restarts"] >= 1 and inits.value == 2, (py, inits.value)


def test_off_cpu_time_counts_waits_inside_the_dataset():
    """The GIL-bound time that only the old figure missed: waits inside the dataset's code (PIL
    releases the GIL to decode and takes it back; here a sleep). With two threads on PIL's
    ImageFolder they are ~7% of the call time, against ~0.4% waited before samples."""
    class Sleeps(tud.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            time.sleep(0.005)  # off a CPU, GIL released
            return torch.tensor([i])

    loader = feedline.DataLoader(Sleeps(), batch_size=8, num_workers=2, executor="thread")
    assert torch.cat(list(loader)).flatten().tolist() == list(range(40))
    py = loader.stats()["python"]
    assert py["call_s"] >= 40 * 0.005 and py["off_cpu_s"] >= 0.8 * 40 * 0.005, py
    assert py["off_cpu_s"] <= py["call_s"], py


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_device_cuda_goes_through_the_copy_stage_and_fails_clearly_without_a_gpu():
    loader = feedline.DataLoader(Mixed(), batch_size=4, num_workers=2, device="cuda")
    t = time.perf_counter()
    with pytest.raises(feedline.DeviceError, match="cuda"):
        next(iter(loader))
    assert time.perf_counter() - t < 10
    assert loader.executor in ("thread", "process")  # the copy stage needs the engine


class _Range(tud.IterableDataset):
    def __iter__(self):
        return iter(range(20))


def test_torch_api_details_of_the_loader_object():
    """What torch's DataLoader does that a rename must keep: typing subscripts, attributes
    fixed after construction, multiprocessing_context checked, an IterableDataset left at
    torch's num_workers=0 (replicas would each yield the whole stream)."""
    from typing import List
    assert feedline.DataLoader[List[torch.Tensor]] is not None
    dl = feedline.DataLoader(Mixed(), batch_size=2)
    for attr, value in [("batch_size", 4), ("sampler", None), ("batch_sampler", None),
                        ("drop_last", True), ("dataset", Mixed()), ("persistent_workers", True)]:
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after "
                                             "DataLoader is initialized"):
            setattr(dl, attr, value)
    dl.num_workers = 0  # not one of them, as in torch
    with pytest.raises(ValueError, match="multi-process loading"):
        feedline.DataLoader(Mixed(), num_workers=0, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="valid start method"):
        feedline.DataLoader(Mixed(), num_workers=2, multiprocessing_context="nope")
    with pytest.raises(TypeError, match="valid context object"):
        feedline.DataLoader(Mixed(), num_workers=2, multiprocessing_context=3)
    feedline.DataLoader(Mixed(), num_workers=2, multiprocessing_context="fork")
    items = [int(x) for b in feedline.DataLoader(_Range(), batch_size=1) for x in b]
    assert items == list(range(20))


_EARLY_IMPORT = r"""
from torch.utils.data import get_worker_info   # before feedline, as many datasets do
import torch
import torch.utils.data as tud
import feedline

class WhoAmI(tud.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([-1 if info is None else info.id, -1 if info is None else info.num_workers])

for executor in ("thread", "process"):
    rows = torch.cat(list(feedline.DataLoader(WhoAmI(), batch_size=4, num_workers=2,
                                              executor=executor)))
    assert (rows[:, 0] >= 0).all() and (rows[:, 1] == 2).all(), (executor, rows.tolist())
rows = torch.cat(list(feedline.DataLoader(WhoAmI(), batch_size=4, num_workers=0)))
assert (rows[:, 0] == -1).all()
assert get_worker_info() is None
print("ok")
"""


def test_get_worker_info_imported_before_feedline_answers_in_thread_workers():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", _EARLY_IMPORT], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-3000:]


class _Sharded(tud.IterableDataset):
    """torch's documented idiom: worker_init_fn narrows get_worker_info().dataset's range."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def _narrow(worker_id):
    info = tud.get_worker_info()
    ds = info.dataset
    per = (ds.end - ds.start) // info.num_workers
    ds.start, ds.end = ds.start + worker_id * per, ds.start + (worker_id + 1) * per


@pytest.mark.parametrize("executor", EXECUTORS)
def test_each_worker_has_its_own_dataset_object(executor):
    ds = _Sharded(0, 40)
    dl = feedline.DataLoader(ds, batch_size=5, num_workers=2, worker_init_fn=_narrow,
                             executor=executor)
    got = sorted(int(x) for b in dl for x in b)
    assert got == list(range(40))  # each item once: the workers' narrowing did not collide
    assert (ds.start, ds.end) == (0, 40)  # the loader's own dataset is untouched


# --- DataPipes, as torch 1.13 runs them ----------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("executor", ["auto", "thread"])
def test_datapipes_shuffle_and_shard_as_torch(num_workers, executor):
    """shuffle= switches the pipe's Shuffler on, seeded from the loader's generator (one seed
    shared by the workers), and sharding_filter() gives each worker its own share: the same
    items in the same order as torch's, each once (two workers used to give every item
    twice, and shuffle=True was refused)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    def pipe():
        return IterableWrapper(range(40)).shuffle().sharding_filter().map(lambda x: x * 10)

    for shuffle in (True, False):
        torch.manual_seed(3)
        ref = [int(x) for x in tud.DataLoader(pipe(), batch_size=None, shuffle=shuffle,
                                              num_workers=num_workers)]
        torch.manual_seed(3)
        loader = feedline.DataLoader(pipe(), batch_size=None, shuffle=shuffle,
                                     num_workers=num_workers, executor=executor)
        got = [int(x) for x in loader]
        assert got == ref and sorted(got) == list(range(0, 400, 10))
        assert (got != sorted(got)) == shuffle
        torch.manual_seed(4)  # another seed, another order; the loader's RNG draws are torch's
        assert [int(x) for x in loader] != got or not shuffle


class NamedInClass(tud.Dataset):
    """torch's NamedTupleDataset: a namedtuple that pickle cannot find by its name."""
    from collections import namedtuple
    Batch = namedtuple("Batch", ["data", "label"])

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return self.Batch(data=torch.tensor([i]), label=i)


def test_batches_that_cannot_be_pickled_load_in_the_calling_thread_when_num_workers_is_left_out():
    """torch's default (num_workers=0) loads them in the calling process; feedline's default
    (parallel) cannot send them from a worker, so it does the same, and says why. An explicit
    worker count fails as torch's workers do."""
    loader = feedline.DataLoader(NamedInClass(), batch_size=2)
    for _ in range(2):
        got = list(loader)
        assert [b.label.tolist() for b in got] == [[0, 1], [2, 3], [4, 5]]
        assert all(isinstance(b, NamedInClass.Batch) for b in got)
    assert loader.executor == "main" and "pickled" in loader.stats()["python"]["reason"]
    with pytest.raises(Exception, match="pickle|Batch"):
        list(feedline.DataLoader(NamedInClass(), batch_size=2, num_workers=2))


def test_a_seeded_training_script_is_bit_identical_for_any_worker_count():
    """issue 31's script: torch.manual_seed, random torchvision augmentations, two epochs of
    SGD. The trained weights are bit-identical for 1, 2 and 4 workers, with the automatic
    executor and with processes, run after run (torch manages this for one worker count only);
    with num_workers=0 they equal torch's own loop."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeded_training.py")

    def run(*args):
        r = subprocess.run([sys.executable, "-W", "ignore", script, *map(str, args)],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    digests = {(w, e, k): run("feedline", w, e) for w in (1, 2, 4) for e in ("auto", "process")
               for k in range(2 if w == 2 else 1)}
    assert len(set(digests.values())) == 1, digests
    assert run("feedline", 0) == run("torch", 0)
