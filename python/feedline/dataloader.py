"""feedline.DataLoader: torch's DataLoader, on feedline's engine.

    loader = feedline.DataLoader(dataset, batch_size=64, shuffle=True)  # num_workers: feedline's

takes every argument torch's DataLoader takes and gives the same batches. What changes is how
the work is done: map-style datasets run on feedline's engine (python/py_dataset.h) — positions
of the epoch's order claimed by C++ worker threads, each sample made by a persistent forked
worker process (as torch's workers: the training process keeps its GIL, its RNGs and its life
when a sample crashes) and written in place into the batch slot (torch's default_collate
semantics, see _collate.py); or, with ``executor="thread"`` or keys that are not ints, each
batch made whole by an engine thread under the GIL. ``num_workers=N`` makes N worker processes,
as torch's (batch k made by worker k mod N); how many work at once is tuned by the engine. Left
out, one per core (``workers=N`` fixes it). ``num_workers=0`` loads in the calling thread.

With workers, the training process never calls the dataset. In place needs the batch layout,
which the worker processes learn from their first batch: the first batch of each worker is
made whole by torch's collation, as torch's workers make it, every later one in place. In
worker processes every sample's RNGs are seeded from (the epoch's base seed, the sample's index
in the epoch): the same seed gives the same augmentations for any worker count and after a
resume.

Iterable datasets run one replica per worker (``get_worker_info()`` set), batches taken round
robin as torch takes them.
"""

import atexit
import copy
import hashlib
import inspect
import itertools
import json
import os
import pickle
import threading
import time
import typing
import warnings
import weakref

import torch
import torch.utils.data as tud

from . import _collate, _feedline, _worker
from ._util import _parse_bytes, _parse_count, _resolve_cuda
from ._feedline import DataError

__all__ = ["DataLoader"]


_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():  # before the interpreter goes: no engine thread may wait for the GIL then
    for loader in list(_LIVE):
        try:
            loader.close()
        except Exception:  # noqa: BLE001
            pass


# A multiprocessing child (a training script's own worker process, torch's test harness) ends
# through multiprocessing's exit function, not atexit: it joins the child processes it knows.
# Its finalizers run first, so the loaders close there too; an engine thread that replaced a
# dead worker after that join had begun forked a process nobody terminated, and the exit
# waited for it forever (1 run in 12 of a dataset that segfaults).
# A forked child starts with an empty registry: each process registers when it makes its
# first loader.
_finalizer_pid = None


def _register_exit():
    global _finalizer_pid
    if _finalizer_pid != os.getpid():
        import multiprocessing.util
        multiprocessing.util.Finalize(None, _close_all, exitpriority=100)
        _finalizer_pid = os.getpid()


# get_worker_info() inside thread workers: torch's function reads one module global, so the
# thread executor answers per thread (None outside feedline's threads, as in the main process).
# torch's own function object is made to look there (its code replaced, its globals kept), so
# that a `from torch.utils.data import get_worker_info` made before feedline was imported, or
# held by any other module, answers the same.
_tls = threading.local()
tud._utils.worker._feedline_tls = _tls


def _thread_aware_get_worker_info():
    # Runs with torch.utils.data._utils.worker's globals (the code is moved into torch's
    # function below): _feedline_tls and _worker_info are that module's.
    info = getattr(_feedline_tls, "info", None)  # noqa: F821
    return info if info is not None else _worker_info  # noqa: F821


if tud._utils.worker.get_worker_info.__code__.co_freevars == ():
    tud._utils.worker.get_worker_info.__code__ = _thread_aware_get_worker_info.__code__


def _resolve_type(name):
    module, _, qual = name.rpartition(".")
    import builtins
    import importlib
    obj = importlib.import_module(module) if module else builtins
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _raise_from_text(text):
    """Re-raises a worker's error: the same exception type, its traceback in the message."""
    summary, _, details = text.partition("\n")
    try:
        d = json.loads(details)
        exc_type = _resolve_type(d["type"])
        message = d.get("message", summary)
    except Exception:  # noqa: BLE001
        raise DataError(summary) from None
    if exc_type is KeyError:
        from torch._utils import KeyErrorMessage
        message = KeyErrorMessage(message)
    try:
        exc = exc_type(message)
    except Exception:  # noqa: BLE001 (a type that needs other arguments)
        exc = RuntimeError(message)
    raise exc from None


