"""Offload: an epoch's batches made partly here and partly on a Dask cluster.

A batch's bytes depend only on (the loader's spec, epoch, batch number): the sample order, each
sample's augmentation draws and a failed sample's replacement all come from them, never from
the thread or machine that makes it. So any machine can make batch k of epoch e, a lost batch
is made again elsewhere with the same bytes, and the resume state is the loader's own.

The trainer's process keeps its pipeline and makes the batches it has cores for
(``Loader.start_batches``); the cluster's workers each keep a loader per spec (threads, caches
warm between tasks) and make the rest, reading the source themselves (shared file system,
HTTP, S3, shards): the trainer never ships raw bytes, it receives finished batches (uint8 stays
uint8) as Dask's out-of-band buffers, without a copy into Python objects.
"""

import collections
import hashlib
import os
import pickle
import threading
import time
import uuid
import warnings

from . import _feedline
from ._util import _is_url

_PRODUCERS = collections.OrderedDict()  # spec key -> loader, on a Dask worker (LRU)
_PRODUCERS_LOCK = threading.Lock()
_MAX_PRODUCERS = 4
FACES = {}  # face name -> loader class (each face's module adds itself)


def image_spec(args, seed, rank, world_size):
    """The picklable spec of an ImageLoader made with `args`: what a worker needs to make its
    batches (paths made absolute, the seed and the rank split resolved, CPU output)."""
    spec = dict(args)
    for name in ("offload", "num_workers", "pin_memory", "return_index"):
        spec.pop(name, None)
    source = spec["source"]
    if isinstance(source, (list, tuple)):
        spec["source"] = [p if _is_url(os.fspath(p)) else os.path.abspath(os.fspath(p))
                          for p in source]
    elif isinstance(source, (str, bytes, os.PathLike)):
        source = os.fsdecode(os.fspath(source))
        spec["source"] = source if _is_url(source) else os.path.abspath(source)
    # On a worker the loader is the work: its decoder threads at the worker's own priority
    # (below it, any other thread there, Dask's own included, would starve them).
    spec.update(seed=seed, rank=rank, world_size=world_size, device="cpu",
                epoch_head_start=False, worker_nice=0)
    return ("image", spec)


def _producer(spec):
    """This process's loader for `spec` (kept warm for the next task of the same spec)."""
    key = hashlib.sha256(pickle.dumps(spec)).hexdigest()
    with _PRODUCERS_LOCK:
        loader = _PRODUCERS.get(key)
        if loader is not None:
            _PRODUCERS.move_to_end(key)
            return loader
    face, args = spec
    if face not in FACES:
        raise ValueError(f"feedline offload: no producer for {face!r} loaders")
    loader = FACES[face](**args)
    with _PRODUCERS_LOCK:
        _PRODUCERS[key] = loader
        while len(_PRODUCERS) > _MAX_PRODUCERS:
            _PRODUCERS.popitem(last=False)
    return loader


def _array(view):
    """A batch column as a numpy array of its own (the slot goes back to the pipeline).
    bfloat16, which numpy lacks, travels as its 16-bit pattern."""
    import numpy as np
    try:
        return np.array(np.from_dlpack(view), copy=True)
    except (BufferError, TypeError, RuntimeError):
        import torch
        return torch.from_dlpack(view).view(torch.int16).numpy().copy()


def make_batches(spec, epoch, batches):
    """Batches `batches` (ascending) of `epoch` of the loader `spec` describes, made in this
    process: (arrays, made, seconds) where `made` lists (batch number, None) for each batch made, its
    images, labels and indices the next three of `arrays`, and (batch number, message) for a
    batch whose sample failed (on_error="raise"; the message names the file), so that the error
    reaches the trainer at that batch, and `seconds` the time it took (the cluster's rate, for
    the share of the next epoch). (A flat list of arrays first: Dask then sends each as
    its own frames, without pickling the pixels.)"""
    t0 = time.perf_counter()
    loader = _producer(spec)
    run = loader._loader.start_batches(int(epoch), [int(b) for b in batches])
    arrays, made = [], []
    try:
        for b in batches:
            try:
                images, labels, indices, index = run.next()
            except _feedline.DataError as e:
                made.append((b, str(e)))
                continue
            if index != b:
                raise RuntimeError(f"feedline offload: made batch {index} for batch {b}")
            arrays += [_array(images), _array(labels), _array(indices)]
            made.append((b, None))
    finally:
        run.cancel()
    return arrays, made, time.perf_counter() - t0


