"""feedline.DataLoader's worker processes (forked; see python/py_dataset.h for the wire format).

A worker serves requests from the loader's C++ threads: the dataset keys of one position, the
sample (or, in batch mode, the collated batch) back. Tensor data goes into the worker's
shared-memory staging area, never through pickle; only batch mode's user collate results and
error texts are serialized.

Every sample's RNGs (torch's, `random`'s, numpy's global ones) are seeded from (the epoch's base
seed, the sample's index in the epoch's order) just before `dataset[key]`: a random augmentation
draws the same numbers whichever worker makes the sample, with any number of workers, and after a
resume. A batch-mode reply is the pickle of (batch, learned): while the loader does not know the
batch layout yet (`learn`), the worker learns it from the samples of its first batch
(`_collate.infer`, then `resolve_pad`) and sends it as `learned`; op=3 then gives the worker the
loader's layout, and its samples go into the batch slots in place. The loader itself never calls
the dataset when it has workers.
"""

import json
import mmap
import os
import pickle
import random
import signal
import struct
import time
import traceback

from . import _collate, _payload

_HEADER = struct.Struct("<qqqq")  # a reply: status, inline, nbytes, cpu_ns
_REQUEST = struct.Struct("<qqqqq")  # op, position, n, seed, index (then n keys)
_M64 = (1 << 64) - 1


def error_text(exc, what, where):
    """The summary line for the engine, then what Python needs to re-raise the same type."""
    name = type(exc).__name__
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = (f"Caught {name} in {where} loading {what}.\nOriginal Traceback (most recent call "
               f"last):\n" + tb.split("\n", 1)[1] if "\n" in tb else tb)
    if "stack expects each tensor to be equal size" in str(exc):  # torch's default_collate
        message += ("feedline: DataLoader(pad=True) pads the leaves whose shape varies, with "
                    "their lengths beside them\n")
    summary = f"{what}: {name}: {exc}".replace("\n", " ")
    details = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": message}
    if not getattr(exc, "replaceable", True):  # the loop must see it, also with on_error="skip"
        details["replace"] = False
    if getattr(exc, "unpicklable", False):  # the batch was made; it cannot travel
        details["replace"] = False
        details["unpicklable"] = True
    return summary + "\n" + json.dumps(details)


def _read_exact(fd, n):
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def exit_with_parent(parent_pid, period_s=0.5):
    """The worker ends when the loader's process does (SIGKILL, or SIGTERM as schedulers send):
    a daemon thread checks the parent every `period_s` and ends this process at once when it is
    gone, whatever the worker is blocked in (a full queue's put, the dataset's own code). Not
    PR_SET_PDEATHSIG: that fires when the *thread* that forked exits, and iter(loader) may run
    on a thread that ends long before the loader does."""
    import threading

    if os.getppid() != parent_pid:
        os._exit(1)

    def watch():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="feedline-parent-watch", daemon=True).start()


def lower_priority(nice):
    """This process `nice` levels below the loading one, as the engine's map workers are (the
    parent resolves it: _feedline.worker_nice()): the training thread gets a core first, the
    worker takes what it leaves. A process may only lower its own priority: never raised."""
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
        except OSError:
            pass


def set_worker_info(worker_id, num_workers, seed, dataset):
    from torch.utils.data._utils import worker as tw
    tw._worker_info = tw.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                    dataset=dataset)


def seed_worker(base_seed, worker_id):
    """As torch's workers: random, torch and numpy seeded from the loader's base seed."""
    import torch
    seed = base_seed + worker_id
    random.seed(seed)
    # Not torch.manual_seed: in a forked child CUDA cannot start, and its lazy seeding only
    # records the caller's whole stack (traceback.format_stack), as seed_sample avoids too.
    torch.default_generator.manual_seed(seed)
    try:
        import numpy as np
        from torch.utils.data._utils.worker import _generate_state
        np.random.seed(_generate_state(base_seed, worker_id))
    except ImportError:
        pass
    return seed


