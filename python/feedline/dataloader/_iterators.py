"""The iterators of a map-style feedline.DataLoader epoch: in the calling thread (num_workers=0),
or from the engine (batches made whole in Python, or collated in place into the engine's slots)."""

import json
import pickle

import torch

from .. import _collate, _payload
from .._feedline import DataError
from . import _offload
from ._runtime import _raise_from_text, _signed64, _to_device, _weak


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
        order = getattr(self, "_order", None)  # the epoch's batches of keys, when known
        if order is not None and self._batches_done < len(order):
            keys = order[self._batches_done]
            self._owner._delivered += len(keys) if isinstance(keys, (list, tuple)) else 1
        self._batches_done += 1
        dev = self._owner._device
        if dev is not None and not on_device:
            batch = _to_device(batch, dev)
        return batch



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
        self._order = batches
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
        self._order = batches
        self._position_batch = 0  # the engine's batches handed out (errors included)
        self._on_device = False
        self._serial = None  # the rest of the epoch's batches, when the calling thread loads
        self._learning_run = False  # this engine run makes the first batches, to learn the layout
        self._offloading = None  # the epoch's batches with the cluster (offload=): an Epoch

    def _begin(self):
        """Starts (or, after a grown bound, restarts) the engine at the next batch to give."""
        self._started = True
        o = self._owner
        offload = o._offload is not None and o._offload.active
        got = o._start_engine(self._batches, self._batches_done, self._base_seed, run=not offload)
        if got is None:
            self._finished = True
            return
        self._epoch, self._schema, self._engine_batch, self._learning_run, start = got
        self._position_batch = start
        if self._epoch is None:  # made with the cluster: the engine's run claims its share
            # (The epoch refers to this iterator weakly: a cycle would leave it to the garbage
            # collector, which could run its __del__ anywhere, a forked worker included.)
            self._offloading = _offload.start(self, self._engine_batch,
                                              _signed64(self._base_seed),
                                              _weak(self._local_batch))
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
        offloading, self._offloading = self._offloading, None
        if offloading is not None:
            offloading.close()

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
        if self._offloading is not None:
            return self._next_offloaded()
        if self._epoch is None:
            self._finished = True
            raise StopIteration
        o = self._owner
        if not self._learning_run:
            o._foresee(self._batches_done)
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
            # The training steps may have drawn from torch's RNG since the next order was
            # foreseen (at every step, as a CPU augmentation in the loop does): drawn again now,
            # after the last step, and the head start made with it.
            o._foresee_again()
            raise
        except DataError:
            texts = self._errors_of(self._position_batch)
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
        return self._out(self._local_batch({k: torch.from_dlpack(v) for k, v in fields.items()}),
                         on_device=self._on_device)

    def _errors_of(self, k):
        """The error texts of engine batch k's positions (empty where none failed)."""
        take = self._owner._transform.take_error
        return [take(pos) for pos in range(k * self._engine_batch, (k + 1) * self._engine_batch)]

    def _next_offloaded(self):
        """The next batch of an epoch made with the cluster: its errors raised as the engine's
        are (a grown pad bound restarts it at the batch)."""
        o = self._owner
        o._foresee(self._batches_done)  # (the cluster's leases of the next epoch's first)
        try:
            batch = next(self._offloading)
        except StopIteration:
            self._close()
            self._finished = True
            o._foresee_again()
            raise
        except DataError as e:
            k = self._offloading._next - 1
            texts = [t for t in self._errors_of(k) if t] or [str(e)]
            for text in texts:
                details = text.partition("\n")[2]
                if "_collate.PadOverflow" in details:
                    overflow = _collate.overflow_of(json.loads(details).get("message", ""))
                    if overflow is not None:
                        self._grow_and_restart(overflow)
                        return self.__next__()
            self._batches_done += 1
            _raise_from_text(texts[0])
        return self._out(batch)  # (a local batch already on the device stays there)

    def _local_batch(self, fields, indices=None):
        """The batch of an engine run's fields (tensors by name), as the loop gets it."""
        o = self._owner
        if self._schema is None:  # batch mode: the batch was made in Python
            pos = int(fields["batch"][0])
            if o._executor == "process":
                out, learned = _payload.load(o._transform.take_result(pos))
                o._learn(learned)
                return out
            made = o._results[pos]
            out = made.pop()
            if not made:
                del o._results[pos]
            return out
        columns = []
        for f in self._schema.fields:
            columns.append(_collate.as_field_dtype(fields[f"f{f.index}"], f))
        lengths = {f.index: fields[f"f{f.index}_lengths"]
                   for f in self._schema.fields if f.variable}
        objects = None
        if self._schema.objects:
            values = fields[_collate.OBJECTS_FIELD].cpu().numpy()
            offs = fields[_collate.OBJECTS_FIELD + "_offsets"].tolist()
            objects = [pickle.loads(values[offs[i]:offs[i + 1]].tobytes())
                       for i in range(len(offs) - 1)]
        return _collate.rebuild(self._schema, columns, objects, lengths)
