"""How feedline.DataLoader runs a map-style dataset on the engine: the executor chosen (worker
processes, or engine threads under the GIL), the transform and its worker processes, the batch
layout learned for in-place collation, and the engine run over an epoch's batches."""

import itertools
import os
import pickle

import torch
import torch.utils.data as tud

from .. import _collate, _feedline, _worker
from . import _ahead
from .._util import _parse_bytes, _parse_count, _resolve_cuda
from ._runtime import _check_cuda, _cpus, _signed64, _tls, _weak, _worker_copy


# Samples in place go to a worker process in chunks of up to this many bytes (and 64 samples):
# a sample of a few KiB (a tokenized line, parsed fields) costs about what its hand-off does (a
# pipe round trip between the engine's thread and the process), so small ones go together, one
# exchange for many. Larger samples go one by one, as they are made.
_CHUNK_BYTES = 256 << 10


def _sample_bytes(schema):
    """The most bytes a sample of the layout takes in a reply (shapes and fields)."""
    return sum(8 * len(f.shape) + 8 + f.slot_elements() *
               torch.empty((), dtype=f.dtype).element_size() for f in schema.fields)


def _chunk(schema):
    """Positions per request to a worker process (1 when samples are made whole)."""
    if schema is None:
        return 1
    return max(1, min(64, _CHUNK_BYTES // max(1, _sample_bytes(schema))))


def _regular(batches):
    """Batches of one size but the last, which is not larger (collated in place)."""
    sizes = {len(b) for b in batches[:-1]}
    return bool(batches) and len(sizes) <= 1 and (not sizes or len(batches[-1]) <= min(sizes))


class _Executor:
    """DataLoader's engine side (a mixin: the loader's own attributes)."""

    def _start_engine(self, batches, skip, base_seed, run=True):
        """Starts the engine over batches[skip:]: (engine epoch, schema or None, engine batch,
        learning, the engine batch it starts at) or None when there is nothing to load.
        `learning`: the layout is not known yet, and the engine makes only as many whole
        batches as there are worker processes (each learns the layout from its batch); the
        caller starts it again after them, in place. No batch is made twice, and every worker
        is busy at once, as torch's are. Otherwise the engine run has the whole epoch's
        positions and starts at batch `skip` (the rest of a learning epoch, a resumed epoch, a
        restart with grown pad bounds): every epoch is then a run of the same engine loader,
        so each one's end can start the next one ahead (_foresee). With `run` False, the
        loader is made ready (its keys set) and the run is left to the caller (the engine epoch
        None), unless it is a learning run."""
        left = batches[skip:]
        if not left:
            return None
        flat = [k for b in left for k in b]
        if self._executor is None:
            self._executor, self._executor_reason = self._choose_executor(flat)
        if self._executor == "process" and not all(isinstance(k, int) for k in flat):
            raise TypeError("executor='process' needs int sample keys; use executor='thread'")
        if self._offload is not None and self._executor != "process":
            raise TypeError(f"offload: the batches are made by worker processes here and on "
                            f"the cluster, which need int sample keys ({self._executor_reason})")
        if not self._procs_started():
            self._spawn_seed = base_seed
        if self._device is not None and self._device.type == "cuda":
            _check_cuda(self._engine_device())  # a clear DeviceError now, in any mode
        # In place needs the layout, which worker processes learn from their first batch.
        self._wants_layout = self._in_place(batches)
        self._pad_config = ((self._pad, self._pad_value, dict(self._pad_bounds))
                            if self._pad else None)
        learning = self._learning()
        if learning:  # the first batches from `skip`, a run of their own
            left = left[:self._process_count()]
            first_batch, start = skip, 0
            first_index = sum(len(b) for b in batches[:skip])  # the order's index of left[0][0]
        else:  # the whole epoch, started at batch `skip`
            left, first_batch, start, first_index = batches, 0, skip, 0
        schema, flat, offsets, engine_batch, chunk = self._plan(left)
        batch_mode = schema is None
        self._ensure_transform(schema, batch_mode)
        self._keys = flat if not batch_mode else left
        self._key_offsets = offsets
        ahead_ok, self._ahead_ok = self._ahead_ok, False
        if self._executor == "process":
            # Batch k of the epoch goes to worker process k mod n, as torch's batches go. The
            # keys set ahead are this order's when iter() drew the order foreseen.
            if not (ahead_ok and not learning and self._transform.adopt_ahead()):
                self._transform.set_keys(flat, offsets, _signed64(base_seed), first_index,
                                         first_batch=first_batch, positions_per_batch=engine_batch,
                                         chunk=chunk)
        else:
            self._transform.set_keys([], [0])
        key = (len(offsets) - 1, engine_batch, learning)
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
                self._transform, positions=key[0], fingerprint=key[0],
                batch_size=engine_batch, drop_last=False, workers=workers,
                prefetch=prefetch, epoch_head_start=self._offload is None,
                memory_budget=_parse_bytes("memory_budget", self._memory_budget),
                on_error=self._on_error,
                max_errors=_parse_count("max_errors", self._max_errors),
                device=(self._engine_device() if schema is not None else None) or "cpu")
            self._loader_key = key
        self._results.clear()
        if not run and not learning:
            return None, schema, engine_batch, learning, start
        if start:  # the engine's next epoch, from batch `start` (a head start of it is dropped)
            state = dict(self._loader.state(), epoch=self._loader.next_epoch, batches_done=start,
                         skipped=0)
            self._loader.load_state(state, False)
        return self._loader.start_epoch(), schema, engine_batch, learning, start

    def _foresee(self, done):
        """The next epoch's order drawn ahead, once `done` batches of this one are taken (see
        _ahead): its keys go to the transform, for the engine's head start."""
        loader = self._loader
        if loader is None or len(loader) - done > _ahead.WINDOW or not _ahead.eligible(self):
            return
        if self._learning():
            return
        current = _ahead.states(self)
        seen = self._foresight
        if seen is not None and (seen.tries > _ahead.TRIES or
                                 _ahead.same_states(seen.states, current)):
            return
        f = _ahead.foresee(self, current)
        if seen is not None:
            f.tries = seen.tries + 1
        self._set_ahead(f)

    def _set_ahead(self, f):
        """The order foreseen `f` to the transform, as the keys of the engine's next epoch:
        True when they are set (the engine starts that epoch with them)."""
        loader = self._loader
        if self._offload is not None:  # the cluster's leases of its first batches, not the engine
            self._foresight = f
            _ahead.FORESEEN.add(self)
            return self._offload.foresee(loader.next_epoch, f.batches, _signed64(f.base_seed))
        schema, flat, offsets, per_batch, chunk = self._plan(f.batches)
        # The same engine run (its positions, batch) and mode as _start_engine will give it.
        same = ((len(offsets) - 1, per_batch, False) == self._loader_key and
                (schema is None) == self._batch_mode)
        if not same or not all(isinstance(k, int) for k in flat):
            self._foresight = f  # (iter() compares and finds it is not this run's)
            f.tries, f.usable = _ahead.TRIES + 1, False
            return False
        if self._transform.set_keys_ahead(loader.next_epoch, flat, offsets,
                                          _signed64(f.base_seed), per_batch, chunk):
            self._foresight = f
            _ahead.FORESEEN.add(self)
            return True
        return False  # the engine has started the order foreseen before: kept (iter() compares)

    def _foresee_again(self):
        """torch's RNG moved since this loader's next order was foreseen (training steps drew
        from it; or, between this loader's epochs, another loader's iter() did: a training and
        a validation loader alternate): at the epoch's end the order is drawn again, and the
        head start made with the old one is replaced by one made with the new one (else iter()
        would find it is not its order, and drop it)."""
        seen, loader, it = self._foresight, self._loader, self._iterator
        if (seen is None or not seen.usable or loader is None or
                not getattr(it, "_finished", False)):
            return  # nothing foreseen, or an epoch runs (its next batches foresee again)
        current = _ahead.states(self)
        if _ahead.same_states(seen.states, current) or not _ahead.eligible(self):
            return
        f = _ahead.foresee(self, current)
        if f.base_seed == seen.base_seed and f.batches == seen.batches:
            seen.states = current
            return
        loader.drop_ahead()
        self._transform.forget_ahead()
        if self._offload is not None:
            self._offload.drop_ahead(unless_epoch=-1)
        self._foresight = None
        if self._set_ahead(f):
            loader.start_ahead(loader.next_epoch)

    def _in_place(self, batches):
        """Whether an epoch of `batches` has its samples written in place (once the layout is
        known): worker processes, torch's default collation, batches of one size (the last
        not larger). Else its batches are made whole."""
        return (self._auto_collation and _regular(batches) and
                self.collate_fn is tud.default_collate and self._executor == "process")

    def _plan(self, batches):
        """How the engine runs `batches`: (schema or None, their keys, each position's offset
        into them, positions per batch, positions per request to a worker process). In place,
        a position is a sample; else a whole batch."""
        schema = self._layout() if self._in_place(batches) else None
        flat = [k for b in batches for k in b]
        if schema is None:
            return None, flat, list(itertools.accumulate([0] + [len(b) for b in batches])), 1, 1
        return schema, flat, list(range(len(flat) + 1)), max(len(batches[0]), 1), _chunk(schema)

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
                              self._pad_config, self._learning(), self._auto_collation,
                              _feedline.worker_nice()))
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
        return max(16 << 20, 2 * _sample_bytes(self._schema) + _collate.OBJECT_BYTES + 4096)

    def _stop_processes(self):
        if self._transform is not None:
            self._transform.stop_processes()
        for p in self._procs.values():
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        self._procs.clear()

