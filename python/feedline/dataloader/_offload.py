"""feedline.DataLoader(offload=): a map-style epoch's batches made partly by this process's worker
processes and partly on a Dask cluster, each batch once, in order, with the same bytes.

The cluster's side is torch's worker loop over a picklable dataset: a Dask worker keeps, per
loader, one copy of the dataset per worker id (worker_init_fn run once in each, as in torch's
workers), and makes batch k as the loader's worker process k mod num_workers would: the
sample at index i of the epoch's order with the RNGs seeded from (the epoch's base seed, i),
then the collate_fn. The epoch's order and base seed are drawn in the trainer (torch's RNG, the
sampler): a lease carries its batches' keys. What comes back is the collated batch's pickle and
its tensors' bytes as arrays (Dask's out-of-band frames), viewed, not copied, by the tensors
handed to the loop. The local side is the loader's own engine run, claiming batches from the
same feed as the cluster (_offload_epoch.Epoch).
"""

import collections
import contextlib
import hashlib
import os
import pickle
import random
import threading
import time
import uuid

import torch

from .. import _payload, _worker
from .._offload_epoch import Epoch, Whole
from ..offload import Offload, set_up_worker
from ._runtime import _raise_from_text, _tls, _worker_copy

_PRODUCERS = collections.OrderedDict()  # spec id -> _Producer, on a Dask worker (LRU)
_PRODUCERS_LOCK = threading.Lock()
_MAX_PRODUCERS = 4
_INLINE_SPEC = 256 << 10  # a spec up to this size travels with each lease, else scattered once


class _Producer:
    """A loader's side on a Dask worker: the spec, and a dataset copy per worker id."""

    def __init__(self, blob):
        self.blob = blob
        spec = pickle.loads(blob)
        self.collate_fn = spec["collate_fn"]
        self.auto_collation = spec["auto_collation"]
        self.worker_init_fn = spec["worker_init_fn"]
        self.num_workers = spec["num_workers"]
        self.spawn_seed = spec["spawn_seed"]
        self.copies = {}
        self.random = random.Random()  # `random`'s instance while this makes batches
        self.lock = threading.Lock()  # a worker with several threads: one batch at a time

    def dataset(self, worker_id):
        """The dataset as worker `worker_id` holds it: its own copy, worker_init_fn run once."""
        ds = self.copies.get(worker_id)
        if ds is None:
            ds = pickle.loads(self.blob)["dataset"]
            seed = _worker.seed_worker(self.spawn_seed, worker_id)
            _worker.set_worker_info(worker_id, self.num_workers, seed, ds)
            if self.worker_init_fn is not None:
                _worker.run_worker_init_fn(self.worker_init_fn, worker_id)
            self.copies[worker_id] = ds
        return ds


def _producer(spec_id, blob):
    with _PRODUCERS_LOCK:
        p = _PRODUCERS.get(spec_id)
        if p is not None:
            _PRODUCERS.move_to_end(spec_id)
            return p
    p = _Producer(blob)
    with _PRODUCERS_LOCK:
        p = _PRODUCERS.setdefault(spec_id, p)
        while len(_PRODUCERS) > _MAX_PRODUCERS:
            _PRODUCERS.popitem(last=False)
    return p


# Python's `random` functions are methods of one module-wide instance, which the Dask worker's
# own threads draw from too (tornado's jittered periodic callbacks, peer choices): between a
# sample's seeding and its draws they moved its stream (one sample in ~5 leases differed from
# the local run's). In a Dask worker the module's functions dispatch to an instance of the
# producing thread's own while it makes batches; every other thread keeps the shared one.
_RANDOM_STATE = threading.local()
_RANDOM_ISOLATED = []


def _isolate_random():
    if _RANDOM_ISOLATED:
        return
    shared = random._inst

    def dispatch(name):
        def call(*args, **kwargs):
            return getattr(getattr(_RANDOM_STATE, "inst", None) or shared, name)(*args, **kwargs)
        call.__name__ = call.__qualname__ = name
        return call

    for name in dir(shared):
        if (not name.startswith("_") and callable(getattr(shared, name, None)) and
                getattr(random, name, None) == getattr(shared, name)):
            setattr(random, name, dispatch(name))
    _RANDOM_ISOLATED.append(True)


def make_batches(blob, spec_id, epoch_seed, items):
    """On a Dask worker: the batches `items` ([(batch number, keys, index of its first sample in
    the epoch's order, worker id)], ascending) as (arrays, made, errors, seconds), the format of
    offload.make_batches: `made` has (batch, None, n) for a batch made, its pickle and its n
    tensors the next 1 + n of `arrays`; (batch, error text, None) for one whose sample or
    collate_fn raised (the text re-raises its type in the loop)."""
    t0 = time.perf_counter()
    set_up_worker()
    p = _producer(spec_id, blob)
    arrays, made = [], []
    where = f"a Dask worker (pid {os.getpid()})"
    _isolate_random()
    with p.lock:
        _RANDOM_STATE.inst = p.random
        try:
            _make(p, epoch_seed, items, arrays, made, where)
        finally:
            _RANDOM_STATE.inst = None
    return arrays, made, [], time.perf_counter() - t0


