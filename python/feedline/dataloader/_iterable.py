"""IterableDatasets in feedline.DataLoader: one replica per worker (threads or processes),
batches taken round robin, as torch's DataLoader takes them."""

import copy
import itertools
import os
import threading
import time
import warnings

import torch
import torch.utils.data as tud

from .. import _feedline, _worker
from ._iterators import _BaseIter
from ._runtime import _raise_from_text, _raise_if_out_of_fds, _tls, _worker_copy


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
            nice = _feedline.worker_nice()
            self._workers = [ctx.Process(target=_iterable_worker, daemon=True,
                                         args=(o.dataset, o.batch_size, o.drop_last,
                                               o.collate_fn, self._queues[i], self._stop, i, n,
                                               base_seed, o.worker_init_fn, os.getpid(),
                                               shared_seed, nice))
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
                     init_fn, parent_pid, shared_seed=None, nice=0):
    import signal
    _worker.exit_with_parent(parent_pid)
    _worker.lower_priority(nice)  # as the map-style workers: the training thread first
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
