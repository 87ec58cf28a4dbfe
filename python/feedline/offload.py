"""Offload: an epoch's batches made partly here and partly on a Dask cluster.

A batch's bytes depend only on (the loader's spec, epoch, batch number), never on the thread or
machine that makes it: any machine can make batch k of epoch e, a lost batch is made again
elsewhere with the same bytes, and the resume state is the loader's own.

The trainer's process keeps its pipeline and makes the batches it has cores for
(``Loader.start_batches``); the cluster's workers each keep a loader per spec (threads, caches
warm between tasks) and make the rest, reading the source themselves (shared file system,
HTTP, S3, shards): the trainer never ships raw bytes, it receives finished batches (uint8 stays
uint8) as Dask's out-of-band buffers, without a copy into Python objects.
"""

import collections
import copy
import hashlib
import os
import pickle
import threading
import time
import uuid
import warnings

from . import _feedline
from ._util import _is_url
from ._worker import _keep_heap
from .mix import Mix

_PRODUCERS = collections.OrderedDict()  # spec key -> loader, on a Dask worker (LRU)
_PRODUCERS_LOCK = threading.Lock()
_REPORTED = {}  # spec key -> {(epoch, sample)} of the errors already returned, under the lock
_MAX_PRODUCERS = 4
FACES = {}  # face name -> loader class (each face's module adds itself)


# What each face's spec makes absolute (paths and URLs it reads), and what stays with the
# trainer's loader (how it hands batches over, its link to the cluster).
_PATHS = {"image": ("source",), "text": ("source", "tokenizer"), "tokens": ("path", "index")}
_TRAINER_ONLY = ("offload", "num_workers", "pin_memory", "return_index", "process_group")


def spec(face, args, seed, rank, world_size):
    """The picklable spec of the `face` loader made with `args` (its constructor's arguments):
    what a worker needs to make its batches (paths made absolute, the seed and the rank split
    resolved; images in host memory)."""
    spec = {k: v for k, v in args.items() if k not in _TRAINER_ONLY}
    for key in _PATHS[face]:
        spec[key] = _absolute(spec.get(key))
    # On a worker the loader is the work: its threads at the worker's own priority (below it,
    # any other thread there, Dask's own included, would starve them).
    spec.update(seed=seed, rank=rank, world_size=world_size, epoch_head_start=False,
                worker_nice=0)
    if face == "image":
        spec["device"] = "cpu"
    return (face, spec)


def _absolute(source):
    """`source` (a path, a URL, a list of them or a feedline.Mix of them) with every local path
    absolute: a worker's current directory is not the trainer's."""
    if isinstance(source, Mix):
        mix = copy.copy(source)
        mix.sources = [_absolute(s) for s in source.sources]
        return mix
    if isinstance(source, (list, tuple)):
        return [_absolute(p) for p in source]
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(source))
        return path if _is_url(path) else os.path.abspath(path)
    return source


def _producer(spec):
    """This process's loader for `spec` (kept warm for the next task of the same spec), and
    the spec's key."""
    key = hashlib.sha256(pickle.dumps(spec)).hexdigest()
    with _PRODUCERS_LOCK:
        loader = _PRODUCERS.get(key)
        if loader is not None:
            _PRODUCERS.move_to_end(key)
            return key, loader
    face, args = spec
    if face not in FACES:
        raise ValueError(f"feedline offload: no producer for {face!r} loaders")
    loader = FACES[face](**args)
    with _PRODUCERS_LOCK:
        _PRODUCERS[key] = loader
        while len(_PRODUCERS) > _MAX_PRODUCERS:
            gone, _ = _PRODUCERS.popitem(last=False)
            _REPORTED.pop(gone, None)
    return key, loader


def _new_errors(key, loader, epoch):
    """The samples of `epoch` that failed in this process's loader and were not returned yet
    (tasks of one spec share the loader: each goes back once, with the first task to end)."""
    errors = [e for e in loader.stats().get("errors", []) if e.get("epoch") == epoch]
    with _PRODUCERS_LOCK:
        seen = _REPORTED.setdefault(key, set())
        new = [e for e in errors if (e["epoch"], e["sample"]) not in seen]
        seen.update((e["epoch"], e["sample"]) for e in new)
        if len(seen) > 4096:  # older epochs' are done with
            _REPORTED[key] = {x for x in seen if x[0] >= epoch}
    return new


def _array(view):
    """A batch field as (a numpy array of its own: the slot goes back to the pipeline, whether
    it is bfloat16). bfloat16, which numpy lacks, travels as its 16-bit pattern."""
    import numpy as np
    try:
        return np.array(np.from_dlpack(view), copy=True), False
    except (BufferError, TypeError, RuntimeError):
        import torch
        return torch.from_dlpack(view).view(torch.int16).numpy().copy(), True