def _connect(offload):
    """(client, whether this loader made it) for a distributed.Client or a scheduler address."""
    try:
        import distributed
    except ImportError as e:
        raise ImportError("feedline offload needs Dask distributed (Debian: python3-distributed)"
                          ) from e
    if isinstance(offload, distributed.Client):
        return offload, False
    if not isinstance(offload, str):
        raise TypeError(f"offload: expected a distributed.Client or a scheduler address, got "
                        f"{type(offload).__name__}")
    try:
        return distributed.Client(offload, timeout=10, set_as_default=False), True
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
    """One loader's link to a cluster: its client, the spec its workers make batches from, the
    share of each epoch leased to them (tuned from epoch to epoch) and the figures."""

    def __init__(self, offload, spec, local_cores=None):
        self.client, self._own_client = _connect(offload)
        self.spec = spec
        self.address = getattr(self.client.scheduler, "address", None) or str(offload)
        self.active = True
        self.steal = True  # the tail of an epoch nobody leased yet is made here
        remote = self.remote_threads()
        if local_cores is None:
            local_cores = max(1, len(os.sched_getaffinity(0)) - 1)  # one core is the trainer's
        # The first epoch's share, by cores; then by the rates measured (Epoch._ended).
        self.share = remote / (remote + local_cores) if remote > 0 else 0.0
        self.counts = collections.Counter()
        self.latency_s = 0.0  # mean from lease to batch received
        self.bytes = 0

    def remote_threads(self):
        try:
            return sum(self.client.nthreads().values())
        except Exception:  # noqa: BLE001 (a scheduler that went: no remote threads)
            return 0

    def lose(self, why):
        """The cluster is gone: local production from now on, said once."""
        if self.active:
            self.active = False
            warnings.warn(f"feedline offload: {why}; making every batch locally from now on",
                          RuntimeWarning, stacklevel=4)

    def stats(self):
        c = self.counts
        made = c["local"] + c["remote"]
        return {
            "scheduler": self.address,
            "active": self.active,
            "remote_threads": self.remote_threads() if self.active else 0,
            "share": self.share,
            "batches_local": c["local"],
            "batches_remote": c["remote"],
            "batches_remade": c["remade"],
            "remote_fraction": c["remote"] / made if made else 0.0,
            "remote_latency_ms": 1000.0 * self.latency_s,
            "bytes_received": self.bytes,
        }

    def close(self):
        if self._own_client:
            try:
                self.client.close(timeout=2)
            except Exception:  # noqa: BLE001 (a scheduler already gone)
                pass


def _remote_set(n, start, share):
    """The batches of [start, n) leased to the cluster: `share` of them, spread evenly (a batch
    is remote when its stride step crosses an integer), so that both sides work on every part
    of the epoch and the consumer waits on neither for long."""
    out = []
    acc = 0.0
    for b in range(start, n):
        acc += share
        if acc >= 1.0 - 1e-9:
            acc -= 1.0
            out.append(b)
    return out