def _weak(method):
    """`method` without a strong reference to its object: the C++ transform holds these, and a
    cycle loader -> transform -> bound method -> loader would keep stopped loaders' worker
    processes alive until the garbage collector ran."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        m = ref()
        if m is None:
            raise RuntimeError("feedline.DataLoader: the loader is gone")
        return m(*args)

    return call


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# torch's own default: 2 up to torch 1.13 (which accepts prefetch_factor=2 with num_workers=0),
# None from torch 2.0 (which refuses any prefetch_factor there).
_TORCH_PREFETCH_DEFAULT = inspect.signature(tud.DataLoader.__init__).parameters[
    "prefetch_factor"].default


def _order_fingerprint(batches):
    h = hashlib.sha1()
    for b in batches:
        h.update(repr(list(b)).encode())
        h.update(b";")
    return h.hexdigest()


_T_co = typing.TypeVar("_T_co", covariant=True)


class DataLoader(typing.Generic[_T_co]):
    """A drop-in for ``torch.utils.data.DataLoader`` (same arguments, same batches).

    feedline's own keyword arguments:
      workers: "auto" (tuned while running) or a fixed count of engine workers (with
        num_workers left out, also the number of worker processes).
      executor: "auto" (processes, as torch; threads when the sample keys are not ints),
        "thread" (the engine's threads run the dataset under the GIL: no pickling, but they
        share the training thread's GIL and RNGs, so random augmentations are not
        reproducible there) or "process".
      memory_budget: bytes of batch slots in flight ("auto": a share of the machine's memory).
      on_error: "raise" (the sample's exception reaches the loop) or "skip" (replaced, counted;
        where batches are made whole, by worker threads or a collate_fn, the failed sample's
        batch is replaced by another batch of the epoch).
      seed: seeds the shuffle (a torch.Generator) when no ``generator`` is given.
      device: where batches arrive. "cuda"/"cuda:N": batches collated by feedline are copied
        from pinned slots on a side stream (the consumer's stream waits on an event, as with
        ImageLoader; lengths stay on the host); others move with ``.to(device)``.
      pad: True (pad every leaf whose shape varies), or {name: True | bound | per-dimension
        bounds}; padded to the batch's longest with ``pad_value``, lengths beside them
        (``"<key>_lengths"`` in a dict sample, else a (padded, lengths) pair).

    ``num_workers=0`` loads in the calling thread as torch does; ``num_workers=N`` makes N
    worker processes as torch's (ids 0..N-1, batch k made by worker k mod N), how many work at
    once tuned; left out (None), one per core (``workers=N`` fixes it). For an
    IterableDataset ``num_workers`` is the number of replicas, as in torch; left out it is 0,
    torch's default (replicas of an IterableDataset each yield the whole stream unless it
    shards itself by ``get_worker_info()``, so feedline never makes them on its own).
    """

    __initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=None, collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None,
                 *, prefetch_factor=None, persistent_workers=True, pin_memory_device="",
                 workers="auto", executor="auto", memory_budget="auto", on_error="raise",
                 max_errors=None, seed=None, device=None, pad=None, pad_value=0):
        self._owner_pid = os.getpid()  # __del__ in a forked copy leaves the loader alone
        if num_workers is not None and (isinstance(num_workers, bool)
                                        or not isinstance(num_workers, int)):
            raise TypeError(f"num_workers: expected an int, got {type(num_workers).__name__}")
        if num_workers is not None and num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if executor not in ("auto", "thread", "process"):
            raise ValueError(f"executor: expected 'auto', 'thread' or 'process', got {executor!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error: expected 'raise' or 'skip', got {on_error!r}")
        if not (pad is None or isinstance(pad, (bool, dict))):
            raise TypeError(f"pad: expected True, False or a dict {{name: bound}}, got "
                            f"{type(pad).__name__}")
        if isinstance(pad, dict):
            for k, v in pad.items():
                ok = v is True or v is False or (isinstance(v, int) and v > 0) or (
                    isinstance(v, (tuple, list)) and all(
                        m is None or (isinstance(m, int) and not isinstance(m, bool) and m > 0)
                        for m in v))
                if not ok:
                    raise ValueError(f"pad[{k!r}]: expected True, a positive int or a tuple of "
                                     f"bounds (None: fixed), got {v!r}")
        if pad and collate_fn is not None:
            raise ValueError("pad: your collate_fn collates the batch; pad= applies to feedline's "
                             "own collation (leave collate_fn=None)")
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise TypeError(f"pad_value: expected a number, got {type(pad_value).__name__}")
        if multiprocessing_context is not None:
            import multiprocessing as _mp
            if num_workers == 0:
                raise ValueError("multiprocessing_context can only be used with multi-process "
                                 f"loading (num_workers > 0), but got num_workers={num_workers}")
            if isinstance(multiprocessing_context, str):
                valid = _mp.get_all_start_methods()
                if multiprocessing_context not in valid:
                    raise ValueError("multiprocessing_context option should specify a valid start "
                                     f"method in {valid!r}, but got multiprocessing_context="
                                     f"{multiprocessing_context!r}")
                multiprocessing_context = _mp.get_context(multiprocessing_context)
            elif not isinstance(multiprocessing_context, _mp.context.BaseContext):
                raise TypeError("multiprocessing_context option should be a valid context object "
                                "or a string specifying the start method, but got "
                                f"multiprocessing_context={multiprocessing_context}")
        if prefetch_factor not in (None, _TORCH_PREFETCH_DEFAULT) and num_workers == 0:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing.")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self._is_iterable = isinstance(dataset, tud.IterableDataset)
        if self._is_iterable:
            if isinstance(dataset, tud.IterDataPipe):
                # As torch: shuffle= turns the pipe's Shuffler stages on or off.
                if shuffle is not None:
                    dataset = torch.utils.data.graph_settings.apply_shuffle_settings(
                        dataset, shuffle=shuffle)
                    self.dataset = dataset
            elif shuffle not in (None, False):
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                                 f"option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if generator is None and seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        if sampler is None:
            if self._is_iterable:
                sampler = tud.dataloader._InfiniteConstantSampler()
            elif shuffle:
                sampler = tud.RandomSampler(dataset, generator=generator)
            else:
                sampler = tud.SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self._auto_collation = batch_sampler is not None
        if collate_fn is None:
            collate_fn = tud.default_collate if self._auto_collation else tud.default_convert
        self.collate_fn = collate_fn
        self._padded_collate = None
        self._workers = workers
        self._executor_option = executor
        self._memory_budget = memory_budget
        self._on_error = on_error
        self._max_errors = max_errors
        self._device = torch.device(device) if device is not None else None
        self._pad = pad
        self._pad_value = pad_value
        self._pad_bounds = {}  # (field, dim) -> bound, grown when a sample overflowed one
        self._pad_restarts = 0
        self._schema = None
        self._learned = None  # (batch layout or None) learned in a worker, kept for the loader
        self._spawn_seed = 0  # the base seed worker processes are seeded with at their start
        self._pad_config = None  # (pad, pad_value, bounds): how worker processes learn layouts
        self._past_errors = {"error_count": 0, "errors": []}  # of replaced engine runs
        self._past_py = {}  # of replaced transforms
        self._wants_layout = False  # this epoch's batches could go in place (see _layout)
        # Engine state, kept across epochs (persistent workers).
        self._transform = None
        self._transform_key = None
        self._loader = None
        self._loader_key = None
        self._executor = None
        self._executor_reason = ""
        self._procs = {}
        self._thread_workers = {}  # thread executor: worker id -> its WorkerInfo (_fetch)
        self._results = {}
        self._keys = []
        self._iterator_ref = None  # the current epoch's iterator, weakly: see _iterator
        self._epochs_started = 0
        self._resume = None
        self._epoch_state = None
        self._IterableDataset_len_called = None  # what len(loader) said, as torch keeps it
        _LIVE.add(self)
        _register_exit()
        self.__initialized = True
        if self.num_workers:  # torch warns at construction and at each iter()
            tud.dataloader.DataLoader.check_worker_number_rationality(self)

    def __setattr__(self, attr, val):
        # As torch: the loading layout is fixed once the loader exists (a change would be
        # silently ignored by the batches already planned).
        if self.__initialized and attr in ("batch_size", "batch_sampler", "sampler", "drop_last",
                                           "dataset", "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    # --- torch's attributes ---------------------------------------------------------------
    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self):
        if self._is_iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                from math import ceil
                length = length // self.batch_size if self.drop_last else ceil(
                    length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self):  # torch has it; nothing to warn about here
        pass

    @property
    def executor(self):
        """'thread', 'process' or 'main' (num_workers=0), once an epoch has started."""
        return self._executor

    # The loader refers to its iterator weakly: the iterator refers to the loader, and a strong
    # reference back made a cycle that only Python's cycle collector could free, so a dropped
    # loader kept its slots, threads and worker processes until the collector next ran.
    @property
    def _iterator(self):
        ref = self._iterator_ref
        return ref() if ref is not None else None

    @_iterator.setter
    def _iterator(self, it):
        self._iterator_ref = weakref.ref(it) if it is not None else None

    # --- iteration ------------------------------------------------------------------------
    def __iter__(self):
        if self.num_workers:  # torch's warning for more workers than the machine suggests
            tud.dataloader.DataLoader.check_worker_number_rationality(self)
        previous = self._iterator
        if previous is not None:
            previous._cancel("a newer iter(loader) started another epoch")
            self._iterator = None
        rng_state = torch.get_rng_state()
        gen_state = self.generator.get_state() if self.generator is not None else None
        resume, self._resume = self._resume, None
        skip = 0
        if resume is not None and resume.get("rng_state") is not None:
            torch.set_rng_state(torch.ByteTensor(list(resume["rng_state"])))
            rng_state = torch.get_rng_state()
            if resume.get("generator_state") is not None and self.generator is not None:
                self.generator.set_state(torch.ByteTensor(list(resume["generator_state"])))
                gen_state = self.generator.get_state()
            skip = resume["batches_done"]
        # As torch's iterator: a DataPipe's shared seed (its shufflers draw from it, the same in
        # every worker), a base seed for the workers, then the sampler's draws.
        shared_seed = None
        if isinstance(self.dataset, tud.IterDataPipe):
            shared_seed = int(torch.empty((), dtype=torch.int64).random_(
                generator=self.generator).item())
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator)
                        .item())
        self._epochs_started += 1
        if not self.persistent_workers:
            # As torch's workers made anew for each epoch: worker processes are, so they see the
            # dataset as it is now; worker_init_fn runs again in every worker thread, with a new
            # WorkerInfo and copy of the dataset (the threads themselves are kept).
            self._thread_workers.clear()
            self._stop_processes()
        if self._is_iterable:
            it = _IterableIter(self, base_seed, shared_seed)
            self._epoch_state = None
        else:
            batches = [list(b) if self._auto_collation else [b] for b in self._index_sampler]
            fp = _order_fingerprint(batches)
            if resume is not None and resume.get("order") not in (None, fp):
                raise ValueError("load_state_dict: the sampler gave another order than the saved "
                                 "run's (it is not reproducible from torch's RNG state); cannot "
                                 "resume mid-epoch")
            self._epoch_state = {"rng_state": bytes(rng_state.numpy().tobytes()),
                                 "generator_state": None if gen_state is None else
                                 bytes(gen_state.numpy().tobytes()),
                                 "order": fp, "batches": len(batches)}
            if self.num_workers == 0 or self._executor == "main":
                it = _SerialIter(self, batches, skip)
            else:
                it = self._engine_iter(batches, skip, base_seed)
        self._iterator = it
        return it

    def _engine_iter(self, batches, skip, base_seed):
        # As torch's iter(): the workers start (worker_init_fn runs in them) and begin on the
        # epoch's first batches; their errors reach the loop at the batch they belong to.
        if not batches[skip:]:
            return _EmptyIter()
        it = _EngineIter(self, batches, skip, base_seed)
        it._begin()
        return it

    def _start_engine(self, batches, skip, base_seed):
        """Starts the engine over batches[skip:]: (engine epoch, schema or None, engine batch,
        learning) or None when there is nothing to load. `learning`: the layout is not known
        yet, and the engine makes only as many whole batches as there are worker processes
        (each learns the layout from its batch); the caller starts it again after them, in
        place. No batch is made twice, and every worker is busy at once, as torch's are."""
        left = batches[skip:]
        if not left:
            return None
        sizes = {len(b) for b in left[:-1]}
        regular = self._auto_collation and len(sizes) <= 1 and (
            not sizes or len(left[-1]) <= min(sizes))
        first_index = sum(len(b) for b in batches[:skip])  # the epoch order's index of left[0][0]
        flat = [k for b in left for k in b]
        if self._executor is None:
            self._executor, self._executor_reason = self._choose_executor(flat)
        if self._executor == "process" and not all(isinstance(k, int) for k in flat):
            raise TypeError("executor='process' needs int sample keys; use executor='thread'")
        if not self._procs_started():
            self._spawn_seed = base_seed
        if self._device is not None and self._device.type == "cuda":
            _check_cuda(self._engine_device())  # a clear DeviceError now, in any mode
        # In place needs the layout, which worker processes learn from their first batch.
        self._wants_layout = (regular and self.collate_fn is tud.default_collate
                              and self._executor == "process")
        self._pad_config = ((self._pad, self._pad_value, dict(self._pad_bounds))
                            if self._pad else None)
        schema = self._layout() if self._wants_layout else None
        learning = self._learning()
        if learning:
            left = left[:self._process_count()]
            flat = [k for b in left for k in b]
        batch_mode = schema is None
        if batch_mode:
            engine_batch = 1
            offsets = list(itertools.accumulate([0] + [len(b) for b in left]))
        else:
            engine_batch = max(len(left[0]), 1)
            offsets = list(range(len(flat) + 1))
        self._ensure_transform(schema, batch_mode)
        self._keys = flat if not batch_mode else left
        self._key_offsets = offsets
        if self._executor == "process":
            # Batch k of the epoch goes to worker process k mod n, as torch's batches go.
            self._transform.set_keys(flat, offsets, _signed64(base_seed), first_index,
                                     first_batch=skip, positions_per_batch=engine_batch)
        else:
            self._transform.set_keys([], [0])
        positions = len(left) if batch_mode else len(flat)
        key = (positions, engine_batch, learning)
        if self._loader is None or self._loader_key != key:
            if self._loader is not None:
                self._retire(loader=self._loader)
            self._loader = None
            workers = _parse_count("workers", self._workers)
            if self._executor == "process" and not workers:
                # An engine thread only waits on its process's pipe (no CPU of its own): one per
                # process, so that every worker process can be at work, as torch's are.
                workers = self._process_count()
            prefetch = _parse_count("prefetch", self.prefetch_factor)
            if learning:  # every worker process makes its first batch, all at once (as torch's)
                workers = len(left)
                prefetch = max(prefetch or 0, len(left))
            self._loader = _feedline.python_loader(
                self._transform, positions=positions, fingerprint=positions,
                batch_size=engine_batch, drop_last=False, workers=workers,
                prefetch=prefetch,
                memory_budget=_parse_bytes("memory_budget", self._memory_budget),
                on_error=self._on_error,
                max_errors=_parse_count("max_errors", self._max_errors),
                device=(self._engine_device() if schema is not None else None) or "cpu")
            self._loader_key = key
        self._results.clear()
        return self._loader.start_epoch(), schema, engine_batch, learning

    def _learning(self):
        return self._wants_layout and self._learned is None

    def _procs_started(self):
        return self._transform is not None and self._transform.processes > 0

    def _layout(self):
        """The batch layout (a _collate.Schema) for worker processes to write samples into the
        batch slots in place, or None: batches are made whole in the workers (as torch's are).
        Until the layout is known the workers learn it from the samples of their first batch
        (with pad=, the bounds from that batch's longest; a longer sample later grows them):
        the epoch's first batches, one per worker process, are made whole, the rest in place,
        and no sample is made for the layout alone. Worker threads always make whole batches:
        they share the training thread's GIL, which in-place writes would not spare."""
        if self._learned is None or self._learned[0] is None:
            return None
        schema = self._learned[0]
        if self._pad_bounds:
            schema = _collate.with_bounds(schema, self._pad_bounds)
        return schema

    def _learn(self, learned):
        """A worker process's ("layout", schema or None) or ("error", text) of pad= naming no
        field of the samples."""
        if learned is None or self._learned is not None:
            return
        if learned[0] == "error":
            raise ValueError(learned[1])
        self._learned = (learned[1],)

    def _ensure_transform(self, schema, batch_mode):
        """The transform for this layout. Worker processes outlive a change of layout (learned
        at the first epoch, a padded bound grown): the new transform adopts them and sends them
        the layout, so worker_init_fn runs once per process, as torch's persistent workers."""
        key = (None if schema is None else [f for f in schema.engine_fields()], batch_mode)
        if self._transform is not None and self._transform_key == key:
            if self._executor == "process" and not self._procs_started():
                self._use_processes()  # persistent_workers=False: this epoch's new workers
            return
        self._schema = schema
        self._batch_mode = batch_mode
        fields = schema.engine_fields() if schema is not None else [("batch", "int64", [], False)]
        old = self._transform
        if self._loader is not None:
            self._retire(loader=self._loader)
        if old is not None:
            self._retire(transform=old)
        self._transform = _feedline.PythonTransform(fields, batch_mode, _weak(self._fetch))
        self._transform.set_timeout(float(self.timeout))
        self._transform_key = key
        self._loader = None
        if self._executor != "process":
            return
        if old is not None and old.processes > 0:
            self._transform.adopt_processes(old, pickle.dumps(
                (schema, batch_mode, self._learning(), self._pad_config)))
            return
        self._use_processes()

    def _process_count(self):
        """Worker processes: num_workers when it is given, as torch's workers (ids 0..n-1,
        worker_init_fn once in each, batch k made by worker k mod n); left out, workers=N or
        one per core. How many of them work at once is the engine's thread count, tuned."""
        if self.num_workers:
            return self.num_workers
        return _parse_count("workers", self._workers) or _cpus()

    def _use_processes(self):
        self._stop_processes()
        self._transform.use_processes(_weak(self._spawn), self._process_count())

    @property
    def _collate_batch(self):
        """What collates a batch made in Python (the calling thread, or a worker's irregular
        batch): with pad=, torch's default collation padded as the engine pads."""
        if self._pad and self._auto_collation and self.collate_fn is tud.default_collate:
            if self._padded_collate is None:
                self._padded_collate = _collate.PaddedCollate(self._pad, self._pad_value)
            return self._padded_collate
        return self.collate_fn

    @property
    def _batch_collate_fn(self):
        """What a worker applies to a batch's samples (auto collation) or to its one sample
        (batch_size=None: the collate_fn, torch's default_convert unless the user gave one)."""
        return self._collate_batch if self._auto_collation else self.collate_fn

    def _batch_in_caller(self, keys):
        """The batch of `keys`, made in the calling thread as torch's num_workers=0 makes it."""
        if self._auto_collation:
            return self._collate_batch([self.dataset[k] for k in keys])
        return self.collate_fn(self.dataset[keys[0]])

    def _choose_executor(self, flat):
        """Stable for a loader's arguments, and made without calling the dataset."""
        if self._executor_option != "auto":
            return self._executor_option, "forced (executor=)"
        if not all(isinstance(k, int) for k in flat[:64]):
            return "thread", "sample keys are not ints: worker processes take int keys"
        return "process", ("as torch's workers: each process has its own GIL and RNGs, a crash "
                           "is the worker's, and the training thread keeps its GIL")

    def _engine_device(self):
        """"cuda:N" when batches go to a GPU through the engine's copy stage (pinned slots, a
        side stream, an event the consumer's stream waits on), else None."""
        if self._device is None or self._device.type != "cuda":
            return None
        if self._device.index is not None:
            return f"cuda:{self._device.index}"
        return _resolve_cuda("cuda")

    # Thread executor: called by the engine's worker threads, with the GIL.
    def _fetch(self, position, worker=0):
        """Makes the whole batch at `position` (worker threads always do: see _layout); None,
        or the error text naming the sample that failed."""
        # `worker`: the engine thread's id, 0..threads-1, the same in every epoch. The engine
        # keeps its worker threads (and their Python thread states, so their thread-local data)
        # from epoch to epoch; the WorkerInfo is still kept here by id and set each time, for a
        # sample made elsewhere (a replacement on the calling thread) and for an id whose thread
        # was replaced (it was stuck in a cancelled epoch's sample). An id's first sample runs
        # worker_init_fn, once for the loader's life (persistent workers).
        info = self._thread_worker(worker)
        if isinstance(info, str):
            return info
        _tls.info = info
        out, _, failed = _worker.make_batch(info.dataset, self._keys[position],
                                            self._batch_collate_fn, self._auto_collation)
        if failed is not None:
            return _worker.error_text(failed[0], failed[1], "a feedline worker thread")
        # A list: under on_error="skip" a failed batch's place is taken by another position,
        # which is then made twice.
        self._results.setdefault(position, []).append(out)
        return None

    def _thread_worker(self, worker):
        """Worker thread `worker`'s WorkerInfo, made (and worker_init_fn run) at its first
        sample; or the error text of its worker_init_fn (tried again at the next sample)."""
        info = self._thread_workers.get(worker)
        if info is None:
            # Each worker its own copy of the dataset, as each of torch's worker processes has.
            own = _worker_copy(self.dataset)
            info = tud._utils.worker.WorkerInfo(
                id=worker, num_workers=max(_cpus(), worker + 1), seed=torch.initial_seed(),
                dataset=own)
            _tls.info = info
            if self.worker_init_fn is not None:
                try:
                    self.worker_init_fn(worker)
                except Exception as e:  # noqa: BLE001
                    return _worker.error_text(e, f"worker_init_fn({worker})",
                                              "a feedline worker thread")
            self._thread_workers[worker] = info
        return info

    # Process executor: (re)starts worker i, from the engine's thread (GIL held).
    def _spawn(self, i, close_fds):
        import multiprocessing as mp
        import sys
        if sys.is_finalizing():
            raise RuntimeError("the interpreter is exiting")
        old = self._procs.get(i)
        code = None
        if old is not None:
            old.join(timeout=2)
            if old.is_alive():
                old.kill()
                old.join(timeout=2)
            # As torch says it (its SIGCHLD handler's words): "is killed by signal: ..."
            code = old.exitcode
            if code is not None and code < 0:
                import signal
                try:
                    code = (f"is killed by signal: {signal.strsignal(-code)} "
                            f"({signal.Signals(-code).name}).")
                except ValueError:
                    code = f"is killed by signal {-code}."
            elif code is not None:
                code = f"exited unexpectedly with exit code {code}."
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sfd = os.memfd_create(f"feedline-worker-{i}")
        staging = self._staging_bytes()
        os.ftruncate(sfd, staging)
        ctx = mp.get_context("fork")
        p = ctx.Process(target=_worker.main, daemon=True, name=f"feedline-worker-{i}",
                        args=(self.dataset, self._schema, self._batch_mode,
                              self._batch_collate_fn, req_r, rep_w,
                              sfd, staging, i, self._transform.processes or 1,
                              self._spawn_seed, self.worker_init_fn,
                              list(close_fds) + [req_w, rep_r], os.getpid(),
                              self._pad_config, self._learning(), self._auto_collation))
        p.start()
        os.close(req_r)
        os.close(rep_w)
        self._procs[i] = p
        return (p.pid, req_w, rep_r, sfd, staging, code)

    def _staging_bytes(self):
        """A worker process's shared staging area: two samples of the layout (a larger reply
        goes through the pipe), 64 MiB while the layout is not known. Pages are only used
        when written."""
        if self._schema is None:
            return 64 << 20
        per = sum(8 * len(f.shape) + 8 + f.slot_elements() *
                  torch.empty((), dtype=f.dtype).element_size() for f in self._schema.fields)
        return max(16 << 20, 2 * per + _collate.OBJECT_BYTES + 4096)

    def _stop_processes(self):
        if self._transform is not None:
            self._transform.stop_processes()
        for p in self._procs.values():
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        self._procs.clear()

    def close(self):
        """Stops the epoch in progress and the worker processes (also done at exit)."""
        it = self._iterator
        if it is not None:
            it._cancel("the loader was closed")
            self._iterator = None
        if self._transform is not None:
            self._transform.close()
        self._loader = None
        self._stop_processes()
        self._transform = None

    def __del__(self):
        # A copy of the loader in a forked child (a worker process of this or another loader,
        # collected there by Python's garbage collector) owns neither the engine's threads nor
        # the worker processes: stopping them there waited forever for requests that were in
        # flight in the parent at the fork (a hung test run: the child in StopProcesses).
        if getattr(self, "_owner_pid", None) != os.getpid():
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # --- checkpoints and figures ----------------------------------------------------------
    def state_dict(self):
        """Where the loader is: resumes exactly mid-epoch (map-style; the epoch's order is
        re-drawn from the saved RNG states and checked)."""
        it = self._iterator
        if self._is_iterable:
            state = getattr(self.dataset, "state_dict", None)
            return {"version": 1, "iterable": True,
                    "dataset": state() if callable(state) else None}
        done = it._batches_done if it is not None and not it._finished else None
        st = {"version": 1, "epochs_started": self._epochs_started,
              "sampler_epoch": getattr(self.sampler, "epoch", None)}
        if done is not None and self._epoch_state is not None:
            st.update(self._epoch_state, batches_done=done)
        return st

    def load_state_dict(self, state):
        _check_state(state, self._is_iterable)
        if state.get("iterable"):
            load = getattr(self.dataset, "load_state_dict", None)
            if state.get("dataset") is not None and callable(load):
                load(state["dataset"])
            return
        if state.get("sampler_epoch") is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(state["sampler_epoch"])
        self._epochs_started = state.get("epochs_started", 0)
        self._resume = state if "batches_done" in state else None

    def _retire(self, loader=None, transform=None):
        """Keeps the counts of an engine run or a transform that is being replaced (a new
        layout, a grown bound): stats() spans the loader's life."""
        if loader is not None:
            st = loader.stats()
            self._past_errors["error_count"] += st.get("error_count", 0)
            self._past_errors["errors"] += list(st.get("errors") or [])
        if transform is not None:
            for k, v in transform.stats().items():
                if k != "processes" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._past_py[k] = self._past_py.get(k, 0) + v  # counts, not the pool

    def stats(self):
        """The engine's figures, and a "python" stage: the executor chosen and why; for worker
        threads the time they waited to take the GIL for a sample (gil_wait_s), spent in the
        dataset's code (call_s) and, of that, off a CPU (off_cpu_s: taking the GIL back after a
        C call released it, I/O, waiting for a core)."""
        out = self._loader.stats() if self._loader is not None else {}
        if self._past_errors["error_count"]:
            out["error_count"] = out.get("error_count", 0) + self._past_errors["error_count"]
            out["errors"] = self._past_errors["errors"] + list(out.get("errors") or [])
        py = {"executor": self._executor or ("main" if self.num_workers == 0 else None),
              "reason": self._executor_reason if self.num_workers != 0 else "num_workers=0"}
        if self._transform is not None:
            py.update(self._transform.stats())
        for k, v in self._past_py.items():
            py[k] = py.get(k, 0) + v
        if self._pad:
            py["pad_bounds"] = {} if self._schema is None else {
                _collate._name(f.path): [-d for d in f.shape if d < 0]
                for f in self._schema.fields if f.variable}
            py["pad_restarts"] = self._pad_restarts
        out["python"] = py
        return out

    def __repr__(self):
        return (f"feedline.DataLoader({type(self.dataset).__name__}, batch_size="
                f"{self.batch_size}, executor={self._executor or self._executor_option})")