def sample_seed(seed, index):
    """A 64-bit seed for the sample at `index` of an epoch whose base seed is `seed`
    (SplitMix64's finalizer over both: neighbouring indices get unrelated seeds)."""
    z = (seed + 0x9E3779B97F4A7C15 * (index + 1)) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


# The global RNGs seeded per sample: all three, less those that worker_init_fn seeded itself
# (its seeding stands, as in torch: a dataset that reads torch.initial_seed() sees it).
_PER_SAMPLE = {"torch", "random", "numpy"}


def seed_sample(seed, index):
    """Seeds torch's, random's and (when loaded) numpy's global RNGs for one sample."""
    import sys
    import torch
    s = sample_seed(seed, index)
    if "torch" in _PER_SAMPLE:
        # 63 bits, as torch's worker seeds (base_seed + worker id, base_seed drawn as a
        # non-negative int64): torch.initial_seed() stays a value default_collate can take.
        # Not torch.manual_seed: no CUDA when forked.
        torch.default_generator.manual_seed(s & 0x7FFFFFFFFFFFFFFF)
    if "random" in _PER_SAMPLE:
        random.seed(s)
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in _PER_SAMPLE:
        np.random.seed([s & 0xFFFFFFFF, s >> 32])


def _rng_states():
    import sys
    import torch
    np = sys.modules.get("numpy")
    return {"torch": torch.initial_seed(), "random": random.getstate(),
            "numpy": pickle.dumps(np.random.get_state()) if np is not None else None}


def run_worker_init_fn(worker_init_fn, worker_id):
    """worker_init_fn(worker_id); the RNGs it seeded are not seeded per sample afterwards."""
    before = _rng_states()
    try:
        worker_init_fn(worker_id)
    finally:
        after = _rng_states()
        for name in before:
            if before[name] is not None and before[name] != after[name]:
                _PER_SAMPLE.discard(name)


def layout(samples, pad):
    """The batch layout learned from a batch's samples: ("layout", a `_collate.Schema` or None
    when the samples have no layout the slots can hold)."""
    schema = _collate.infer(samples[0])
    if schema is not None and pad is not None:
        pad_arg, pad_value, bounds = pad
        schema = _collate.resolve_pad(samples, schema, pad_arg, pad_value, bounds)
    return ("layout", schema)


def _libc_function(name):
    """glibc's `name` (mallopt, malloc_trim), or None where it is not found: the heap is then
    left to its defaults."""
    import ctypes
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def _keep_heap():
    """Samples allocate and free arrays of the same large sizes over and over (a decoded image,
    its float copy). glibc serves an allocation past its mmap threshold (128 KiB at first) with
    a fresh mapping, whose pages fault in zeroed each time: numpy samples of 600 KB cost 2.4 ms
    of CPU where 1.0 ms is the work. The threshold only rises after such a block is freed, so a
    worker's speed depended on what it happened to allocate first. Fixed at 32 MiB (the most
    glibc's own adjustment reaches), with freed memory kept up to 64 MiB."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD


def _trim_heap():
    """The heap's free memory back to the kernel: after the batch a layout is learned from, the
    freed samples of a whole batch (38 MB of images), which _keep_heap's threshold would keep
    for the worker's life while it makes one sample at a time."""
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)


def make_batch(dataset, keys, collate_fn, auto_collation, before_sample=None):
    """The batch of `keys` as torch's workers make it: each dataset[k] (`before_sample(j)`
    first: a worker process seeds the sample's RNGs there), then collate_fn(samples) with auto
    collation, else collate_fn(the one sample) (batch_size=None). Worker threads and worker
    processes both make their whole batches here. Returns (batch, samples, None), or (None,
    None, (exception, what failed: the sample, or the batch when collation failed))."""
    samples = []
    for j, k in enumerate(keys):
        if before_sample is not None:
            before_sample(j)
        try:
            samples.append(dataset[k])
        except Exception as e:  # noqa: BLE001 (the sample's error, re-raised in the loop)
            return None, None, (e, f"dataset[{k}]")
    try:
        out = collate_fn(samples) if auto_collation else collate_fn(samples[0])
    except Exception as e:  # noqa: BLE001
        return None, None, (e, f"the batch of dataset{list(keys)}" if len(keys) > 1
                            else f"dataset[{keys[0]}]")
    return out, samples, None


