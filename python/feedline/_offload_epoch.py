"""An offloading loader's epoch: batches in order, each once, made here or on the cluster."""

import collections
import os
import time
import weakref

from . import _feedline
from ._epoch import _warn_replaced
from .offload import Offload, _lost, spec


def link(owner, offload, face, args, seed):
    """Links `owner` (a loader face made with constructor arguments `args`) to the cluster
    `offload` names (a distributed.Client or a scheduler's address; None: no link)."""
    if offload is not None:
        owner._offload = Offload(offload, spec(face, args, seed, owner.rank, owner.world_size))


def _full_batches(owner):
    """An epoch's full batches (a short last one is made at its turn, on its own)."""
    return min(len(owner), owner._loader.num_samples // owner.batch_size)


def start(owner, shape):
    """The epoch `owner` (a face with an Offload) iterates next, made with the cluster, or None
    where it is made locally only: the cluster is gone, or the epoch resumes a state saved on
    another layout (its order starts past the positions delivered there). `shape(fields,
    indices)` makes a batch as the face gives it from its fields (torch tensors by name)."""
    if owner._offload is None or not owner._offload.active:
        return None
    state = owner._loader.state()
    if state.get("skipped", 0) != 0:
        return None
    epoch, begin = state["epoch"], state["batches_done"]
    owner._loader.set_epoch(epoch + 1)
    owner._offload_at = (epoch, begin)
    return Epoch(owner, epoch, begin, shape)


_NOBODY, _LOCAL, _REMOTE = 0, 1, 2  # BatchFeed owners


def _own_errors(owner):
    """The samples that failed in the loader's own engine (not the cluster's)."""
    return owner._loader.stats().get("error_count", 0)


class Epoch:
    """One epoch of an offloading loader: batches in order, each once, made here or remotely.

    The epoch's full batches go through one BatchFeed: the loader's run claims the next one
    whenever its prefetch bound has room, the cluster whenever fewer than `depth` of its
    leases are in flight (from the consumer's thread and from each lease's completion), so
    each side makes what it can and neither waits for a share set in advance. A lease is a
    task of one batch, or of several when batches are quick (a worker's pipeline runs through
    them, and the task's costs, the scheduler's included, are shared by them). A short last
    batch is made at its turn on its own. Batches the cluster lost are remade in this process.
    """

    def __init__(self, owner, epoch, start, shape, remote=None):
        import torch
        # How a lease's batch becomes the owner's: `remote(arrays, n)` for owners whose
        # workers send their own format (n: the batch's arrays after the first), else the
        # face's fields by name (`shape`). A rescue run may give whole batches (`Whole`).
        self._remote = remote
        self._pid = os.getpid()  # a copy in a forked child has no client to cancel with
        self._torch = torch
        self._shape = shape
        self._owner = owner
        self._off = owner._offload
        self._epoch = epoch
        self._n = len(owner)
        self._next = start
        self._lock = self._off.lock  # the leases' bookkeeping is the Offload's
        self._futures = {}  # batch -> (its lease's future, submitted at), under _lock
        self._received = {}  # batch -> what came back with an earlier batch of its lease
        self._lost = []     # leased batches the cluster lost, to be made here
        self._rescue = None  # (epoch run, its batches in order) remaking lost batches
        self._closed = False
        # Replaced samples (on_error="skip"), for the epoch's one warning.
        self._errors_at_start = _own_errors(owner)
        self._remote_errors = []
        self._full = max(start, _full_batches(owner))
        self._feed = _feedline.BatchFeed(start, self._full) if self._full > start else None
        self._adopt()  # before the run: it claims the lowest batches the cluster has not
        self._run = None
        if self._feed is not None and (self._off.local or not self._off.active):
            self._run = owner._loader.start_from_feed(epoch, self._feed)
        # Leases in flight: one running and one queued per worker thread.
        self._depth = 2 * max(1, self._off.remote_threads()) + 1
        self._per_task = max(1, min(self._off.batches_per_task or self._lease_size(),
                                    (self._full - start) // (2 * self._depth)))
        self._off.lease_size = self._per_task
        self._last_t = self._t0 = time.perf_counter()
        self._local_n = 0  # batches the run made and the consumer took
        self._off.epoch = weakref.ref(self)
        self._top_up()

    def _lease_size(self):
        """Batches per lease: as many as make about _LEASE_S of a worker's time (a task's own
        costs, the scheduler's and the transfer's, shared by them), one for a batch that takes
        that long; at most _MAX_LEASE (the batches come back together)."""
        if self._off.batch_s <= 0:
            return 1
        return min(_MAX_LEASE, max(1, int(_LEASE_S / self._off.batch_s)))

    def _adopt(self):
        """Takes over the leases an earlier epoch made of this one's first batches (when this is
        the epoch they were for, from where it starts); cancels the rest."""
        with self._lock:
            ahead, self._off.ahead = self._off.ahead, None
            if ahead is None:
                return
            epoch, leased = ahead
            kept = set()
            for b, (f, submitted) in sorted(leased.items()):
                if (epoch == self._epoch and self._feed is not None and
                        self._feed.take_remote(b)):
                    self._futures[b] = (f, submitted)
                    kept.add(f.key)
                    self._off.counts["ahead"] += 1
            gone = {f.key: f for f, _ in leased.values() if f.key not in kept}
        for f in gone.values():
            self._off.done.pop(f.key, None)
            _cancel(f)

    # --- the cluster's side: claims from the feed, leases, results ------------------------
    def _top_up(self):
        """Leases the feed's next batches to the cluster while it has fewer than `depth` in
        flight (also run by each lease's completion, on Dask's callback thread); once this
        epoch has none left worth leasing, the next epoch's first."""
        if self._feed is None or not self._off.active:
            return
        with self._lock:
            # In flight: `depth` leases running or queued on the workers; held: what came
            # back and waits for its turn too (memory), at most the lead's worth more.
            k = self._per_task
            while (not self._closed and len(self._off.running) < self._depth and
                   len(self._futures) + len(self._received) < (self._depth + 1) * k +
                   self._lead()):
                if not self._worth_leasing(k):
                    self._lease_ahead()
                    return
                lease = []
                while len(lease) < k and (b := self._feed.claim_remote(self._lead())) >= 0:
                    lease.append(b)
                if lease:
                    lease.sort()  # (near the end a claim may go below the one before)
                    try:
                        f, now = self._off.submit(self._epoch, lease)
                    except Exception as e:  # noqa: BLE001 (a client that lost its scheduler)
                        self._lost += lease
                        self._off.lose(f"cannot submit to the Dask scheduler at "
                                       f"{self._off.address}: {e}")
                        return
                    for b in lease:
                        self._futures[b] = (f, now)
                if len(lease) < k:  # the feed has no more
                    self._lease_ahead()
                    return

    def _lease_ahead(self):
        """The cluster has room and this epoch nothing more for it: it makes the next epoch's
        first batches (as the loader's epoch head start does), taken over when that epoch
        starts where expected (else dropped then, or by set_epoch and load_state_dict at
        once: Offload.drop_ahead). At most `depth` leases of them, under _lock."""
        nxt = self._epoch + 1
        if not self._off.leases_ahead:
            return
        if self._off.ahead is None:
            if self._owner._loader.next_epoch != nxt:  # set_epoch chose another
                return
            self._off.ahead = (nxt, {})
        epoch, leased = self._off.ahead
        if epoch != nxt:
            return
        full, k = _full_batches(self._owner), self._per_task
        while len(self._off.running) < self._depth:
            first = max(leased) + 1 if leased else 0
            lease = list(range(first, min(full, first + k)))
            if not lease or len({f.key for f, _ in leased.values()}) >= self._depth:
                return
            try:
                f, now = self._off.submit(nxt, lease)
            except Exception:  # noqa: BLE001 (the scheduler went: this epoch's leases say so)
                return
            for b in lease:
                leased[b] = (f, now)

    def _local_rate(self):
        """The run's batches per second: this epoch's so far, else the last epoch's."""
        if self._local_n >= 2:
            return self._local_n / max(1e-6, time.perf_counter() - self._t0)
        return self._off.local_rate

    def _worth_leasing(self, k):
        """Whether k more batches go to the cluster: not when the run would make every batch
        left before the lease comes back (the epoch's end would wait for the cluster while
        this process's cores idle)."""
        if self._run is None:
            return True
        rate, latency = self._local_rate(), self._off.latency_s
        return rate <= 0 or latency <= 0 or self._feed.unclaimed - k >= rate * latency

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
            if b in self._received:  # it came with an earlier batch of its lease
                return self._received.pop(b)
            if b not in self._futures:  # never leased (its submission failed): made here
                return None
            f, submitted = self._futures[b]
        while True:
            if self._off.client.status not in ("running", "connecting"):
                self._off.lose(f"the Dask scheduler at {self._off.address} is gone "
                               f"(client {self._off.client.status})")
                return None
            done = self._off.done.get(f.key)
            if done is not None and not done.wait(0.25) and not f.done():
                if time.perf_counter() - submitted > _STRAGGLER_S:
                    return self._lose_lease(f)
                continue
            try:
                # From the worker that holds it: through the scheduler (Dask's default for
                # a client outside the cluster) the bytes would cross two more sockets and
                # cost the scheduler a core's tenth.
                got = self._off.client.gather(f, direct=self._off.direct)
                break
            except Exception as e:  # noqa: BLE001 (sorted below)
                if self._off.direct and isinstance(e, OSError) and f.status == "finished":
                    self._off.direct = False  # the workers cannot be reached from here
                    continue
                if _lost(e) or isinstance(e, distributed.TimeoutError):
                    return self._lose_lease(f)
                raise RuntimeError(f"feedline offload: the cluster could not make batch {b} of "
                                   f"epoch {self._epoch}: {type(e).__name__}: {e}") from e
        arrays, made, errors, seconds = got
        per_batch = seconds / max(1, len(made))  # a worker's time per batch, smoothed
        self._off.batch_s += (per_batch - self._off.batch_s) * (
            0.25 if self._off.batch_s > 0 else 1.0)
        self._off.done.pop(f.key, None)
        f.release()
        self._off.add_errors(errors)
        self._remote_errors += errors
        at = 0
        with self._lock:
            for got_b, error, fields in made:  # the lease's batches, ascending
                width = 0 if error is not None else _width(fields)
                if self._futures.pop(got_b, None) is None:  # (before a resumed epoch's start)
                    at += width
                    continue
                if error is not None:
                    self._received[got_b] = (None, error)
                else:
                    self._received[got_b] = ((arrays[at:at + width], fields), None)
                    at += width
            return self._received.pop(b)

    def _lose_lease(self, f):
        """A lease the cluster lost (or that is too late): each of its batches is made here,
        together (None)."""
        self._off.done.pop(f.key, None)
        with self._lock:
            lost = [x for x, (g, _) in self._futures.items() if g is f]
            for x in lost:
                del self._futures[x]
            self._lost += lost
        return None

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
        loader = self._owner._loader if self._run is None else self._off.rescue_maker()
        queue = collections.deque(lost)
        self._rescue = (loader.start_batches(self._epoch, list(lost)), queue)

    def _from_rescue(self, b):
        run, queue = self._rescue
        if not queue or queue[0] != b:
            self._remake(b)
            run, queue = self._rescue
        queue.popleft()
        views, indices, _ = run.next_fields()  # raises the batch's DataError
        if not queue:
            run.cancel()
            self._rescue = None
        return views, indices

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
            return self._batch(self._remade(b), count="local")
        who = self._owner_of(b)
        if who == _LOCAL:
            views, indices, index = self._run.next_fields()  # raises the batch's DataError
            if index != b:
                raise RuntimeError(f"feedline offload: the run made batch {index} for {b}")
            return self._batch((views, indices), count="local")
        if self._rescue is not None and self._rescue[1] and self._rescue[1][0] == b:
            return self._batch(self._from_rescue(b), count="remade")
        got = self._take_remote(b)
        if got is None:  # lost: made here
            return self._batch(self._remade(b), count="remade")
        received, error = got
        self._off.counts["remote"] += 1
        if error is not None:
            raise _feedline.DataError(error)
        arrays, fields = received
        if self._remote is not None:
            self._off.bytes += sum(getattr(a, "nbytes", 0) or len(a) for a in arrays)
            return self._remote(arrays, fields)
        torch = self._torch
        tensors = {}
        for (name, bf16), a in zip(fields, arrays):
            t = torch.from_numpy(a)
            tensors[name] = t.view(torch.bfloat16) if bf16 else t
        self._off.bytes += sum(a.nbytes for a in arrays)
        return self._shaped(tensors, torch.from_numpy(arrays[len(fields)]))

    def _ended(self):
        """The epoch is over: one warning for the samples replaced here, by the rescue loader
        and on the cluster."""
        if getattr(self, "_said", False):
            return
        self._said = True
        if self._local_n >= 2:
            self._off.local_rate = self._local_rate()
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

    def _batch(self, got, count):
        """A batch made in this process ((field views, index view)), as the face gives it."""
        self._off.counts[count] += 1
        if count == "local" and self._run is not None:
            self._local_n += 1
        views, indices = got
        if isinstance(views, Whole):
            return views.batch
        dl = self._torch.from_dlpack
        return self._shaped({name: dl(v) for name, v in views.items()}, dl(indices))

    def _shaped(self, fields, indices):
        delivered = getattr(self._owner, "_mix_delivered", None)
        if delivered is not None:  # a mixture's samples by source (stats()["mix"])
            delivered.count(indices)
        return self._shape(fields, indices)

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
            if self._off.epoch is not None and self._off.epoch() is self:
                self._off.epoch = None
            futures, self._futures = self._futures, {}
            self._received = {}
        if self._feed is not None:
            self._feed.close()
        if self._run is not None:
            self._run.cancel()
            self._run = None
        if self._rescue is not None:
            self._rescue[0].cancel()
            self._rescue = None
        for f in {id(f): f for f, _ in futures.values()}.values():
            _cancel(f)

    def __del__(self):
        # Collected in a forked child (a DataLoader's worker process inherits the garbage of
        # the parent): cancelling a lease there waited forever for the Dask client's event
        # loop, a thread the child does not have (the worker hung at its first batch).
        if getattr(self, "_pid", None) != os.getpid():
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class Whole:
    """A batch a rescue run made whole (the owner's own format), in place of field views."""

    __slots__ = ("batch",)

    def __init__(self, batch):
        self.batch = batch


def _width(fields):
    """The arrays a lease's batch takes: its fields and its indices, or the owner's count."""
    return fields + 1 if isinstance(fields, int) else len(fields) + 1


_STRAGGLER_S = 30.0  # a leased batch not back after this long is made here
_LEASE_S = 0.05  # a lease's work on a worker, at least (when batches are quicker)
_MAX_LEASE = 16


def _cancel(future):
    if future is None:
        return
    try:
        future.cancel()
    except Exception:  # noqa: BLE001 (a client already closed: nothing to cancel)
        pass