def _check_state(state, iterable):
    """Every field of a DataLoader state checked before use (ValueError or TypeError naming
    it): a checkpoint is a file anyone who can write it hands in."""
    if not isinstance(state, dict):
        raise TypeError("load_state_dict: expected the dict from state_dict(), got "
                        f"{type(state).__name__}")
    if state.get("version") != 1:
        raise ValueError("load_state_dict: not a feedline.DataLoader state (no version 1)")
    if "dataset_fingerprint" in state or "documents" in state:
        raise ValueError("load_state_dict: this is the state of a feedline.ImageLoader, "
                         "TextLoader or TokenLoader, not of a feedline.DataLoader")
    if bool(state.get("iterable")) != iterable:
        raise ValueError("load_state_dict: made for " +
                         ("an IterableDataset" if state.get("iterable") else "a map-style dataset")
                         + ", but this loader's dataset is not one")
    if iterable:
        return

    def integer(key, low=0, high=None, required=False):
        if key not in state or state[key] is None:
            if required:
                raise ValueError(f"load_state_dict: the state has no '{key}'")
            return None
        v = state[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"load_state_dict: '{key}' must be an int, got {type(v).__name__}")
        if v < low or (high is not None and v > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"load_state_dict: '{key}' must be {bound} (got {v})")
        return v

    integer("epochs_started")
    integer("sampler_epoch")
    if "batches_done" in state:
        for key in ("rng_state", "order"):
            if not isinstance(state.get(key), (bytes, str)):
                raise ValueError(f"load_state_dict: a mid-epoch state needs '{key}' "
                                 "(bytes or str), as state_dict() gives it")
        g = state.get("generator_state")
        if g is not None and not isinstance(g, bytes):
            raise TypeError("load_state_dict: 'generator_state' must be bytes or None")
        batches = integer("batches", required=True)
        integer("batches_done", 0, batches, required=True)