# A reply this large (a whole batch: batch mode, or the batches a layout is learned from) gives
# the staging area's pages back once it is copied: the area is sized for it while samples go
# into the batch slots in place, and kept pages count in the process tree's memory twice.
_LARGE_REPLY = 4 << 20


def _release(staging, nbytes):
    """The pages of the staging area's first `nbytes` back to the kernel (both mappings)."""
    try:
        staging.madvise(mmap.MADV_REMOVE, 0, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    except (AttributeError, OSError, ValueError):  # only memory then
        pass


def _placed(data, area):
    """`data` written at the start of `area` (None), or `data` itself when larger (for the
    pipe)."""
    if len(data) > len(area):
        return data
    area[:len(data)] = data
    return None


def _sample_into(dataset, schema, key, epoch_seed, index, where, area):
    """Makes dataset[key] (its RNGs seeded for `index` of the epoch) into `area`, a writable
    part of the staging area: (status, size, the payload when it is larger than `area`, for the
    pipe, else None)."""
    try:
        seed_sample(epoch_seed, index)
        leaves = _collate.flatten(dataset[key], schema)
        parts, size = [], 0
        for f, a in zip(schema.fields, leaves):
            parts.append(struct.pack(f"<{len(f.shape)}q", *a.shape))
            parts.append(a)
            size += 8 * len(f.shape) + (a.nbytes + 7) // 8 * 8
        if schema.objects:
            a = leaves[-1]
            parts.append(struct.pack("<q", a.size))
            parts.append(a)
            size += 8 + (a.nbytes + 7) // 8 * 8
    except Exception as e:  # noqa: BLE001 (the sample's error, re-raised in the loop)
        payload = error_text(e, f"dataset[{key}]", where).encode()
        return 1, len(payload), _placed(payload, area)
    buf = bytearray(size) if size > len(area) else area
    off = 0
    for p in parts:  # shapes (bytes, 8-aligned) and arrays (padded to 8)
        b = memoryview(p) if isinstance(p, bytes) else p.reshape(-1).view("u1").data
        buf[off:off + b.nbytes] = b
        off += (b.nbytes + 7) // 8 * 8
    return 0, size, (None if buf is area else buf)


_ENTRY = struct.Struct("<qqq")  # a chunk's sample: status, offset, size


def _chunk_into(dataset, schema, keys, epoch_seed, index, where, view):
    """The samples of `keys` (positions that follow each other in one batch), each into the
    staging area after the chunk's table ([count, (status, offset, size) x count]): (2, the
    bytes used, None). Samples that no longer fit end the chunk early (the loader asks for the
    rest again); if the first does not fit, its own reply (status 0 or 1, through the pipe)."""
    off = 8 + _ENTRY.size * len(keys)
    entries = []
    for j, key in enumerate(keys):
        status, size, payload = _sample_into(dataset, schema, key, epoch_seed, index + j, where,
                                             view[off:])
        if payload is not None:
            if not entries:
                return status, size, payload
            break
        entries.append((status, off, size))
        off += (size + 7) // 8 * 8
    struct.pack_into("<q", view, 0, len(entries))
    for j, e in enumerate(entries):
        _ENTRY.pack_into(view, 8 + _ENTRY.size * j, *e)
    return 2, off, None


def main(dataset, schema, batch_mode, collate_fn, request_fd, reply_fd, staging_fd,
         staging_bytes, worker_id, num_workers, base_seed, worker_init_fn, close_fds,
         parent_pid=None, pad=None, learn=False, auto_collation=True, nice=0):
    """The worker's loop: until the loader asks it to stop or goes away. `pad` is (pad,
    pad_value, bounds grown so far); `learn`: learn the layout from the first batch made;
    `nice`: the levels below the parent this process runs at."""
    if parent_pid is not None:  # also when a sample's code never returns
        exit_with_parent(parent_pid)
    lower_priority(nice)
    import torch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training loop's
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    torch.set_num_threads(1)
    _keep_heap()
    seed = seed_worker(base_seed, worker_id)
    set_worker_info(worker_id, num_workers, seed, dataset)
    where = f"feedline worker process {worker_id} (pid {os.getpid()})"
    init_error = None
    if worker_init_fn is not None:
        try:
            run_worker_init_fn(worker_init_fn, worker_id)
        except Exception as e:  # noqa: BLE001 (reported with every request)
            init_error = e
    staging = mmap.mmap(staging_fd, staging_bytes)
    os.close(staging_fd)
    view = memoryview(staging)
    large = 0  # bytes of the staging area the last reply used, when that was a large one
    while True:
        head = _read_exact(request_fd, _REQUEST.size)
        if head is None:
            break
        if large:  # copied by the loader (it asks again only then): its pages go back at once
            _release(staging, large)
            large = 0
        op, position, n, epoch_seed, index = _REQUEST.unpack(head)
        if op == 0:
            break
        raw = _read_exact(request_fd, 8 * n)
        if raw is None:
            break
        if op == 3:  # a new batch layout (AdoptProcesses): `position` bytes of pickle
            try:
                schema, batch_mode, learn, pad = pickle.loads(raw[:position])
                status = 0
            except Exception:  # noqa: BLE001 (the loader replaces this process)
                status = 1
            _write_all(reply_fd, _HEADER.pack(status, 0, 0, 0))
            continue
        cpu0 = time.process_time_ns()  # the request's CPU, this process's threads included
        keys = struct.unpack(f"<{n}q", raw)
        what = (f"dataset[{keys[0]}]" if n == 1 or not batch_mode
                else f"the batch of dataset{list(keys)}")
        try:
            if init_error is not None:
                raise init_error
            if batch_mode:
                out, samples, failed = make_batch(
                    dataset, keys, collate_fn, auto_collation,
                    lambda j: seed_sample(epoch_seed, index + j))
                if failed is not None:
                    what = failed[1]
                    raise failed[0]
                learned = None
                if learn:
                    learn = False
                    try:
                        learned = layout(samples, pad)
                    except ValueError as e:  # pad= names no field of the samples
                        learned = ("error", str(e))
                    except Exception:  # noqa: BLE001 (another batch teaches it)
                        learned = None
                samples = None  # (the batch holds what it needs)
                if learned is not None:  # samples go in place from now on: their heap goes
                    _trim_heap()
                try:
                    size, payload = _payload.dump((out, learned), view)
                except Exception as e:  # noqa: BLE001 (a type pickle cannot find by its name)
                    e.unpicklable = True
                    raise
                # Not kept until the next whole batch (after a layout is learned, never): the
                # batch's tensors are in shared memory (torch's collate, in a worker).
                out = None
                if payload is None and size >= _LARGE_REPLY:
                    large = size
                status = 0
            elif n == 1:
                status, size, payload = _sample_into(dataset, schema, keys[0], epoch_seed, index,
                                                     where, view)
            else:  # a chunk of small samples: one exchange for several
                status, size, payload = _chunk_into(dataset, schema, keys, epoch_seed, index,
                                                    where, view)
        except Exception as e:  # noqa: BLE001 (the batch's error, re-raised in the loop)
            text = error_text(e, what, where).encode()
            status, size, payload = 1, len(text), _placed(text, view)
            if payload is None and size >= _LARGE_REPLY:
                large = size
        reply = _HEADER.pack(status, int(payload is not None), size,
                             time.process_time_ns() - cpu0)
        _write_all(reply_fd, reply if payload is None else reply + bytes(payload))
    view.release()
    staging.close()