def _make(p, epoch_seed, items, arrays, made, where):
    """make_batches' loop: each batch's pickle and tensors into `arrays`, its entry into `made`."""
    for b, keys, first_index, worker_id in items:
        ds = p.dataset(worker_id)
        _worker.set_worker_info(worker_id, p.num_workers, p.spawn_seed + worker_id, ds)
        out, _, failed = _worker.make_batch(
            ds, keys, p.collate_fn, p.auto_collation,
            lambda j, i=first_index: _worker.seed_sample(epoch_seed, i + j))
        if failed is not None:
            made.append((b, _worker.error_text(failed[0], failed[1], where), None))
            continue
        try:
            body, tensors = _payload.split(out)
        except Exception as e:  # noqa: BLE001 (a batch that cannot be pickled)
            made.append((b, _worker.error_text(e, f"batch {b}", where), None))
            continue
        arrays.append(body)
        arrays += tensors
        made.append((b, None, len(tensors)))


@contextlib.contextmanager
def _own_rngs():
    """The calling thread's global RNG states put back afterwards (a batch made here is seeded
    as a worker's: the training loop's RNGs must not see it)."""
    np = None
    try:
        import numpy as np
        np_state = np.random.get_state()
    except ImportError:
        pass
    states = torch.get_rng_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        if np is not None:
            np.random.set_state(np_state)


class _CallerRun:
    """Batches the cluster lost while the engine's run holds the worker processes, made in the
    calling thread as the worker would make them (rare: a worker lost, the scheduler gone)."""

    def __init__(self, off, batches):
        self._off = off
        self._queue = collections.deque(batches)

    def next_fields(self):
        b = self._queue.popleft()
        off = self._off
        keys, first_index = off.order[1][b], off.order[2][b]
        o = off.owner
        previous = getattr(_tls, "info", None)
        _isolate_random()  # (the Dask client's threads draw from `random` too)
        _RANDOM_STATE.inst = off.random
        try:
            with _own_rngs():
                _tls.info = info = off.worker_info(b % off.num_workers)
                out, _, failed = _worker.make_batch(
                    info.dataset, keys, o._batch_collate_fn, o._auto_collation,
                    lambda j: _worker.seed_sample(off.order[3], first_index + j))
        finally:
            _tls.info = previous
            _RANDOM_STATE.inst = None
        if failed is not None:
            _raise_from_text(_worker.error_text(failed[0], failed[1], "the training process"))
        return Whole(out), None, b

    def cancel(self):
        self._queue.clear()


def _firsts(batches):
    """The index in the epoch's order of each batch's first sample."""
    first, n = [], 0
    for b in batches:
        first.append(n)
        n += len(b)
    return first