class _BaseIter:
    def __init__(self, owner):
        self._owner = owner
        self._batches_done = 0
        self._finished = False
        self._cancelled = None

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._owner)

    def _cancel(self, why):
        self._cancelled = why
        self._close()

    def _close(self):
        pass

    def _check(self):
        if self._cancelled is not None:
            raise RuntimeError(f"feedline.DataLoader: this epoch's iterator was stopped: "
                               f"{self._cancelled}")

    def _out(self, batch, on_device=False):
        self._batches_done += 1
        dev = self._owner._device
        if dev is not None and not on_device:
            batch = _to_device(batch, dev)
        return batch


def _to_device(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev, non_blocking=True)
    if isinstance(x, dict):
        return type(x)({k: _to_device(v, dev) for k, v in x.items()})
    if isinstance(x, list):
        return [_to_device(v, dev) for v in x]
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_to_device(v, dev) for v in x))
    if isinstance(x, tuple):
        return tuple(_to_device(v, dev) for v in x)
    return x


class _EmptyIter(_BaseIter):
    def __init__(self):
        self._batches_done, self._finished, self._cancelled = 0, True, None

    def __next__(self):
        raise StopIteration

    def __len__(self):
        return 0


class _SerialIter(_BaseIter):
    """num_workers=0: the calling thread does the work, as torch does."""

    def __init__(self, owner, batches, skip):
        super().__init__(owner)
        if owner.num_workers == 0:
            owner._executor, owner._executor_reason = "main", "num_workers=0"
        self._batches = iter(batches[skip:])
        self._batches_done = skip

    def __next__(self):
        self._check()
        o = self._owner
        try:
            keys = next(self._batches)
        except StopIteration:
            self._finished = True
            raise
        return self._out(o._batch_in_caller(keys))


