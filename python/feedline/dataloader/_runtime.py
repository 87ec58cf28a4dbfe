"""What feedline.DataLoader keeps per process: the live loaders closed at exit, get_worker_info()
answered per worker thread, and helpers its executors share (errors re-raised from worker text,
the CUDA check, a worker's copy of the dataset)."""

import atexit
import copy
import json
import os
import threading
import weakref

import torch
import torch.utils.data as tud

from .. import _feedline
from .._feedline import DataError, DeviceError

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


def _check_cuda(device):
    """DeviceError when `device` ("cuda:N") is not a GPU the CUDA runtime sees."""
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