_SET_UP = []


def set_up_worker():
    """Once per Dask worker process, before its first batch: the heap kept as feedline's worker
    processes keep it (_worker._keep_heap). Dask starts its workers with MALLOC_TRIM_THRESHOLD_
    set, which also fixes glibc's mmap threshold at 128 KiB: every decoded image was a fresh
    mapping whose pages faulted in zeroed, and PIL's decode and resize took 2.6x the CPU they
    take in the trainer's process."""
    if not _SET_UP:
        _keep_heap()
        _SET_UP.append(True)


def make_batches(spec, epoch, batches):
    """Batches `batches` (ascending) of `epoch` of the loader `spec` describes, made in this
    process: (arrays, made, errors, seconds). `made` has an entry per batch: (batch number, None,
    fields) for a batch made, its fields' arrays the next ones of `arrays` and `fields` their
    (name, is bfloat16) pairs, then its sample indices; (batch number, message, None) for a
    batch whose sample failed (on_error="raise"; the message names the file), so that the error
    reaches the trainer at that batch. `errors` are the epoch's samples this process's loader
    replaced (on_error="skip", stats()["errors"] entries) not returned before; `seconds` the
    time it took. (A flat list of arrays: Dask sends each as its own frames, without pickling
    the pixels or tokens.)"""
    t0 = time.perf_counter()
    set_up_worker()
    key, loader = _producer(spec)
    run = loader._loader.start_batches(int(epoch), [int(b) for b in batches])
    arrays, made = [], []
    try:
        for b in batches:
            try:
                views, indices, index = run.next_fields()
            except _feedline.DataError as e:
                made.append((b, str(e), None))
                continue
            if index != b:
                raise RuntimeError(f"feedline offload: made batch {index} for batch {b}")
            fields = []
            for name, view in views.items():
                array, bf16 = _array(view)
                arrays.append(array)
                fields.append((name, bf16))
            arrays.append(_array(indices)[0])
            made.append((b, None, fields))
    finally:
        run.cancel()
    return arrays, made, _new_errors(key, loader, int(epoch)), time.perf_counter() - t0