class _EngineIter(_BaseIter):
    def __init__(self, owner, batches, skip, base_seed):
        super().__init__(owner)
        self._epoch = None
        self._started = False
        self._base_seed = base_seed
        self._schema = None
        self._engine_batch = 1
        self._batches_done = skip
        self._batches = batches  # the epoch's whole order: a restart continues in it
        self._position_batch = 0  # the engine's batches handed out (errors included)
        self._on_device = False
        self._serial = None  # the rest of the epoch's batches, when the calling thread loads
        self._learning_run = False  # this engine run makes the first batches, to learn the layout

    def _begin(self):
        """Starts (or, after a grown bound, restarts) the engine at the next batch to give."""
        self._started = True
        o = self._owner
        got = o._start_engine(self._batches, self._batches_done, self._base_seed)
        if got is None:
            self._finished = True
            return
        self._epoch, self._schema, self._engine_batch, self._learning_run = got
        self._position_batch = 0
        # Collated batches come from the copy stage already on the GPU (see _start_engine).
        self._on_device = self._schema is not None and o._engine_device() is not None

    def _grow_and_restart(self, overflow):
        """A padded sample was longer than its field's bound: the bound grows (kept for later
        epochs), the epoch restarts at this batch with the new slots; no sample is lost."""
        o = self._owner
        f, d, n = overflow
        o._pad_bounds[(f, d)] = _collate.learned_bound(n)
        o._pad_restarts += 1
        self._close()
        self._begin()
        if self._epoch is None:
            raise StopIteration

    def _close(self):
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            epoch.cancel()

    @property
    def _workers(self):
        """The worker processes (multiprocessing.Process, by worker id), as torch's iterator
        lists them; worker threads are not listed."""
        procs = self._owner._procs
        return [procs[i] for i in sorted(procs)]

    def __next__(self):
        self._check()
        if self._serial is not None:  # the calling thread took over (see below)
            o = self._owner
            try:
                keys = next(self._serial)
            except StopIteration:
                self._finished = True
                raise
            return self._out(o._batch_in_caller(keys))
        if not self._started:
            self._begin()
        if self._epoch is None:
            self._finished = True
            raise StopIteration
        o = self._owner
        try:
            # timeout=: worker processes time each sample themselves (the hung one is killed
            # and its sample named); worker threads cannot be, so the wait for the batch is.
            fields, _, index = self._epoch.next_fields(
                o.timeout if o._executor == "thread" else 0)
        except StopIteration:
            self._close()
            if self._learning_run and self._batches_done < len(self._batches):
                self._begin()  # the rest of the epoch, in place once the layout is known
                return self.__next__()
            self._finished = True
            raise
        except DataError:
            k = self._position_batch
            texts = [o._transform.take_error(pos)
                     for pos in range(k * self._engine_batch, (k + 1) * self._engine_batch)]
            for text in texts:
                details = text.partition("\n")[2] if text else ""
                if "_collate.PadOverflow" in details:
                    overflow = _collate.overflow_of(json.loads(details).get("message", ""))
                    if overflow is not None:
                        self._grow_and_restart(overflow)
                        return self.__next__()
            if o.num_workers is None and any('"unpicklable": true' in t for t in texts):
                # A batch that cannot travel between processes (a namedtuple pickle cannot find
                # by its name): with num_workers left out, the calling thread loads, as torch's
                # default (num_workers=0) does; torch's own workers would fail here too.
                self._close()
                o._executor, o._executor_reason = "main", (
                    "num_workers not given and the batches cannot be pickled: the calling "
                    "thread loads, as torch's default")
                o._stop_processes()
                self._serial = iter(self._batches[self._batches_done:])
                return self.__next__()
            self._position_batch += 1
            self._batches_done += 1
            for text in texts:
                if text:
                    _raise_from_text(text)
            raise
        self._position_batch += 1
        if self._schema is None:  # batch mode: the batch was made in Python
            pos = int(torch.from_dlpack(fields["batch"])[0])
            if o._executor == "process":
                out, learned = pickle.loads(o._transform.take_result(pos))
                o._learn(learned)
                return self._out(out)
            made = o._results[pos]
            out = made.pop()
            if not made:
                del o._results[pos]
            return self._out(out)
        columns = []
        for f in self._schema.fields:
            columns.append(_collate.as_field_dtype(torch.from_dlpack(fields[f"f{f.index}"]), f))
        lengths = {f.index: torch.from_dlpack(fields[f"f{f.index}_lengths"])
                   for f in self._schema.fields if f.variable}
        objects = None
        if self._schema.objects:
            values = torch.from_dlpack(fields[_collate.OBJECTS_FIELD]).cpu().numpy()
            offs = torch.from_dlpack(fields[_collate.OBJECTS_FIELD + "_offsets"]).tolist()
            objects = [pickle.loads(values[offs[i]:offs[i + 1]].tobytes())
                       for i in range(len(offs) - 1)]
        return self._out(_collate.rebuild(self._schema, columns, objects, lengths),
                         on_device=self._on_device)


