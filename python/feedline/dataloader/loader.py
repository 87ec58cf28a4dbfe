"""feedline.DataLoader itself: torch's arguments and attributes, epochs (iter), the loader's
life (close) and its figures (stats). How the work is done is in the modules beside it."""

import os
import threading
import typing
import weakref

import torch
import torch.utils.data as tud

from .. import _collate
from . import _ahead, _arguments, _offload
from ._executor import _Executor
from ._iterable import _IterableIter
from ._iterators import _EmptyIter, _EngineIter, _SerialIter
from ._resume import _Resume, _order_fingerprint
from ._runtime import _LIVE, _register_exit

_T_co = typing.TypeVar("_T_co", covariant=True)
# The engine's figures that add up over the runs a loader replaces (stats() spans its life).
_ADDED_UP = ("samples", "batches", "elapsed_s", "consumer_wait_s", "epoch_start_wait_s",
             "consumer_cpu_s", "consumer_run_delay_s")


def _successor(seed):
    """The next epoch's base seed from this one's (splitmix64), in [0, 2**63) as drawn ones."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


class DataLoader(_Executor, _Resume, typing.Generic[_T_co]):
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
      offload: a distributed.Client or a Dask scheduler's address: the dataset (it must
        pickle), collate_fn and worker_init_fn go to the cluster's workers, which make part of
        each epoch's batches, as worker process k mod num_workers would make batch k, with the
        same bytes; stats()["offload"] says how many came from where (map-style datasets,
        worker processes, on_error="raise").

    ``persistent_workers`` left out keeps the worker processes for the loader's life (torch's
    default makes new ones each epoch) and draws from torch's RNG at each iter() what torch's
    default draws; True or False: as torch's (with True, later epochs draw no base seed).

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
                 *, prefetch_factor=None, persistent_workers=None, pin_memory_device="",
                 workers="auto", executor="auto", memory_budget="auto", on_error="raise",
                 max_errors=None, seed=None, device=None, pad=None, pad_value=0,
                 offload=None):
        self._owner_pid = os.getpid()  # __del__ in a forked copy leaves the loader alone
        multiprocessing_context = _arguments.check_arguments(
            num_workers, timeout, executor, on_error, pad, pad_value, collate_fn,
            multiprocessing_context, prefetch_factor)
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        # Left out (None): worker processes kept for the loader's life, and a base seed drawn
        # at every iter() as torch's default loader draws; True: as torch's persistent workers,
        # whose later epochs draw only the sampler's order (_next_base_seed).
        self.persistent_workers = True if persistent_workers is None else persistent_workers
        self._torch_persistent = persistent_workers is True and num_workers != 0
        self._last_base_seed = None
        self._is_iterable = isinstance(dataset, tud.IterableDataset)
        dataset, batch_size, drop_last, sampler, batch_sampler, generator = _arguments.sampling(
            dataset, self._is_iterable, batch_size, shuffle, sampler, batch_sampler, drop_last,
            generator, seed)
        self.dataset = dataset
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
        self._past_run = {}  # delivered batches and times of replaced engine runs
        self._delivered = 0  # samples of the batches handed to the loop (map-style data sets)
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
        self._foresight = None  # the next epoch's order, drawn ahead (_ahead)
        self._iter_thread = None  # the thread of the last iter(): only its draws redraw it
        self._ahead_ok = False  # iter() drew the order foreseen: its head start is kept
        self._resume = None
        self._epoch_state = None
        self._IterableDataset_len_called = None  # what len(loader) said, as torch keeps it
        self._offload = None
        if offload is not None:
            _offload.check(self)
            self._offload = _offload.LoaderOffload(offload, self)
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
        if resume is not None and resume.get("base_seed") is not None:
            base_seed, drawn = resume["base_seed"], False  # an epoch that drew none
        else:
            base_seed, drawn = self._next_base_seed()
        self._last_base_seed = base_seed
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
            # The head start the engine made of this order, if it was foreseen (_ahead).
            foreseen, self._foresight = self._foresight, None
            self._ahead_ok = (foreseen is not None and skip == 0 and resume is None
                              and foreseen.base_seed == base_seed and foreseen.batches == batches)
            if foreseen is not None and not self._ahead_ok and self._loader is not None:
                self._loader.set_epoch(self._loader.next_epoch + 1)  # drops what it started
            fp = _order_fingerprint(batches)
            if resume is not None and resume.get("order") not in (None, fp):
                raise ValueError("load_state_dict: the sampler gave another order than the saved "
                                 "run's (it is not reproducible from torch's RNG state); cannot "
                                 "resume mid-epoch")
            self._epoch_state = {"rng_state": bytes(rng_state.numpy().tobytes()),
                                 "generator_state": None if gen_state is None else
                                 bytes(gen_state.numpy().tobytes()),
                                 "order": fp, "batches": len(batches),
                                 "base_seed": None if drawn else base_seed}
            if self.num_workers == 0 or self._executor == "main":
                it = _SerialIter(self, batches, skip)
            else:
                it = self._engine_iter(batches, skip, base_seed)
        self._iterator = it
        self._iter_thread = threading.get_ident()
        if _ahead.FORESEEN:
            _ahead.moved(self)  # the orders other loaders foresaw on the RNG before these draws
        return it

    def _next_base_seed(self):
        """The next epoch's base seed for the workers, and whether it was drawn. torch's
        iter() draws one from torch's RNG (or the loader's generator), except with
        persistent_workers=True after the first epoch: its iterator is reset and draws only the
        sampler's order; the epoch's seed is then derived from the last one's (the workers'
        RNGs go on in torch's: each epoch's augmentations differ)."""
        if self._torch_persistent and self._last_base_seed is not None:
            return _successor(self._last_base_seed), False
        return int(torch.empty((), dtype=torch.int64).random_(generator=self.generator)
                   .item()), True

    def _engine_iter(self, batches, skip, base_seed):
        # As torch's iter(): the workers start (worker_init_fn runs in them) and begin on the
        # epoch's first batches; their errors reach the loop at the batch they belong to.
        if not batches[skip:]:
            return _EmptyIter()
        it = _EngineIter(self, batches, skip, base_seed)
        it._begin()
        return it

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

    def _retire(self, loader=None, transform=None):
        """Keeps the counts of an engine run or a transform that is being replaced (a new
        layout, a grown bound): stats() spans the loader's life."""
        if loader is not None:
            st = loader.stats()
            self._past_errors["error_count"] += st.get("error_count", 0)
            self._past_errors["errors"] += list(st.get("errors") or [])
            past = self._past_run
            for k in _ADDED_UP:
                past[k] = past.get(k, 0) + st.get(k, 0)
            for name, stage in (st.get("stages") or {}).items():
                mine = past.setdefault("stages", {}).setdefault(name, {})
                for k in ("busy_s", "wait_s", "items"):
                    mine[k] = mine.get(k, 0) + stage.get(k, 0)
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
        if self._past_run:  # engine runs replaced before this one (a learned layout, say)
            for k in _ADDED_UP:
                out[k] = out.get(k, 0) + self._past_run[k]
            stages = out.setdefault("stages", {})
            for name, past in self._past_run.get("stages", {}).items():
                stage = stages.setdefault(name, {"threads": 0})
                for k, v in past.items():
                    stage[k] = stage.get(k, 0) + v
        if self._delivered and "samples" in out:
            # The engine counts its positions: a whole batch each where the batches are made in
            # Python (the first ones, say); the samples are those of the batches handed out.
            out["samples"] = self._delivered
        if self._past_run or (self._delivered and "samples" in out):  # rates of the sums above
            elapsed = out["elapsed_s"]
            out["samples_per_s"] = out["samples"] / elapsed if elapsed > 0 else 0.0
            if self._past_run:
                out["consumer_wait_fraction"] = (out["consumer_wait_s"] / elapsed
                                                 if elapsed > 0 else 0.0)
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
        if self._offload is not None:
            out["offload"] = self._offload.stats()
        return out

    def __repr__(self):
        return (f"feedline.DataLoader({type(self.dataset).__name__}, batch_size="
                f"{self.batch_size}, executor={self._executor or self._executor_option})")

