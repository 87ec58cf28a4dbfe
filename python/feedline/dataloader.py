"""feedline.DataLoader: torch's DataLoader, on feedline's engine.

    loader = feedline.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)

takes every argument torch's DataLoader takes and gives the same batches. What changes is where
the work runs: map-style datasets run on feedline's engine (python/py_dataset.h) — positions of
the epoch's order claimed by C++ worker threads, each sample made either by the thread itself
under the GIL (when the dataset's work releases it: numpy, PIL decode, torch ops) or by a
persistent forked worker process (when it holds it: pure-Python parsing), chosen by measuring
the dataset at the first epoch, and collated in place into the batch slot (torch's
default_collate semantics, see _collate.py). The worker count is tuned by the engine, as for
images; ``workers=N`` fixes it. ``num_workers=0`` loads in the calling thread, as in torch.
Iterable datasets run one replica per worker (``get_worker_info()`` set), batches taken round
robin as torch takes them.
"""

import atexit
import collections
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
from ._feedline import DataError

__all__ = ["DataLoader"]

# Samples read to learn which dimensions of pad=True leaves vary (and their bounds).
_PAD_PROBE = 32
# Below this cost per sample (one thread, measured at the first epoch) the calling thread loads
# (as num_workers=0 does): a hand-off to a worker thread or process costs more than the sample
# (bench/peer_pydataset.py "python": 58 us samples, 17.4k/s in the calling thread vs 11.6k/s
# on two processes and 4.2k/s on two GIL-bound threads).
_INLINE_US = 40
# After the first epoch, an automatic choice is revisited when the consumer waited at least this
# share of the time (the loader was the bottleneck), over at least this many batches.
_REVISIT_WAIT = 0.5
_REVISIT_BATCHES = 10