def _check_cuda(device):
    """DeviceError when `device` ("cuda:N") is not a GPU the CUDA runtime sees."""
    from ._feedline import DeviceError
    info = _feedline.build_info()
    index = int(device.partition(":")[2] or 0)
    if index >= len(info["cuda_devices"]):
        raise DeviceError(f"device={device!r}: " + (
            info["cuda_unavailable_reason"] or f"{len(info['cuda_devices'])} CUDA device(s)"))


def _signed64(seed):
    """A base seed (torch's: 0 .. 2**64 - 1) as the int64 word the wire carries."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _worker_copy(dataset):
    """A worker thread's own (shallow) copy of the dataset, as each of torch's worker processes
    has one: what worker_init_fn stores on get_worker_info().dataset (torch's documented idiom
    for sharding) stays that worker's. A dataset that cannot be copied is shared."""
    try:
        return copy.copy(dataset)
    except Exception:  # noqa: BLE001
        return dataset


def _raise_if_out_of_fds(cause):
    """RuntimeError with torch's advice when this process is within reach of its open-file
    limit (a batch's tensors from a worker process each take a descriptor while alive)."""
    import errno
    import tempfile
    try:
        files = [tempfile.TemporaryFile() for _ in range(10)]
    except OSError as e:
        if e.errno == errno.EMFILE:
            raise RuntimeError(
                "Too many open files. Communication with the workers is no longer possible. "
                "Please increase the limit using `ulimit -n` in the shell or change the sharing "
                "strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')` "
                "at the beginning of your code (feedline.DataLoader: tensors from worker "
                "processes hold a file descriptor each while they live)") from cause
        return
    for f in files:
        f.close()


