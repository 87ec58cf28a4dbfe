"""feedline.DataLoader's worker processes (forked; see python/py_dataset.h for the wire format).

A worker serves requests from the loader's C++ threads: the dataset keys of one position, the
sample (or, in batch mode, the collated batch) back. Tensor data goes into the worker's
shared-memory staging area, never through pickle; only batch mode's user collate results and
error texts are serialized.
"""

import json
import mmap
import os
import pickle
import random
import signal
import struct
import traceback

_HEADER = struct.Struct("<qqq")


def error_text(exc, what, where):
    """The summary line for the engine, then what Python needs to re-raise the same type."""
    name = type(exc).__name__
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = (f"Caught {name} in {where} loading {what}.\nOriginal Traceback (most recent call "
               f"last):\n" + tb.split("\n", 1)[1] if "\n" in tb else tb)
    summary = f"{what}: {name}: {exc}".replace("\n", " ")
    details = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": message}
    if not getattr(exc, "replaceable", True):  # the loop must see it, also with on_error="skip"
        details["replace"] = False
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
    import time

    if os.getppid() != parent_pid:
        os._exit(1)

    def watch():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="feedline-parent-watch", daemon=True).start()


def set_worker_info(worker_id, num_workers, seed, dataset):
    from torch.utils.data._utils import worker as tw
    tw._worker_info = tw.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                    dataset=dataset)


def seed_worker(base_seed, worker_id):
    """As torch's workers: random, torch and numpy seeded from the loader's base seed."""
    import torch
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        from torch.utils.data._utils.worker import _generate_state
        np.random.seed(_generate_state(base_seed, worker_id))
    except ImportError:
        pass
    return seed


def main(dataset, schema, batch_mode, collate_fn, request_fd, reply_fd, staging_fd,
         staging_bytes, worker_id, num_workers, base_seed, worker_init_fn, close_fds,
         parent_pid=None):
    """The worker's loop: until the loader asks it to stop or goes away."""
    if parent_pid is not None:  # also when a sample's code never returns
        exit_with_parent(parent_pid)
    import torch
    from . import _collate
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training loop's
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    torch.set_num_threads(1)
    seed = seed_worker(base_seed, worker_id)
    set_worker_info(worker_id, num_workers, seed, dataset)
    where = f"feedline worker process {worker_id} (pid {os.getpid()})"
    init_error = None
    if worker_init_fn is not None:
        try:
            worker_init_fn(worker_id)
        except Exception as e:  # noqa: BLE001 (reported with every request)
            init_error = e
    staging = mmap.mmap(staging_fd, staging_bytes)
    os.close(staging_fd)
    view = memoryview(staging)
    while True:
        head = _read_exact(request_fd, _HEADER.size)
        if head is None:
            break
        op, position, n = _HEADER.unpack(head)
        if op == 0:
            break
        raw = _read_exact(request_fd, 8 * n)
        if raw is None:
            break
        keys = struct.unpack(f"<{n}q", raw)
        what = f"dataset[{keys[0]}]" if n == 1 else f"the batch of dataset{list(keys)}"
        try:
            if init_error is not None:
                raise init_error
            if batch_mode:
                if collate_fn is None:  # batch_size=None: one sample, converted
                    out = torch.utils.data.default_convert(dataset[keys[0]])
                else:
                    out = collate_fn([dataset[k] for k in keys])
                payload = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
                parts = None
            else:
                leaves = _collate.flatten(dataset[keys[0]], schema)
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
                payload = None
            status = 0
        except Exception as e:  # noqa: BLE001 (the sample's error, re-raised in the loop)
            payload = error_text(e, what, where).encode()
            parts = None
            status = 1
        if parts is not None:  # the sample's fields: into the staging area (or inline)
            inline = size > staging_bytes
            buf = bytearray(size) if inline else view
            off = 0
            for p in parts:  # shapes (bytes, 8-aligned) and arrays (padded to 8)
                b = memoryview(p) if isinstance(p, bytes) else p.reshape(-1).view("u1").data
                buf[off:off + b.nbytes] = b
                off += (b.nbytes + 7) // 8 * 8
            reply = _HEADER.pack(0, int(inline), size)
            _write_all(reply_fd, reply + bytes(buf) if inline else reply)
        else:
            inline = len(payload) > staging_bytes
            if not inline:
                view[:len(payload)] = payload
            reply = _HEADER.pack(status, int(inline), len(payload))
            _write_all(reply_fd, reply + payload if inline else reply)
    view.release()
    staging.close()
