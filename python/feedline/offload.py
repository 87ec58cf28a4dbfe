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
import hashlib
import os
import pickle
import threading
import time
import uuid
import warnings

from . import _feedline
from ._epoch import _warn_replaced
from ._util import _is_url

_PRODUCERS = collections.OrderedDict()  # spec key -> loader, on a Dask worker (LRU)
_PRODUCERS_LOCK = threading.Lock()
_REPORTED = {}  # spec key -> {(epoch, sample)} of the errors already returned, under the lock
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
    process: (arrays, made, errors) where `made` lists (batch number, None) for each batch made,
    its images, labels and indices the next three of `arrays`, and (batch number, message) for a
    batch whose sample failed (on_error="raise"; the message names the file), so that the error
    reaches the trainer at that batch; `errors` are the epoch's samples this process's loader
    replaced (on_error="skip", stats()["errors"] entries) not returned before. (A flat list of
    arrays first: Dask then sends each as its own frames, without pickling the pixels.)"""
    key, loader = _producer(spec)
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
    return arrays, made, _new_errors(key, loader, int(epoch))


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
    """One loader's link to a cluster: its client, the spec its workers make batches from, the
    loader that remakes batches the cluster lost, and the figures."""

    def __init__(self, offload, spec):
        self.client = _connect(offload)
        self.spec = spec
        self.address = getattr(self.client.scheduler, "address", None) or str(offload)
        self.active = True
        self.local = True  # this process makes batches too (off: every batch remote, to measure)
        self.counts = collections.Counter()
        self.latency_s = 0.0  # from lease to done, averaged over the last ~20
        self.step_s = 0.0  # the consumer's time per batch, smoothed
        self.bytes = 0
        self._rescue = None
        # Samples the cluster and the rescue loader replaced (on_error="skip"), for stats().
        self.errors = []
        self.error_count = 0
        self._rescue_counted = 0  # of the rescue loader's errors, those already in `errors`

    def remote_threads(self):
        try:
            return sum(self.client.nthreads().values())
        except Exception:  # noqa: BLE001 (a scheduler that went: no remote threads)
            return 0

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
        }


_NOBODY, _LOCAL, _REMOTE = 0, 1, 2  # BatchFeed owners


def _own_errors(owner):
    """The samples that failed in the loader's own engine (not the cluster's)."""
    return owner._loader.stats().get("error_count", 0)


class Epoch:
    """One epoch of an offloading loader: batches in order, each once, made here or remotely.

    The epoch's full batches go through one BatchFeed: the loader's run claims the next one
    whenever its prefetch bound has room, the cluster whenever fewer than `depth` of its
    batches are in flight (from the consumer's thread and from each lease's completion), so
    each side makes what it can and neither waits for a share set in advance. A short last
    batch is made at its turn on its own. Batches the cluster lost are remade in this process.
    """

    def __init__(self, owner, epoch, start, return_index):
        import torch
        self._torch = torch
        self._owner = owner
        self._off = owner._offload
        self._epoch = epoch
        self._n = len(owner)
        self._next = start
        self._return_index = return_index
        self._lock = threading.Lock()
        self._futures = {}  # batch -> (future, submitted at), under _lock
        self._running = set()  # keys of the futures not yet done, under _lock
        self._submitted = {}  # key -> when it was submitted, until done (latency), under _lock
        self._lost = []     # leased batches the cluster lost, to be made here
        self._rescue = None  # (epoch run, its batches in order) remaking lost batches
        self._closed = False
        # Replaced samples (on_error="skip"), for the epoch's one warning.
        self._errors_at_start = _own_errors(owner)
        self._remote_errors = []
        full = min(self._n, owner._loader.num_samples // owner.batch_size)
        self._full = max(start, full)
        self._feed = _feedline.BatchFeed(start, self._full) if self._full > start else None
        self._run = None
        if self._feed is not None and (self._off.local or not self._off.active):
            self._run = owner._loader.start_from_feed(epoch, self._feed)
        # Remote batches in flight: one running and one queued per worker thread.
        self._depth = 2 * max(1, self._off.remote_threads()) + 1
        self._last_t = time.perf_counter()
        self._top_up()

    # --- the cluster's side: claims from the feed, leases, results ------------------------
    def _top_up(self, _future=None):
        """Leases the feed's next batches to the cluster while it has fewer than `depth` in
        flight (also run by each lease's completion, on Dask's callback thread)."""
        if self._feed is None or not self._off.active:
            return
        with self._lock:
            if _future is not None:  # a lease came back: its time from submission to done
                self._running.discard(_future.key)
                submitted = self._submitted.pop(_future.key, None)
                if submitted is not None:
                    n = self._off.counts["leases"]
                    self._off.counts["leases"] += 1
                    latency = time.perf_counter() - submitted
                    self._off.latency_s += (latency - self._off.latency_s) / min(n + 1, 20)
            # In flight: `depth` running or queued on the workers; held: what came back and
            # waits for its turn too (memory), at most the lead's worth more.
            while (not self._closed and len(self._running) < self._depth and
                   len(self._futures) < self._depth + self._lead() + 2):
                b = self._feed.claim_remote(self._lead())
                if b < 0:
                    return
                try:
                    f = self._off.client.submit(
                        make_batches, self._off.spec, self._epoch, [b], pure=False,
                        key=f"feedline-batch-{self._epoch}-{b}-{uuid.uuid4().hex}")
                except Exception as e:  # noqa: BLE001 (a client that lost its scheduler)
                    self._lost.append(b)
                    self._off.lose(f"cannot submit to the Dask scheduler at "
                                   f"{self._off.address}: {e}")
                    return
                self._futures[b] = (f, time.perf_counter())
                self._running.add(f.key)
                self._submitted[f.key] = self._futures[b][1]
                f.add_done_callback(self._top_up)

    def _lead(self):
        """How far past the lowest unclaimed batch the cluster claims: the batches the consumer
        takes while a lease is out (its latency over the time per batch), so that a leased
        batch is back before the consumer needs it and the run keeps the batches just ahead."""
        step = self._off.step_s
        if self._run is None:  # nobody else claims the lowest batches
            return 0
        if self._off.latency_s <= 0 or step <= 0:
            return self._depth
        return int(self._off.latency_s / step) + 1

    def _take_remote(self, b):
        """Batch b's arrays from the cluster, or None when it is to be made here instead."""
        import distributed
        with self._lock:
            if b not in self._futures:  # never leased (its submission failed): made here
                return None
            f, submitted = self._futures[b]
        while True:
            if self._off.client.status not in ("running", "connecting"):
                self._off.lose(f"the Dask scheduler at {self._off.address} is gone "
                               f"(client {self._off.client.status})")
                return None
            try:
                got = f.result(timeout=0.25)
                break
            except TimeoutError:
                if time.perf_counter() - submitted > _STRAGGLER_S:
                    return None
            except Exception as e:  # noqa: BLE001 (sorted below)
                if _lost(e) or isinstance(e, distributed.TimeoutError):
                    return None
                raise RuntimeError(f"feedline offload: the cluster could not make batch {b} of "
                                   f"epoch {self._epoch}: {type(e).__name__}: {e}") from e
        with self._lock:
            self._futures.pop(b, None)
        arrays, made, errors = got
        f.release()
        self._off.add_errors(errors)
        self._remote_errors += errors
        (got_b, error), = made
        return (None, error) if error is not None else (arrays, None)

    def _remake(self, b):
        """Batch b (the cluster's, lost; or the short last batch) made in this process: by the
        loader itself once its run is over, else by the rescue loader, together with the other
        lost batches still to come."""
        with self._lock:
            f = self._futures.pop(b, (None, 0))[0]
            lost = sorted({b, *self._lost} | ({x for x in self._futures} if not
                                              self._off.active else set()))
            if not self._off.active:
                for x in list(self._futures):
                    _cancel(self._futures.pop(x)[0])
            self._lost = []
        _cancel(f)
        if self._rescue is not None:
            run, queue = self._rescue
            lost = sorted(set(lost) | set(queue))
            run.cancel()
        loader = (self._owner._loader if self._run is None else
                  self._off.rescue_loader()._loader)
        queue = collections.deque(lost)
        self._rescue = (loader.start_batches(self._epoch, list(lost)), queue)

    def _from_rescue(self, b):
        run, queue = self._rescue
        if not queue or queue[0] != b:
            self._remake(b)
            run, queue = self._rescue
        queue.popleft()
        images, labels, indices, index = run.next()  # raises the batch's DataError
        if not queue:
            run.cancel()
            self._rescue = None
        return images, labels, indices

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
        self._next += 1
        now = time.perf_counter()  # the consumer's time per batch (smoothed), for _lead
        self._off.step_s += 0.1 * (now - self._last_t - self._off.step_s)
        self._last_t = now
        self._owner._offload_at = (self._epoch, self._next) if self._next < self._n else None
        self._top_up()
        if b >= self._full:  # the short last batch: the feed's run has ended
            if self._run is not None:
                self._run.cancel()
                self._run = None
            views = self._local_views(self._remade(b), count="local")
            return views if self._return_index else views[:2]
        who = self._owner_of(b)
        if who == _LOCAL:
            images, labels, indices, index = self._run.next()  # raises the batch's DataError
            if index != b:
                raise RuntimeError(f"feedline offload: the run made batch {index} for {b}")
            views = self._local_views((images, labels, indices), count="local")
        elif self._rescue is not None and self._rescue[1] and self._rescue[1][0] == b:
            views = self._local_views(self._from_rescue(b), count="remade")
        else:
            got = self._take_remote(b)
            if got is None:  # lost: made here
                views = self._local_views(self._remade(b), count="remade")
            else:
                arrays, error = got
                self._off.counts["remote"] += 1
                if error is not None:
                    raise _feedline.DataError(error)
                images, labels, indices = (self._torch.from_numpy(a) for a in arrays)
                if self._owner._args.get("dtype") == "bfloat16":
                    images = images.view(self._torch.bfloat16)
                self._off.bytes += sum(a.nbytes for a in arrays)
                views = (images, labels, indices)
        return views if self._return_index else views[:2]

    def _ended(self):
        """The epoch is over: one warning for the samples replaced here, by the rescue loader
        and on the cluster."""
        if getattr(self, "_said", False):
            return
        self._said = True
        before = self._off.error_count
        self._off.collect_rescue_errors()
        rescued = self._off.error_count - before
        own = self._owner._loader.stats()  # (not the face's stats(): it asks the scheduler too)
        n = own.get("error_count", 0) - self._errors_at_start + len(self._remote_errors) + rescued
        errors = (list(own.get("errors", [])) + self._off.errors)[-256:]
        _warn_replaced(self._owner, {"error_count": n, "errors": errors[-n:]}, 0)

    def _remade(self, b):
        self._remake(b)
        return self._from_rescue(b)

    def _local_views(self, got, count):
        self._off.counts[count] += 1
        return tuple(self._torch.from_dlpack(v) for v in got)

    def _owner_of(self, b):
        """Who makes batch b: the loader's run or the cluster (b not yet claimed: the consumer
        has taken everything claimed before it, so the run claims it as soon as its readers
        get to it, or the cluster as a lease completes)."""
        deadline = time.perf_counter() + 60.0
        while True:
            who = self._feed.owner(b)
            if who != _NOBODY:
                return who
            if self._run is None and not self._off.active:
                raise RuntimeError(f"feedline offload: batch {b} has no maker (a bug)")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"feedline offload: batch {b} was claimed by nobody in 60 s")
            time.sleep(0.0005)

    def close(self):
        with self._lock:
            self._closed = True
            futures, self._futures = self._futures, {}
        if self._feed is not None:
            self._feed.close()
        if self._run is not None:
            self._run.cancel()
            self._run = None
        if self._rescue is not None:
            self._rescue[0].cancel()
            self._rescue = None
        for f, _ in futures.values():
            _cancel(f)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


_STRAGGLER_S = 30.0  # a leased batch not back after this long is made here


def _cancel(future):
    if future is None:
        return
    try:
        future.cancel()
    except Exception:  # noqa: BLE001 (a client already closed: nothing to cancel)
        pass