class _IterableIter(_BaseIter):
    """An IterableDataset: one replica per worker, batches round robin (torch's order)."""

    def __init__(self, owner, base_seed, shared_seed=None):
        super().__init__(owner)
        o = owner
        self._shared_seed = shared_seed
        self._len_called = o._IterableDataset_len_called
        self._num_yielded = 0
        n = o.num_workers if o.num_workers is not None else 0  # torch's default
        self._n = n
        if n == 0:
            o._executor, o._executor_reason = "main", "num_workers=0"
            ws, rank = tud.dataloader._get_distributed_settings()
            ds = _replica(o.dataset, shared_seed, rank, ws)
            self._serial = self._batched(iter(ds))
            return
        self._serial = None
        use_threads = o._executor_option == "thread"
        o._executor = "thread" if use_threads else "process"
        o._executor_reason = ("forced (executor=)" if o._executor_option != "auto" else
                              "an IterableDataset: one replica per worker, as torch")
        depth = o.prefetch_factor or 2
        if use_threads:
            import queue
            self._queues = [queue.Queue(maxsize=depth) for _ in range(n)]
            self._stop = threading.Event()
            self._workers = [threading.Thread(target=self._thread_main, args=(i, base_seed),
                                              daemon=True) for i in range(n)]
        else:
            import torch.multiprocessing as tmp
            ctx = tmp.get_context("fork")
            self._queues = [ctx.Queue(maxsize=depth) for _ in range(n)]
            self._stop = ctx.Event()
            self._workers = [ctx.Process(target=_iterable_worker, daemon=True,
                                         args=(o.dataset, o.batch_size, o.drop_last,
                                               o.collate_fn, self._queues[i], self._stop, i, n,
                                               base_seed, o.worker_init_fn, os.getpid(),
                                               shared_seed))
                             for i in range(n)]
        for w in self._workers:
            w.start()
        self._active = list(range(n))
        self._turn = 0

    def _batched(self, it):
        o = self._owner
        if o.batch_size is None:
            for x in it:
                yield o.collate_fn(x)
            return
        while True:
            chunk = list(itertools.islice(it, o.batch_size))
            if not chunk or (len(chunk) < o.batch_size and o.drop_last):
                return
            yield o.collate_fn(chunk)

    def _thread_main(self, i, base_seed):
        o = self._owner
        q = self._queues[i]
        try:
            # Each replica its own dataset, as in torch's worker processes (a DataPipe's graph
            # copied whole: sharding sets state inside it).
            own = (copy.deepcopy(o.dataset) if isinstance(o.dataset, tud.IterDataPipe)
                   else _worker_copy(o.dataset))
            ws, rank = tud.dataloader._get_distributed_settings()
            own = _replica(own, self._shared_seed, i * ws + rank, self._n * ws)
            _tls.info = tud._utils.worker.WorkerInfo(id=i, num_workers=self._n,
                                                     seed=base_seed + i, dataset=own)
            if o.worker_init_fn is not None:
                o.worker_init_fn(i)
            for b in self._batched(iter(own)):
                while not self._stop.is_set():
                    try:
                        q.put(("batch", b), timeout=0.1)
                        break
                    except Exception:  # noqa: BLE001 (queue.Full)
                        pass
                if self._stop.is_set():
                    return
            q.put(("end", None))
        except Exception as e:  # noqa: BLE001
            q.put(("error", _worker.error_text(e, "the dataset's iterator",
                                               f"feedline worker thread {i}")))

    def __next__(self):
        data = self._next_data()
        # As torch: once len(loader) was asked, yielding more than it said is warned about
        # (replicas that do not shard themselves by get_worker_info() repeat the data).
        self._num_yielded += 1
        if self._len_called is not None and self._num_yielded > self._len_called:
            o = self._owner
            msg = (f"Length of IterableDataset {o.dataset} was reported to be {self._len_called} "
                   f"(when accessing len(dataloader)), but {self._num_yielded} samples have been "
                   "fetched. ")
            if self._n > 0:
                msg += ("For multiprocessing data-loading, this could be caused by not properly "
                        "configuring the IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data."
                        "IterableDataset for examples.")
            warnings.warn(msg)
        return data

    def _next_data(self):
        self._check()
        o = self._owner
        if self._serial is not None:
            try:
                return self._out(next(self._serial))
            except StopIteration:
                self._finished = True
                raise
        import queue
        while self._active:
            i = self._active[self._turn % len(self._active)]
            deadline = time.monotonic() + o.timeout if o.timeout > 0 else None
            while True:
                try:
                    kind, value = self._queues[i].get(timeout=0.2)
                    break
                except queue.Empty:
                    w = self._workers[i]
                    if hasattr(w, "exitcode") and not w.is_alive():
                        self._close()
                        raise RuntimeError(f"feedline.DataLoader: worker process {i} (pid "
                                           f"{w.pid}) exited unexpectedly with exit code "
                                           f"{w.exitcode}") from None
                    if deadline is not None and time.monotonic() > deadline:
                        self._close()
                        raise RuntimeError(f"DataLoader timed out after {o.timeout} seconds")
                except (RuntimeError, OSError) as e:
                    # Tensors come from worker processes as file descriptors: out of them, say
                    # so and what to do, as torch does, rather than "received 0 items of ancdata".
                    _raise_if_out_of_fds(e)
                    raise
            if kind == "end":
                self._active.remove(i)
                continue
            self._turn += 1
            if kind == "error":
                _raise_from_text(value)
            return self._out(value)
        self._finished = True
        self._close()
        raise StopIteration

    def _close(self):
        if self._serial is not None or not hasattr(self, "_workers"):
            return
        self._stop.set()
        for w in self._workers:
            if hasattr(w, "kill"):
                w.join(timeout=0.5)
                if w.is_alive():
                    w.kill()
                    w.join(timeout=2)
        self._workers = []


