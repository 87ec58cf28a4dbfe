"""Argument checks and conversions shared by the loaders' Python faces."""

import inspect
import os
import re
import sys

from . import _feedline


def _shown(x):
    """A path or URL (or a list of them) as messages show it: no credentials, no query."""
    if isinstance(x, (list, tuple)):
        return type(x)(_shown(v) for v in x)
    return _feedline.shown_name(x) if isinstance(x, str) else x


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}


def _parse_bytes(name, value):
    """'auto' -> 0; ints; strings such as '2GiB', '512MB', '1.5 GiB'."""
    if isinstance(value, str):
        if value == "auto":
            return 0
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name}: expected 'auto', a byte count or a size such as '2GiB', "
                             f"got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    elif isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected 'auto', an int or a size string, "
                        f"got {type(value).__name__}")
    else:
        n = value
    if n <= 0:
        raise ValueError(f"{name}: must be positive, got {value!r}")
    return n


def _parse_count(name, value):
    """'auto' -> 0; positive ints."""
    if value == "auto" or value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected 'auto' or an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: must be >= 1 or 'auto', got {value}")
    return value


def _is_url(path):
    """Remote sources (src/io/http.h) are not checked on the local file system."""
    return path.startswith(("http://", "https://", "s3://"))


def _check_type(name, value, types, what):
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise TypeError(f"{name}: expected {what}, got bool")
    if not isinstance(value, types):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    return value


def _pair(name, value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name}: expected a pair of numbers, got {value!r}")
    for v in value:
        _check_type(name, v, (int, float), "a pair of numbers")
    return float(value[0]), float(value[1])


def _timeout(value):
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"read_timeout: expected seconds (a number) or None, "
                        f"got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"read_timeout: must be > 0 seconds or None, got {value}")
    return float(value)


def _triple(name, value):
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{name}: expected three numbers (R, G, B), got {value!r}")
    for v in value:
        _check_type(name, v, (int, float), "three numbers")
    return tuple(float(v) for v in value)


def _resolve_cuda(device):
    """ "cuda" means torch's current device, as in torch (torchrun + torch.cuda.set_device(
    local_rank) gives each rank its own GPU); without torch's CUDA, the CUDA runtime's."""
    if device != "cuda":
        return device
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
    except Exception:  # noqa: BLE001 (a broken torch CUDA: let feedline's own check report it)
        pass
    return device


def _world():
    """(rank, world_size): torch.distributed if initialized, else RANK/WORLD_SIZE, else 0/1."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world


def _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers, prefetch,
                 memory_budget, on_error, max_errors):
    """The engine's own options, checked and converted for the C++ loader factories (the
    generic loaders': TokenLoader, TextLoader)."""
    _check_type("batch_size", batch_size, int, "an int")
    _check_type("shuffle", shuffle, bool, "a bool")
    _check_type("seed", seed, int, "an int")
    if seed < 0:
        raise ValueError(f"seed: must be >= 0, got {seed}")
    _check_type("drop_last", drop_last, bool, "a bool")
    _check_type("on_error", on_error, str, "'raise' or 'skip'")
    if rank is None or world_size is None:
        r, w = _world()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    _check_type("rank", rank, int, "an int")
    _check_type("world_size", world_size, int, "an int")
    return dict(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                rank=rank, world_size=world_size, workers=_parse_count("workers", workers),
                prefetch=_parse_count("prefetch", prefetch),
                memory_budget=_parse_bytes("memory_budget", memory_budget), on_error=on_error,
                max_errors=_parse_count("max_errors", max_errors))