def _connect(offload):
    """A distributed.Client: the one given, or one connected to the scheduler address given."""
    try:
        import distributed
    except ImportError as e:
        raise ImportError("feedline offload needs Dask distributed (Debian: python3-distributed)"
                          ) from e
    if isinstance(offload, distributed.Client):
        return offload
    if not isinstance(offload, str):
        raise TypeError(f"offload: expected a distributed.Client or a scheduler address, got "
                        f"{type(offload).__name__}")
    try:
        return distributed.Client(offload, timeout=10, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ConnectionError(f"offload: cannot reach the Dask scheduler at {offload}: "
                              f"{e}") from None


# Exceptions after which a batch is made here instead: the cluster lost it (a worker died more
# often than the scheduler allows, the scheduler went, a task was cancelled).
def _lost(e):
    name = type(e).__name__
    return name in ("KilledWorker", "CancelledError", "CommClosedError", "FutureCancelledError",
                    "StreamClosedError") or isinstance(e, (OSError, EOFError))


class Offload:
    """One loader's link to a cluster: its client, the spec its workers make batches from, its
    leases in flight (of the epoch iterating and the next one's first), the loader that remakes
    batches the cluster lost, and the figures."""

    def __init__(self, offload, spec):
        self.client = _connect(offload)
        self.spec = spec
        self.address = getattr(self.client.scheduler, "address", None) or str(offload)
        self.active = True
        self.local = True  # this process makes batches too (off: every batch remote, to measure)
        self.batches_per_task = None  # a lease's batches (None: tuned, see Epoch)
        self.batch_s = 0.0  # a worker's time per batch, smoothed
        self.lease_size = 0  # the last epoch's batches per lease
        self.direct = True  # results straight from the workers (off once they cannot be reached)
        self.counts = collections.Counter()
        self.latency_s = 0.0  # from lease to done, averaged over the last ~20
        self.step_s = 0.0  # the consumer's time per batch, smoothed
        self.local_rate = 0.0  # the loader's own batches per second, last epoch
        self.bytes = 0
        self._rescue = None
        # Samples the cluster and the rescue loader replaced (on_error="skip"), for stats().
        self.errors = []
        self.error_count = 0
        self._rescue_counted = 0  # of the rescue loader's errors, those already in `errors`
        # Leases (tasks making some batches of an epoch), whichever epoch they are for.
        self.lock = threading.RLock()
        self.running = set()  # keys of the leases not done yet
        self.submitted = {}  # key -> when it was submitted, until done (latency)
        self.done = {}  # key -> an Event set when the lease is done, until gathered
        self.ahead = None  # (epoch, {batch: (future, submitted)}): the next epoch's first
        self.epoch = None  # a weak reference to the epoch iterating now

    # Whether an epoch with nothing more to lease makes the next epoch's first batches: a
    # loader face's next order is (seed, epoch + 1); a DataLoader's is known when foreseen.
    leases_ahead = True

    def submit(self, epoch, lease):
        """Leases the batches `lease` (ascending) of `epoch` to the cluster (under `lock`):
        (future, when)."""
        return self.track(self.client.submit(
            make_batches, self.spec, epoch, lease, pure=False,
            key=f"feedline-batches-{epoch}-{lease[0]}-{uuid.uuid4().hex}"))

    def track(self, f):
        """A lease just submitted, counted in flight until done: (future, when)."""
        now = time.perf_counter()
        self.running.add(f.key)
        self.submitted[f.key] = now
        self.done[f.key] = threading.Event()
        f.add_done_callback(self._completed)
        return f, now

    def drop_ahead(self, unless_epoch):
        """Cancels the leases made ahead for an epoch other than `unless_epoch` (set_epoch or
        a resume chose another): the workers stop making batches nobody will take."""
        with self.lock:
            ahead = self.ahead
            if ahead is None or ahead[0] == unless_epoch:
                return
            self.ahead = None
            leases = {f.key: f for f, _ in ahead[1].values()}
            for key in leases:
                self.done.pop(key, None)
        for f in leases.values():
            try:
                f.cancel()
            except Exception:  # noqa: BLE001 (a client already closed: nothing to cancel)
                pass

    def _completed(self, f):
        """A lease is done (Dask's callback thread): its latency counted, its waiter woken, and
        the epoch iterating leases more."""
        with self.lock:
            self.running.discard(f.key)
            submitted = self.submitted.pop(f.key, None)
            if submitted is not None:  # the time from submission to done, smoothed
                n = self.counts["leases"]
                self.counts["leases"] += 1
                latency = time.perf_counter() - submitted
                self.latency_s += (latency - self.latency_s) / min(n + 1, 20)
            done = self.done.get(f.key)
        if done is not None:
            done.set()
        epoch = self.epoch() if self.epoch is not None else None
        if epoch is not None:
            epoch._top_up()

    def remote_threads(self):
        try:
            return sum(self.client.nthreads().values())
        except Exception:  # noqa: BLE001 (a scheduler that went: no remote threads)
            return 0

    def rescue_maker(self):
        """What makes batches the cluster lost while the loader's run holds its workers: an
        object with start_batches(epoch, batches), as the engine's loader."""
        return self.rescue_loader()._loader

    def rescue_loader(self):
        """A loader of the same spec in this process (its own threads, at the trainer's
        default priority) for batches the cluster lost while the loader's run holds its
        workers; made at the first loss."""
        if self._rescue is None:
            face, args = self.spec
            self._rescue = FACES[face](**dict(args, worker_nice=19))
        return self._rescue

    def add_errors(self, errors, count=None):
        self.error_count += len(errors) if count is None else count
        self.errors = (self.errors + list(errors))[-256:]

    def collect_rescue_errors(self):
        """The rescue loader's errors since the last call, into `errors`."""
        st = self._rescue.stats() if self._rescue is not None else {}
        if (n := st.get("error_count", 0) - self._rescue_counted) > 0:
            self._rescue_counted += n
            self.add_errors(st.get("errors", [])[-n:], n)

    def lose(self, why):
        """The cluster is gone: local production from now on, said once."""
        if self.active:
            self.active = False
            warnings.warn(f"feedline offload: {why}; making every batch locally from now on",
                          RuntimeWarning, stacklevel=4)

    def stats(self):
        c = self.counts
        made = c["local"] + c["remote"] + c["remade"]
        return {
            "scheduler": self.address,
            "active": self.active,
            "remote_threads": self.remote_threads() if self.active else 0,
            "batches_local": c["local"],
            "batches_remote": c["remote"],
            "batches_remade": c["remade"],
            "remote_fraction": c["remote"] / made if made else 0.0,
            "remote_latency_ms": 1000.0 * self.latency_s,
            "bytes_received": self.bytes,
            "batches_ahead": c["ahead"],
            "batches_per_lease": self.lease_size,
        }