def _replica(dataset, shared_seed, index, count):
    """A DataPipe as torch 1.13 prepares it for replica `index` of `count` (workers times ranks):
    its shufflers seeded from the epoch's shared seed, its sharding_filter set. Other datasets
    are returned as they are."""
    from torch.utils.data import graph_settings
    if isinstance(dataset, tud.IterDataPipe) and shared_seed is not None:
        rng = torch.Generator()
        rng.manual_seed(shared_seed)
        dataset = graph_settings.apply_random_seed(dataset, rng)
    if isinstance(dataset, (tud.IterDataPipe, tud.MapDataPipe)):
        graph_settings.apply_sharding(dataset, count, index)
    return dataset


def _iterable_worker(dataset, batch_size, drop_last, collate_fn, q, stop, i, n, base_seed,
                     init_fn, parent_pid, shared_seed=None):
    import signal
    _worker.exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _worker._keep_heap()
    seed = _worker.seed_worker(base_seed, i)
    ws, rank = tud.dataloader._get_distributed_settings()
    dataset = _replica(dataset, shared_seed, i * ws + rank, n * ws)
    _worker.set_worker_info(i, n, seed, dataset)
    try:
        if init_fn is not None:
            init_fn(i)
        it = iter(dataset)
        while not stop.is_set():
            if batch_size is None:
                try:
                    b = collate_fn(next(it))
                except StopIteration:
                    break
            else:
                chunk = list(itertools.islice(it, batch_size))
                if not chunk or (len(chunk) < batch_size and drop_last):
                    break
                b = collate_fn(chunk)
            q.put(("batch", b))
        q.put(("end", None))
    except Exception as e:  # noqa: BLE001
        q.put(("error", _worker.error_text(e, "the dataset's iterator",
                                           f"feedline worker process {i} (pid {os.getpid()})")))
    # Tensors travel as shared-memory file descriptors that this process hands over on request:
    # it stays until the loader has taken them all (the epoch ends or is stopped).
    stop.wait()