_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():  # before the interpreter goes: no engine thread may wait for the GIL then
    for loader in list(_LIVE):
        try:
            loader.close()
        except Exception:  # noqa: BLE001
            pass


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
      workers: "auto" (tuned while running) or a fixed count of engine workers.
      executor: "auto" (measured at the first epoch), "thread" or "process".
      memory_budget: bytes of batch slots in flight ("auto": a share of the machine's memory).
      on_error: "raise" (the sample's exception reaches the loop) or "skip" (replaced, counted).
      seed: seeds the shuffle (a torch.Generator) when no ``generator`` is given.
      device: where batches arrive. "cuda"/"cuda:N": batches collated by feedline are copied
        from pinned slots on a side stream (the consumer's stream waits on an event, as with
        ImageLoader; lengths stay on the host); others move with ``.to(device)``.
      pad: True (pad every leaf whose shape varies), or {name: True | bound | per-dimension
        bounds}; padded to the batch's longest with ``pad_value``, lengths beside them
        (``"<key>_lengths"`` in a dict sample, else a (padded, lengths) pair).

    ``num_workers=0`` loads in the calling thread as torch does; any other count (or None)
    loads in parallel with the worker count tuned (``workers=N`` fixes it). For an
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
            if shuffle not in (None, False):
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
        self._probe_rate = None  # samples/s of one thread (the executor probe)
        self._flat_keys = []
        self._revisited = False
        self._epochs_finished = 0
        self._last_epoch = None  # the last full engine epoch: samples, seconds, consumer wait
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
        # As torch's iterator: a base seed for the workers first, then the sampler's draws.
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator)
                        .item())
        self._epochs_started += 1
        if not self.persistent_workers:
            # As torch's workers made anew for each epoch: worker_init_fn runs again in every
            # worker thread, with a new WorkerInfo (the threads themselves are kept).
            self._thread_workers.clear()
        if self._is_iterable:
            it = _IterableIter(self, base_seed)
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
            if (self.num_workers != 0 and self._executor_option == "auto"
                    and self._executor in ("thread", "process") and not self._revisited
                    and self._epochs_finished >= 1 and self._loader is not None):
                self._revisit()
            if self.num_workers == 0 or self._executor == "main":
                it = _SerialIter(self, batches, skip)
            else:
                it = self._engine_iter(batches, skip, base_seed)
        self._iterator = it
        return it

    def _engine_iter(self, batches, skip, base_seed):
        left = batches[skip:]
        sizes = {len(b) for b in left[:-1]}
        regular = self._auto_collation and len(sizes) <= 1 and (
            not left or not sizes or len(left[-1]) <= min(sizes))
        schema = None
        if left and regular and self.collate_fn is tud.default_collate:
            schema = _collate.infer(self.dataset[left[0][0]])
            if schema is not None and (self._pad or self._pad_bounds):
                keys = [k for b in left for k in b]
                probe = keys[::max(1, len(keys) // _PAD_PROBE)][:_PAD_PROBE]
                schema = _collate.resolve_pad([self.dataset[k] for k in probe], schema,
                                              self._pad, self._pad_value, self._pad_bounds)
        batch_mode = schema is None
        if batch_mode:
            engine_batch = 1
            flat = [k for b in left for k in b]
            offsets = list(itertools.accumulate([0] + [len(b) for b in left]))
        else:
            engine_batch = max(len(left[0]), 1)
            flat = [b for batch in left for b in batch]
            offsets = list(range(len(flat) + 1))
        self._flat_keys = flat
        if self._executor is None:
            self._executor, self._executor_reason = self._choose_executor(schema, flat)
        if self._executor == "main":
            return _SerialIter(self, batches, skip)
        self._ensure_transform(schema, batch_mode, flat)
        self._keys = flat if not batch_mode else left
        self._key_offsets = offsets
        if self._executor == "process":
            if not all(isinstance(k, int) for k in flat):
                raise TypeError("executor='process' needs int sample keys; use executor='thread'")
            self._transform.set_keys([int(k) for k in flat], offsets)
        else:
            self._transform.set_keys([], [0])
        positions = len(left)if batch_mode else len(flat)
        key = (positions, engine_batch)
        if self._loader is None or self._loader_key != key:
            self._loader = None
            if positions == 0:
                return _EmptyIter()
            from . import _parse_bytes, _parse_count
            workers = _parse_count("workers", self._workers)
            self._loader = _feedline.python_loader(
                self._transform, positions=positions, fingerprint=positions,
                batch_size=engine_batch, drop_last=False, workers=workers,
                prefetch=_parse_count("prefetch", self.prefetch_factor),
                memory_budget=_parse_bytes("memory_budget", self._memory_budget),
                on_error=self._on_error,
                max_errors=_parse_count("max_errors", self._max_errors),
                device=(self._engine_device() if schema is not None else None) or "cpu")
            self._loader_key = key
        self._results.clear()
        return _EngineIter(self, self._loader.start_epoch(), schema, engine_batch, skip, batches)

    def _ensure_transform(self, schema, batch_mode, flat):
        key = (None if schema is None else [f for f in schema.engine_fields()], batch_mode)
        if self._transform is not None and self._transform_key == key:
            return
        self._stop_processes()
        self._schema = schema
        self._batch_mode = batch_mode
        fields = schema.engine_fields() if schema is not None else [("batch", "int64", [], False)]
        self._transform = _feedline.PythonTransform(fields, batch_mode, _weak(self._fetch))
        self._transform.set_timeout(float(self.timeout))
        self._transform_key = key
        self._loader = None
        if self._executor == "process":
            self._staging = 64 << 20
            if schema is not None:
                per = sum(8 * len(f.shape) + 8 + f.slot_elements() *
                          torch.empty((), dtype=f.dtype).element_size() for f in schema.fields)
                self._staging = max(16 << 20, 2 * per + _collate.OBJECT_BYTES + 4096)
            from . import _parse_count
            count = _parse_count("workers", self._workers) or _cpus()
            self._base_seed_procs = int(torch.empty((), dtype=torch.int64).random_().item())
            self._transform.use_processes(_weak(self._spawn), count)

    def _timed_fetch(self, schema, ring, threads, seconds):
        """(samples per second, CPU seconds per wall second) of `threads` threads fetching
        samples (and flattening them into the schema's columns) for about `seconds`. The second
        figure is the tell: threads that hold the GIL take turns (about 1 CPU second per second,
        however many), threads whose work releases it run at once."""
        stop = time.perf_counter() + seconds
        counts = [0] * threads
        cpu = [0.0] * threads

        def run(t):
            c0 = time.thread_time()
            while counts[t] < 4 or time.perf_counter() < stop:
                sample = self.dataset[next(ring)]
                if schema is not None:
                    _collate.flatten(sample, schema)
                counts[t] += 1
            cpu[t] = time.thread_time() - c0

        t0 = time.perf_counter()
        pool = [threading.Thread(target=run, args=(t,)) for t in range(1, threads)]
        for t in pool:
            t.start()
        run(0)
        for t in pool:
            t.join()
        wall = time.perf_counter() - t0
        return sum(counts) / wall, sum(cpu) / wall

    @property
    def _collate_batch(self):
        """What collates a batch made in Python (the calling thread, or a worker's irregular
        batch): with pad=, torch's default collation padded as the engine pads."""
        if self._pad and self._auto_collation and self.collate_fn is tud.default_collate:
            if self._padded_collate is None:
                self._padded_collate = _collate.PaddedCollate(self._pad, self._pad_value)
            return self._padded_collate
        return self.collate_fn

    def _choose_executor(self, schema, flat):
        if self._executor_option != "auto":
            return self._executor_option, "forced (executor=)"
        keys = flat if flat else [0]
        ring = itertools.cycle(keys)
        try:
            with _GlobalRngWatch() as rng:
                self._timed_fetch(schema, ring, 1, 0)  # warm-up, watched
            one, busy = self._timed_fetch(schema, ring, 1, 0.05)
        except Exception:  # noqa: BLE001 (the sample's error comes again, at its batch)
            return "thread", "the probe's sample failed"
        self._probe_rate = one
        if rng.calls and all(isinstance(k, int) for k in flat[:64]) and _cpus() >= 2:
            # Never run in two threads, not even to measure: their draws would interleave, and
            # torch 1.13 can deadlock (a thread holding the generator's lock waits for the GIL
            # that a thread waiting for that lock holds).
            calls = ", ".join(f"{n} x{c}" for n, c in sorted(rng.calls.items()))
            return "process", (f"the dataset sets torch's global RNG state ({calls}: "
                               "FakeData does): threads would share it, processes keep their own")
        if one > 1e6 / _INLINE_US and self._inline_allowed() and self._thread_safe(keys):
            return "main", (f"{1e6 / one:.0f} us per sample: the calling thread loads (as "
                            "num_workers=0), cheaper than a hand-off to a worker")
        if one > 1 / 30e-6:
            return "thread", (f"{1e6 / one:.0f} us per sample: cheaper than a hand-off to "
                              "a process")
        if not all(isinstance(k, int) for k in flat[:64]):
            return "thread", "sample keys are not ints"
        if _cpus() < 2:
            return "thread", "one core: nothing to gain from processes"
        if busy < 0.5:  # I/O, sleeps: the GIL is free while it waits
            return "thread", (f"the dataset waits more than it computes ({busy:.2f} CPU "
                              "seconds per second in one thread)")
        try:
            # Two rounds, the more parallel one: a busy machine only ever lowers the figure.
            parallel = max(self._timed_fetch(schema, ring, 2, 0.1)[1] for _ in range(2))
        except Exception:  # noqa: BLE001
            return "thread", "the probe's sample failed"
        if parallel >= 1.3:
            if not self._thread_safe(keys):
                return "process", ("the dataset gives each sample the same bytes alone but not "
                                   "from two threads at once (it changes global state, such as "
                                   "torch's RNG): processes keep torch's isolation")
            return "thread", (f"the dataset releases the GIL: 2 threads ran {parallel:.2f} CPU "
                              "seconds per second")
        return "process", (f"the dataset holds the GIL: 2 threads ran only {parallel:.2f} CPU "
                           "seconds per second")

    def _revisit(self):
        """Once, after the first epoch of an automatic choice: when the loader was the
        bottleneck (the consumer waited), moves to what the measurements say is faster — the
        calling thread when one thread loads faster than the workers delivered, processes when
        worker threads spent their time waiting for the GIL."""
        self._revisited = True
        last = self._last_epoch or {}
        rate = last.get("samples", 0) / max(last.get("seconds", 0.0), 1e-9)
        wait = last.get("wait_fraction", 0.0)
        py = self._transform.stats() if self._transform is not None else {}
        if wait < _REVISIT_WAIT:
            return  # the consumer is the bottleneck: the loader keeps up
        if last.get("batches", 0) < _REVISIT_BATCHES:
            return  # a short epoch is mostly the pipeline filling: nothing to conclude
        was = f"{self._executor} workers delivered {rate:.0f} samples/s"
        if self._inline_allowed() and self._auto_collation:
            # A quick look first (20 ms of samples, no collation: an upper bound); only when
            # even it would beat the workers is the calling thread measured for real.
            rng = torch.get_rng_state()  # the measurement's draws must not shift the epoch's
            try:
                keys = itertools.cycle(self._flat_keys or [0])
                quick = self._timed_fetch(None, keys, 1, 0.02)[0]
                one = self._inline_rate() if quick > 1.25 * rate else 0.0
            except Exception:  # noqa: BLE001 (the sample's error comes again, at its batch)
                one = 0.0
            finally:
                torch.set_rng_state(rng)
            # A dataset that changes global state (reseeds torch's RNG, as FakeData does) would
            # change it in the training's own thread: it keeps its workers.
            if one > 1.25 * rate and self._thread_safe(self._flat_keys[:64] or [0]):
                self._switch("main", f"revisited after epoch 1: {was} while the consumer waited "
                                     f"{wait:.0%}; one thread loads {one:.0f}/s, so the calling "
                                     "thread does (as num_workers=0)")
                return
        # Waiting: to take the GIL for a sample, and inside the dataset's code off a CPU (to
        # take the GIL back after a C call released it, mostly; I/O waits count too, but a
        # dataset that mostly waits for I/O was given threads by the probe and stays there).
        call, gil = py.get("call_s", 0.0), py.get("gil_wait_s", 0.0)
        waiting = (gil + py.get("off_cpu_s", 0.0)) / max(gil + call, 1e-9)
        if self._executor == "thread" and call > 0 and waiting > 0.3 and all(
                isinstance(k, int) for k in self._flat_keys[:64]) and _cpus() >= 2:
            self._switch("process", f"revisited after epoch 1: {was}, waiting for the GIL "
                                    f"{waiting:.0%} of their time; processes each have one")

    def _inline_rate(self):
        """Samples/s of the calling thread loading and collating whole batches as num_workers=0
        does (at least a batch and 0.1 s, distinct samples of the epoch: a few samples fetched
        over and over stay in the caches and look cheaper than they are)."""
        keys, bs = self._flat_keys, max(self.batch_size or 1, 1)
        t0 = time.perf_counter()
        n = 0
        for i in range(0, len(keys), bs):
            self._collate_batch([self.dataset[k] for k in keys[i:i + bs]])
            n += len(keys[i:i + bs])
            if time.perf_counter() - t0 >= 0.1:
                break
        return n / max(time.perf_counter() - t0, 1e-9)

    def _engine_device(self):
        """"cuda:N" when batches go to a GPU through the engine's copy stage (pinned slots, a
        side stream, an event the consumer's stream waits on), else None."""
        if self._device is None or self._device.type != "cuda":
            return None
        if self._device.index is not None:
            return f"cuda:{self._device.index}"
        from . import _resolve_cuda
        return _resolve_cuda("cuda")

    def _inline_allowed(self):
        """The calling thread may load only where nothing tells it from a worker: no
        worker_init_fn to run, no timeout to enforce, no failed sample to replace."""
        return (self.worker_init_fn is None and not self.timeout and self._on_error == "raise"
                and self._device is None)

    def _switch(self, executor, reason):
        self._stop_processes()
        self._transform = None
        self._transform_key = None
        self._loader = None
        self._executor, self._executor_reason = executor, reason

    def _thread_safe(self, keys):
        """False when samples that are deterministic one at a time change when two threads
        load them together (a dataset that reseeds torch's global RNG, as torchvision's
        FakeData does, or keeps a shared cursor). Random datasets cannot be told apart: True."""
        def feed(x, h):  # tensors' pickles are not deterministic: their bytes are
            if isinstance(x, torch.Tensor):
                h.update(str((x.dtype, tuple(x.shape))).encode())
                t = x.detach().cpu().contiguous()
                h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
                         .tobytes())
            elif isinstance(x, dict):
                for k, v in x.items():
                    h.update(repr(k).encode())
                    feed(v, h)
            elif isinstance(x, (list, tuple)):
                h.update(b"[%d" % len(x))
                for v in x:
                    feed(v, h)
            elif hasattr(x, "tobytes"):  # numpy arrays, PIL images
                h.update(x.tobytes())
            else:
                h.update(repr(x).encode())

        def digest(k):
            h = hashlib.sha1()
            feed(self.dataset[k], h)
            return h.digest()

        ks = list(itertools.islice(itertools.cycle(keys), 8))
        alone = [digest(k) for k in ks]
        if alone != [digest(k) for k in ks]:
            return True  # random per fetch (augmentations): nothing to compare
        together = {}

        def run(t):
            for _ in range(4):
                for i, k in enumerate(ks):
                    if together.setdefault((t, i), digest(k)) != digest(k) or \
                            together[(t, i)] != alone[i]:
                        together["differs"] = True

        import sys
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # interleave the threads as finely as the engine's would
        try:
            threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        return "differs" not in together

    # Thread executor: called by the engine's worker threads, with the GIL.
    def _fetch(self, position, worker=0):
        # `worker`: the engine thread's id, 0..threads-1, the same in every epoch. The engine
        # keeps its worker threads (and their Python thread states, so their thread-local data)
        # from epoch to epoch; the WorkerInfo is still kept here by id and set each time, for a
        # sample made elsewhere (a replacement on the calling thread) and for an id whose thread
        # was replaced (it was stuck in a cancelled epoch's sample). An id's first sample runs
        # worker_init_fn, once for the loader's life (persistent workers).
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
                except Exception as e:  # noqa: BLE001 (tried again at the id's next sample)
                    return _worker.error_text(e, f"worker_init_fn({worker})",
                                              "a feedline worker thread")
            self._thread_workers[worker] = info
        _tls.info = info
        dataset = info.dataset
        if self._batch_mode:
            keys = self._keys[position]
            what = f"the batch of dataset{keys}"
            try:
                if self._auto_collation:
                    out = self._collate_batch([dataset[k] for k in keys])
                else:
                    out = self.collate_fn(dataset[keys[0]])
            except Exception as e:  # noqa: BLE001
                return _worker.error_text(e, what, "a feedline worker thread")
            self._results[position] = out
            return None
        key = self._keys[position]
        try:
            return _collate.flatten(dataset[key], self._schema, contiguous=False)
        except Exception as e:  # noqa: BLE001
            return _worker.error_text(e, f"dataset[{key}]", "a feedline worker thread")

    # Process executor: (re)starts worker i, from the engine's thread (GIL held).
    def _spawn(self, i, close_fds):
        import multiprocessing as mp
        old = self._procs.get(i)
        code = None
        if old is not None:
            old.join(timeout=2)
            if old.is_alive():
                old.kill()
                old.join(timeout=2)
            code = old.exitcode
            if code is not None and code < 0:
                import signal
                try:
                    code = f"{code}, {signal.Signals(-code).name}"
                except ValueError:
                    pass
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sfd = os.memfd_create(f"feedline-worker-{i}")
        os.ftruncate(sfd, self._staging)
        ctx = mp.get_context("fork")
        p = ctx.Process(target=_worker.main, daemon=True, name=f"feedline-worker-{i}",
                        args=(self.dataset, self._schema, self._batch_mode,
                              self._collate_batch if self._auto_collation else None, req_r, rep_w,
                              sfd, self._staging, i, self._transform.processes or 1,
                              self._base_seed_procs, self.worker_init_fn,
                              list(close_fds) + [req_w, rep_r], os.getpid()))
        p.start()
        os.close(req_r)
        os.close(rep_w)
        self._procs[i] = p
        return (p.pid, req_w, rep_r, sfd, self._staging, code)

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

    def stats(self):
        """The engine's figures, and a "python" stage: the executor chosen and why; for worker
        threads the time they waited to take the GIL for a sample (gil_wait_s), spent in the
        dataset's code (call_s) and, of that, off a CPU (off_cpu_s: taking the GIL back after a
        C call released it, I/O, waiting for a core)."""
        out = self._loader.stats() if self._loader is not None else {}
        py = {"executor": self._executor or ("main" if self.num_workers == 0 else None),
              "reason": self._executor_reason if self.num_workers != 0 else "num_workers=0",
              "probe_samples_per_s": self._probe_rate}
        if self._transform is not None:
            py.update(self._transform.stats())
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


class _GlobalRngWatch:
    """Counts, while active, the calls that set or save torch's global CPU RNG state
    (manual_seed, seed, get_rng_state, set_rng_state; fork_rng uses them). For a single-threaded
    probe only: it swaps module attributes."""

    _NAMES = ("manual_seed", "seed", "get_rng_state", "set_rng_state")

    def __enter__(self):
        self.calls = collections.Counter()
        self._saved = []
        for module in (torch, torch.random):
            for name in self._NAMES:
                fn = getattr(module, name, None)
                if fn is None:
                    continue
                self._saved.append((module, name, fn))

                def counted(*a, _fn=fn, _name=name, **kw):
                    self.calls[_name] += 1
                    return _fn(*a, **kw)
                setattr(module, name, counted)
        return self

    def __exit__(self, *exc):
        for module, name, fn in reversed(self._saved):
            setattr(module, name, fn)
        return False


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
        if o._auto_collation:
            return self._out(o._collate_batch([o.dataset[k] for k in keys]))
        return self._out(o.collate_fn(o.dataset[keys[0]]))


class _EngineIter(_BaseIter):
    def __init__(self, owner, epoch, schema, engine_batch, skip, batches):
        super().__init__(owner)
        self._epoch = epoch
        self._schema = schema
        self._engine_batch = engine_batch
        self._batches_done = skip
        self._batches = batches  # the epoch's whole order: a restart continues in it
        self._position_batch = 0  # the engine's batches handed out (errors included)
        # This epoch's own figures for the revisit (the engine's stats span every epoch and
        # the pauses between them, e.g. a validation loop).
        self._t0 = time.perf_counter()
        self._waited = 0.0
        self._samples = sum(len(b) for b in batches[skip:])
        self._epoch_batches = len(batches) - skip
        # Collated batches come from the copy stage already on the GPU (see _engine_iter).
        self._on_device = schema is not None and owner._engine_device() is not None

    def _grow_and_restart(self, overflow):
        """A padded sample was longer than its field's bound: the bound grows (kept for later
        epochs), the epoch restarts at this batch with the new slots; no sample is lost."""
        o = self._owner
        f, d, n = overflow
        o._pad_bounds[(f, d)] = _collate.learned_bound(n)
        o._pad_restarts += 1
        self._close()
        new = o._engine_iter(self._batches, self._batches_done, None)
        if isinstance(new, _EmptyIter):
            self._finished = True
            raise StopIteration
        self._epoch, self._schema = new._epoch, new._schema
        self._engine_batch, self._on_device = new._engine_batch, new._on_device
        self._position_batch = 0
        new._epoch = None

    def _close(self):
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            epoch.cancel()

    def __next__(self):
        self._check()
        if self._epoch is None:
            raise StopIteration
        o = self._owner
        t = time.perf_counter()
        try:
            # timeout=: worker processes time each sample themselves (the hung one is killed
            # and its sample named); worker threads cannot be, so the wait for the batch is.
            fields, _, index = self._epoch.next_fields(
                o.timeout if o._executor == "thread" else 0)
        except StopIteration:
            self._finished = True
            o._epochs_finished += 1
            seconds = time.perf_counter() - self._t0
            o._last_epoch = {"samples": self._samples, "batches": self._epoch_batches,
                             "seconds": seconds,
                             "wait_fraction": min(1.0, self._waited / max(seconds, 1e-9))}
            self._close()
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
            self._position_batch += 1
            self._batches_done += 1
            for text in texts:
                if text:
                    _raise_from_text(text)
            raise
        self._waited += time.perf_counter() - t
        self._position_batch += 1
        if self._schema is None:  # batch mode: the batch was made in Python
            pos = int(torch.from_dlpack(fields["batch"])[0])
            if o._executor == "process":
                return self._out(pickle.loads(o._transform.take_result(pos)))
            return self._out(o._results.pop(pos))
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

    def __init__(self, owner, base_seed):
        super().__init__(owner)
        o = owner
        self._len_called = o._IterableDataset_len_called
        self._num_yielded = 0
        n = o.num_workers if o.num_workers is not None else 0  # torch's default
        self._n = n
        if n == 0:
            o._executor, o._executor_reason = "main", "num_workers=0"
            self._serial = self._batched(iter(o.dataset))
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
                                               base_seed, o.worker_init_fn, os.getpid()))
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
        own = _worker_copy(o.dataset)  # each replica its own, as in torch's worker processes
        _tls.info = tud._utils.worker.WorkerInfo(id=i, num_workers=self._n, seed=base_seed + i,
                                                 dataset=own)
        q = self._queues[i]
        try:
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


def _iterable_worker(dataset, batch_size, drop_last, collate_fn, q, stop, i, n, base_seed,
                     init_fn, parent_pid):
    import signal
    _worker.exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    seed = _worker.seed_worker(base_seed, i)
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