def _default_seed():
    """torch's RNG decides, as for torch's DataLoader (rank 0's seed on every rank)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    seed = torch.initial_seed() % (2**63)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            box = [seed]
            dist.broadcast_object_list(box, src=0)
            seed = int(box[0])
    except Exception:  # noqa: BLE001 (no collective possible: each rank's own seed)
        pass
    return seed


# Where the Python faces spell a declared option otherwise (torchvision's std; seconds, as
# Python's timeouts; a list of shards is a source).
_PYTHON_NAME = {"stddev": "std", "read_timeout_ms": "read_timeout", "shards": None}


def _options_doc(face, groups=("engine",)):
    """The section of a face's docstring that comes from the C++ declarations
    (include/feedline/options.h): each declared option of `groups` the face takes, its default
    here and its doc line."""
    params = inspect.signature(face).parameters
    lines = []
    for name, group, _, doc in _feedline.option_declarations():
        py = _PYTHON_NAME.get(name, name)
        if group not in groups:
            continue
        if py is None or py not in params or params[py].default is inspect.Parameter.empty:
            continue
        lines.append(f"      {py}={params[py].default!r}: {doc}.")
    if not lines:
        return ""
    return ("\n    Options, as declared once for every face (defaults as this face shows them):\n"
            + "\n".join(lines) + "\n")


class _LoaderFace:
    """What every loader face does the same way over its C++ loader (self._loader): epochs,
    resume state, stats, trace and the current settings."""

    _offload = None  # offload.Offload: the link to a Dask cluster (offload=)
    _offload_at = None  # (epoch, next batch) while an offloading epoch runs

    def set_epoch(self, epoch):
        """The epoch the next iteration starts (its permutation and augmentations)."""
        _check_type("epoch", epoch, int, "an int")
        if epoch < 0:
            raise ValueError(f"epoch: must be >= 0, got {epoch}")
        self._loader.set_epoch(epoch)
        if self._offload is not None:  # the cluster's head start, if for another epoch
            self._offload.drop_ahead(epoch)

    def state_dict(self):
        """Where the loader is (epoch, batches already yielded) and what a restored run must
        agree on, as plain Python types: save it next to the model and optimizer state."""
        state = dict(self._loader.state())
        if self._offload_at is not None:  # an offloading epoch's position is kept here
            state["epoch"], state["batches_done"] = self._offload_at
        return state

    def load_state_dict(self, state, resplit=False):
        """The next iteration resumes exactly where `state` was taken: the same batches (indices
        and pixels) as the uninterrupted run, whatever the worker count or prefetch depth.
        A state of another data set, seed or batch layout raises ValueError; one of another
        world size too, unless resplit=True (the position is then carried over in samples).
        Packed rows (pack="concat") resplit from the states of every rank of the saved layout:
        pass the list of them (what each rank's state_dict() gave), on every new rank."""
        _check_type("resplit", resplit, bool, "a bool")
        packed = getattr(self, "pack", None) is not None
        if resplit and packed and isinstance(state, (list, tuple)):
            if not all(isinstance(s, dict) for s in state):
                raise TypeError("state: a list of the dicts each rank's state_dict() gave")
            self._loader.load_state(list(state), True)
            self._offload_at = None
            return
        if not isinstance(state, dict):
            raise TypeError(f"state: expected the dict from state_dict(), got {type(state).__name__}"
                            + (" (a list of every rank's states: packed rows with resplit=True)"
                               if isinstance(state, (list, tuple)) else ""))
        self._loader.load_state(state, resplit)
        self._offload_at = None
        if self._offload is not None:
            self._offload.drop_ahead(state.get("epoch"))

    def stats(self):
        """Per-stage figures (the "read", "map" and "consumer" stages), samples/s, current
        settings, the bottleneck verdict and errors; with offload=, "offload"."""
        s = self._loader.stats()
        if self._offload is not None:
            s["offload"] = self._offload.stats()
            # Samples the cluster's loaders (and the rescue loader) replaced count as this
            # loader's: error_count and errors cover every batch it delivered.
            s["error_count"] = s.get("error_count", 0) + self._offload.error_count
            s["errors"] = (list(s.get("errors", [])) + self._offload.errors)[-256:]
        return s

    def save_trace(self, path):
        """Writes a Chrome trace (Perfetto / chrome://tracing): threads, batches, tuner."""
        self._loader.save_trace(os.fspath(path))

    @property
    def workers(self):
        return self._loader.workers

    @property
    def prefetch(self):
        return self._loader.prefetch

    @property
    def io_depth(self):
        return self._loader.io_depth