def _dumps(obj):
    """cloudpickle where it is there (Dask's own choice: classes and functions of a script or a
    notebook travel by value), else pickle."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


class LoaderOffload(Offload):
    """A DataLoader's link to the cluster: the spec (dataset, collate_fn, worker_init_fn)
    shipped once per change, the epoch's order for the leases."""

    @property
    def leases_ahead(self):
        """The next epoch's first batches may be leased: its order was foreseen (_ahead: drawn
        on a copy of torch's RNG states; iter() keeps the leases only if it draws the same)."""
        return self.next_order is not None

    def __init__(self, offload, owner):
        super().__init__(offload, ("dataloader", None))
        import weakref
        self._owner = weakref.ref(owner)
        self.order = None  # (epoch, batches, first index of each, epoch seed)
        self.next_order = None  # the same of the next epoch, foreseen
        self.num_workers = 1
        self._spec_key = None
        self._spec = None  # (spec id, the blob or a future of it)
        self._infos = {}  # worker id -> its WorkerInfo here (_CallerRun)
        self.random = random.Random()  # `random`'s instance while _CallerRun makes a batch

    def worker_info(self, worker_id):
        """Worker `worker_id`'s WorkerInfo in this process, for the batches made here: a
        dataset copy of its own, seeded and worker_init_fn run once, as in a worker process
        (the caller's RNGs are put back by _CallerRun)."""
        info = self._infos.get(worker_id)
        if info is None:
            import torch.utils.data as tud
            o = self.owner
            own = _worker_copy(o.dataset)
            seed = _worker.seed_worker(o._spawn_seed, worker_id)  # (CPU generators only)
            info = tud._utils.worker.WorkerInfo(id=worker_id, num_workers=self.num_workers,
                                                seed=seed, dataset=own)
            _tls.info = info
            if o.worker_init_fn is not None:
                o.worker_init_fn(worker_id)
            self._infos[worker_id] = info
        return info

    @property
    def owner(self):
        return self._owner()

    def foresee(self, epoch, batches, epoch_seed):
        """The order of the engine's epoch `epoch` (the next), foreseen: the current epoch's
        leases, once it has none left worth leasing, make its first batches. A foresight that
        replaces another drops what was leased with the other."""
        with self.lock:
            order = (epoch, batches, _firsts(batches), epoch_seed)
            if self.next_order is not None and self.next_order[1:] != order[1:]:
                self.drop_ahead(unless_epoch=-1)
            self.next_order = order
        return True

    def prepare(self, epoch, batches, epoch_seed):
        """The epoch about to be made with the cluster: its order (what was leased ahead of it
        with another order is dropped), and the spec shipped anew if the dataset's side changed
        (a new layout leaves it; new worker processes do not)."""
        o = self.owner
        self.num_workers = o._process_count()
        with self.lock:
            foreseen, self.next_order = self.next_order, None
            self.order = (epoch, batches, _firsts(batches), epoch_seed)
        if foreseen is None or foreseen[0] != epoch or foreseen[1:] != self.order[1:]:
            self.drop_ahead(unless_epoch=-1)
        key = (id(o.dataset), o._spawn_seed, self.num_workers)
        if key == self._spec_key:
            return
        self.drop_ahead(unless_epoch=-1)  # (made with the spec before)
        self._infos.clear()
        blob = _dumps({"dataset": o.dataset, "collate_fn": o._batch_collate_fn,
                       "auto_collation": o._auto_collation, "worker_init_fn": o.worker_init_fn,
                       "num_workers": self.num_workers, "spawn_seed": o._spawn_seed})
        spec_id = hashlib.sha256(blob).hexdigest()
        ship = blob
        if len(blob) > _INLINE_SPEC:
            ship = self.client.scatter(blob, broadcast=True, hash=False)
        self._spec, self._spec_key = (spec_id, ship), key

    def submit(self, epoch, lease):
        order = self.order if self.order[0] == epoch else self.next_order
        if order is None or order[0] != epoch:
            raise RuntimeError(f"feedline offload: no order for epoch {epoch} (a bug)")
        _, batches, first, seed = order
        n = self.num_workers
        items = [(b, list(batches[b]), first[b], b % n) for b in lease]
        spec_id, ship = self._spec
        return self.track(self.client.submit(
            make_batches, ship, spec_id, seed, items, pure=False,
            key=f"feedline-loader-batches-{epoch}-{lease[0]}-{uuid.uuid4().hex}"))

    def rescue_maker(self):
        return self

    def start_batches(self, epoch, batches):  # (rescue_maker's)
        return _CallerRun(self, batches)

    def rescue_loader(self):
        raise AssertionError("a DataLoader remakes lost batches in the calling thread")


class _Adapter:
    """What an offloading Epoch asks its owner: the engine loader, the epoch's batches (full
    ones are the engine's batches), where the iteration is."""

    def __init__(self, loader, off, n, engine_batch):
        self._loader = loader
        self._offload = off
        self._n = n
        self.batch_size = engine_batch
        self._offload_at = None

    def __len__(self):
        return self._n


def start(it, engine_batch, epoch_seed, shape):
    """The offloading epoch for the DataLoader iterator `it` from its batch `it._batches_done`,
    the engine loader ready (keys set): an Epoch whose batches are the loader's. The engine's
    epoch number moves on as a run's would."""
    o = it._owner
    off = o._offload
    loader = o._loader
    epoch = loader.next_epoch
    loader.set_epoch(epoch + 1)
    off.prepare(epoch, it._batches, epoch_seed)

    def remote(arrays, n):
        return _payload.join(arrays[0], arrays[1:1 + n])

    adapter = _Adapter(loader, off, len(it._batches), engine_batch)
    return Epoch(adapter, epoch, it._batches_done, shape, remote=remote)


def check(loader):
    """The arguments offload= needs: a map-style dataset made in worker processes."""
    import torch.utils.data as tud
    if isinstance(loader.dataset, tud.IterableDataset):
        raise ValueError("offload: map-style datasets only (an IterableDataset's stream is "
                         "its replicas' own)")
    if loader.num_workers == 0 or loader._executor_option == "thread":
        raise ValueError("offload: the dataset is made by worker processes here and on the "
                         "cluster; num_workers=0 and executor='thread' make it in this "
                         "process only")
    if loader._on_error != "raise":
        raise ValueError("offload: on_error='raise' only (a replaced batch's place is taken "
                         "by another batch of the epoch, which the cluster does not see)")