class Epoch:
    """One epoch of an offloading loader: batches in order, each once, made here or remotely."""

    def __init__(self, owner, epoch, start, return_index):
        import torch
        self._torch = torch
        self._owner = owner
        self._off = owner._offload
        self._epoch = epoch
        self._n = len(owner)
        self._next = start
        self._return_index = return_index
        remote = _remote_set(self._n, start, self._off.share) if self._off.active else []
        remote_set = set(remote)
        self._pending = collections.deque(remote)  # leased to nobody yet
        self._futures = {}  # batch -> (future, submitted at)
        self._results = {}  # batch -> what make_batches gave for it
        self._local = collections.deque(b for b in range(start, self._n) if b not in remote_set)
        self._run = None
        self._t0 = time.perf_counter()
        self._remote_made = 0
        self._local_made = 0
        self._wait_remote = 0.0  # the consumer's time blocked on the cluster's batches
        self._remote_busy = 0.0  # the workers' time making this epoch's batches
        self._stolen = False
        threads = self._off.remote_threads()
        self._depth = 4 * threads + 2  # leases in flight
        self._straggler_s = 30.0
        self._start_local()
        self._submit()

    # --- the local side -------------------------------------------------------------------
    def _start_local(self):
        if self._run is not None:
            self._run.cancel()
            self._run = None
        if self._local:
            self._run = self._owner._loader.start_batches(self._epoch, list(self._local))

    def _make_here(self, batches):
        """`batches` (leased, lost or stolen) join the local plan; the local run restarts with
        what it had not yet delivered (its prefetched batches are made again: rare)."""
        for b in batches:
            self._futures.pop(b, None)
        self._local = collections.deque(sorted(set(self._local) | set(batches)))
        self._start_local()

    # --- the remote side ------------------------------------------------------------------
    def _submit(self):
        if not self._off.active:
            return
        in_flight = len(self._futures)
        client = self._off.client
        while self._pending and in_flight < self._depth:
            b = self._pending.popleft()
            try:
                f = client.submit(make_batches, self._off.spec, self._epoch, [b], pure=False,
                                  key=f"feedline-batch-{self._epoch}-{b}-{uuid.uuid4().hex}")
            except Exception as e:  # noqa: BLE001 (a client that lost its scheduler)
                self._pending.appendleft(b)
                self._off.lose(f"cannot submit to the Dask scheduler at {self._off.address}: {e}")
                self._make_here(list(self._pending) + list(self._futures))
                self._pending.clear()
                return
            self._futures[b] = (f, time.perf_counter())
            in_flight += 1

    def _steal_tail(self):
        """The local plan is delivered: what nobody leased yet is made here."""
        if self._off.steal and self._pending and (not self._local or
                                                  self._local[0] > self._pending[0]):
            self._stolen = True
            batches = list(self._pending)
            self._pending.clear()
            self._make_here(batches)

    def _take_remote(self, b):
        """Batch b's result from the cluster, or None when it is to be made here instead."""
        import distributed
        f, submitted = self._futures[b]
        while True:
            if self._off.client.status not in ("running", "connecting"):
                self._off.lose(f"the Dask scheduler at {self._off.address} is gone "
                               f"(client {self._off.client.status})")
                self._make_here([b] + list(self._pending) + list(self._futures))
                self._pending.clear()
                return None
            try:
                got = f.result(timeout=0.25)
                break
            except TimeoutError:
                if time.perf_counter() - submitted > self._straggler_s:
                    f.cancel()
                    self._off.counts["remade"] += 1
                    self._make_here([b])
                    return None
            except Exception as e:  # noqa: BLE001 (sorted below)
                if _lost(e) or isinstance(e, distributed.TimeoutError):
                    f.cancel()
                    self._off.counts["remade"] += 1
                    self._make_here([b])
                    return None
                raise RuntimeError(f"feedline offload: the cluster could not make batch {b} of "
                                   f"epoch {self._epoch}: {type(e).__name__}: {e}") from e
        del self._futures[b]
        latency = time.perf_counter() - submitted
        n = self._off.counts["remote"]
        self._off.latency_s += (latency - self._off.latency_s) / (n + 1)
        arrays, made, seconds = got
        self._remote_busy += seconds
        k = 0
        for got_b, error in made:
            if error is None:
                self._results[got_b] = (arrays[k:k + 3], None)
                k += 3
            else:
                self._results[got_b] = (None, error)
        self._remote_made += 1
        f.release()
        return self._results.pop(b)

    # --- iteration ------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __len__(self):
        return self._n

    def __next__(self):
        b = self._next
        if b >= self._n:
            self.close()
            self._ended()
            raise StopIteration
        self._submit()
        if b not in self._futures and (not self._local or self._local[0] != b):
            self._steal_tail()  # the local plan ended early (its last batch raised, say)
        got = None
        if b in self._futures:
            t0 = time.perf_counter()
            got = self._take_remote(b)
            self._wait_remote += time.perf_counter() - t0
            self._submit()
        if got is None:
            if not self._local or self._local[0] != b:
                raise RuntimeError(f"feedline offload: batch {b} has no maker (a bug)")
            self._local.popleft()
            self._next += 1
            images, labels, indices, index = self._run.next()  # raises the batch's DataError
            self._off.counts["local"] += 1
            self._local_made += 1
            if not self._local:
                self._steal_tail()
            out = (self._torch.from_dlpack(images), self._torch.from_dlpack(labels),
                   self._torch.from_dlpack(indices))
        else:
            self._next += 1
            self._off.counts["remote"] += 1
            arrays, error = got
            if error is not None:
                raise _feedline.DataError(error)
            images, labels, indices = (self._torch.from_numpy(a) for a in arrays)
            if self._owner._args.get("dtype") == "bfloat16":
                images = images.view(self._torch.bfloat16)
            self._off.bytes += sum(a.nbytes for a in arrays)
            out = (images, labels, indices)
        if self._next >= self._n:
            self._owner._offload_at = None
        else:
            self._owner._offload_at = (self._epoch, self._next)
        return out if self._return_index else out[:2]

    def _ended(self):
        """Tunes the next epoch's share from the rates the two sides made batches at. The side
        the consumer waited for was busy all epoch: its rate is what it made over the epoch.
        The other side's is what it made in the time it worked: the local pipeline's while the
        consumer was not blocked on the cluster, the cluster's from its workers' task times
        (an upper bound: Dask's own time between tasks is not in it)."""
        if not self._off.active:
            return
        elapsed = time.perf_counter() - self._t0
        if elapsed <= 0 or self._remote_made == 0 or self._local_made == 0:
            return
        local_rate = self._local_made / max(1e-3, elapsed - self._wait_remote)
        if self._wait_remote > 0.05 * elapsed:  # the cluster was the bottleneck
            remote_rate = self._remote_made / elapsed
        else:
            threads = max(1, self._off.remote_threads())
            remote_rate = self._remote_made / max(1e-3, self._remote_busy / threads)
        share = remote_rate / (remote_rate + local_rate)
        self._off.share = min(0.95, max(0.05, 0.5 * (self._off.share + share)))

    def close(self):
        if self._run is not None:
            self._run.cancel()
            self._run = None
        for f, _ in self._futures.values():
            try:
                f.cancel()
            except Exception:  # noqa: BLE001 (a client already closed)
                pass
        self._futures.clear()
        self._pending.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
