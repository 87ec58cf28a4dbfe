"""feedline: a high-throughput image loader that replaces torch's DataLoader.

    import feedline
    loader = feedline.ImageLoader("data/train", batch_size=256)
    for epoch in range(90):
        for images, labels in loader:      # uint8 [B, 3, 224, 224], int64 [B]
            ...

The work happens in C++ threads (read -> decode -> batch slot); batches reach Python as torch
tensors through DLPack without a copy. Each ``iter(loader)`` starts the next epoch.
"""

import os
import re
import sys
import weakref

from . import _feedline
from ._feedline import DataError, DeviceError

__all__ = ["DataLoader", "ImageLoader", "TextLoader", "TokenLoader", "DataError", "DeviceError", "build_info",
           "__version__"]

__version__ = _feedline.build_info()["version"]


def _shown(x):
    """A path or URL (or a list of them) as messages show it: no credentials, no query."""
    if isinstance(x, (list, tuple)):
        return type(x)(_shown(v) for v in x)
    return _feedline.shown_name(x) if isinstance(x, str) else x


def __getattr__(name):
    if name == "DataLoader":  # imports torch: only when asked for
        from .dataloader import DataLoader
        return DataLoader
    raise AttributeError(f"module 'feedline' has no attribute {name!r}")


def build_info():
    """Version and compiled features: a dict."""
    return _feedline.build_info()


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


class ImageLoader:
    """Loads an image data set as batches of torch tensors, replacing torch's DataLoader.

    source: an ImageFolder directory (one sub-folder per class, torchvision's order), a list
        file of "path label" lines (paths relative to the list file's folder; paths may be
        http:// or https:// URLs, and the list file itself a URL: fetched with retries on
        5xx, 429, resets and timeouts within read_timeout, a 404/403 is a DataError naming
        the URL, credentials and query strings never appear in messages; "s3://bucket/p/" is an
        ImageFolder under that prefix), or WebDataset
        tar shards: a brace pattern "d/train-{000000..000099}.tar" or a list of paths
        (samples = key.jpg/.png/.webp/... + key.cls with the label); shards may be URLs too:
        each is downloaded once into the shard cache ($FEEDLINE_CACHE_DIR, else
        ~/.cache/feedline/shards) and read from there.
    transform: "train" = RandomResizedCrop(size, scale, ratio) + horizontal flip;
        "eval" = Resize(resize_size) + CenterCrop(size), the same pixels as torchvision on
        PIL (full decode, Pillow's antialiased bilinear filter); "eval_fast" = the same
        geometry from a reduced decode, about twice as fast, within a few levels of "eval".
    layout: "NCHW" (default) or "NHWC".
    dtype: "uint8" (default), or "float32" / "float16" / "bfloat16": normalised with mean/std
        (0..1 units), on the CPU by the decoders or on the GPU by a kernel.
    device: "cpu", or "cuda" (torch's current device) / "cuda:N": batches arrive on that GPU,
        copied on a dedicated stream and converted there; torch.from_dlpack orders them after
        the current stream. GPU failures raise feedline.DeviceError, never DataError.
    workers, prefetch, io_depth: decoder threads, batches in flight, reads in flight ("auto" or
        an int). memory_budget: bytes the loader may own ("auto", an int or "2GiB").
    on_error: "raise" (feedline.DataError naming the file, at the batch of the sample) or
        "skip" (the sample is replaced by another of the same epoch; errors in stats()).
    rank, world_size: shard for distributed training (default: torch.distributed if
        initialized, else the RANK / WORLD_SIZE environment variables, else 0 / 1; a loader
        made before init_process_group looks again at each iteration, and warns when it
        changes). even_shards: True (DistributedSampler's default: the order is padded so
        that every rank gets as many batches) or False (evaluation: each sample exactly once
        over all ranks, which then differ by at most one sample).
    seed: the shuffle's and augmentations' seed; None (default) follows torch's RNG as torch's
        own DataLoader does: torch.initial_seed() (so torch.manual_seed(s) before makes the run
        repeatable), agreed across ranks (rank 0's, broadcast) when torch.distributed is
        initialized.
    num_workers, pin_memory: torch's names, accepted so that a DataLoader call can be renamed:
        feedline sizes its decoder threads itself, whatever num_workers says (workers= fixes
        the count), and pins what it copies to a GPU.

    Output: uint8 [B, 3, H, W] by default, the pixels of torchvision's PILToTensor. With
    dtype="float32" (and the default mean/std) a batch equals torchvision's
    ToTensor() + Normalize(mean, std) per image, i.e. (x / 255 - mean) / std per channel;
    the uint8 output gives the same from ``((x.float() / 255) - mean[:, None, None]) /
    std[:, None, None]`` on the GPU, which moves 4x fewer bytes.
    cache: None, "bytes" (file contents in RAM, for slow storage) or "decoded" (decoded images
        with the shorter side at most 2 * size, so later epochs skip decode); cache_budget
        bounds it ("auto": what memory_budget leaves). Hits and misses are in stats().
    max_errors: under on_error="skip", more failed samples than this raise DataError.
    read_timeout: seconds after which a read fails (hung storage cannot hang training).
    return_index: also yield the data set indices of the batch's samples.
    simulated_read_latency_ms: adds latency to every read (benchmarks: remote storage).
    accept_corrupt: decode images with corrupt data (JPEG entropy-data damage, PNG CRC errors,
        JPEGs that end early) as PIL does (LOAD_TRUNCATED_IMAGES for the last) instead of
        raising DataError.
    exif_transpose: turn images upright by their EXIF orientation first (JPEG, PNG, WebP), as
        PIL's ImageOps.exif_transpose; off by default, as in torchvision.
    worker_nice: how many nice levels (0..19) below the training process the decoder threads
        run, so that the training thread gets a core first; FEEDLINE_WORKER_NICE overrides it.
    epoch_head_start: once every batch of an epoch is made, start the next epoch's first
        batches, so that the next iter() does not wait; FEEDLINE_EPOCH_HEAD_START=0 turns it
        off.

    Each iteration over the loader is one epoch; a new iteration cancels an unfinished one.
    """

    def __init__(self, source, batch_size=256, shuffle=True, seed=None, drop_last=False,
                 transform="train", size=224, resize_size=256, scale=(0.08, 1.0),
                 ratio=(3.0 / 4.0, 4.0 / 3.0), flip=True, layout="NCHW", dtype="uint8",
                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), device="cpu",
                 workers="auto", prefetch="auto", io_depth="auto", memory_budget="auto",
                 on_error="raise", rank=None, world_size=None, cache=None, cache_budget=None,
                 return_index=False, max_image_pixels=178956970, max_errors=None,
                 read_timeout=60.0, simulated_read_latency_ms=0.0, accept_corrupt=False,
                 exif_transpose=False, even_shards=True, worker_nice=19, epoch_head_start=True,
                 num_workers=None, pin_memory=False):
        self._args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if num_workers is not None:  # accepted, not obeyed: feedline sizes its threads
            _check_type("num_workers", num_workers, int, "an int")
        _check_type("pin_memory", pin_memory, bool, "a bool")
        _check_type("even_shards", even_shards, bool, "a bool")
        seed = _default_seed() if seed is None else seed
        shards = []
        if isinstance(source, (list, tuple)):
            if not source:
                raise ValueError("source: an empty list of shards")
            shards = [os.fsdecode(os.fspath(_check_type("source", p, (str, bytes, os.PathLike),
                                                        "a list of shard paths")))
                      for p in source]
            source = ""
            for p in shards:
                if not _is_url(p) and not os.path.exists(p):
                    raise FileNotFoundError(f"source: {p}: no such file")
        else:
            source = os.fspath(_check_type("source", source, (str, bytes, os.PathLike),
                                           "a path, a shard pattern or a list of shard paths"))
            if isinstance(source, bytes):
                source = os.fsdecode(source)
            if "{" not in source and not _is_url(source) and not os.path.exists(source):
                raise FileNotFoundError(f"source: {source}: no such file or directory")
        _check_type("batch_size", batch_size, int, "an int")
        _check_type("shuffle", shuffle, bool, "a bool")
        _check_type("seed", seed, int, "an int")
        if seed < 0:
            raise ValueError(f"seed: must be >= 0, got {seed}")
        _check_type("drop_last", drop_last, bool, "a bool")
        _check_type("transform", transform, str, "'train', 'eval' or 'eval_fast'")
        _check_type("accept_corrupt", accept_corrupt, bool, "a bool")
        _check_type("exif_transpose", exif_transpose, bool, "a bool")
        _check_type("size", size, int, "an int")
        _check_type("resize_size", resize_size, int, "an int")
        _check_type("flip", flip, bool, "a bool")
        _check_type("layout", layout, str, "'NCHW' or 'NHWC'")
        if not isinstance(dtype, str) and not str(dtype).startswith("torch."):
            raise TypeError(f"dtype: expected a dtype name such as 'float32', "
                            f"got {type(dtype).__name__}")
        _check_type("on_error", on_error, str, "'raise' or 'skip'")
        _check_type("return_index", return_index, bool, "a bool")
        _check_type("max_image_pixels", max_image_pixels, int, "an int")
        dtype = str(dtype).replace("torch.", "")
        if dtype not in ("uint8", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype: expected 'uint8', 'float32', 'float16' or 'bfloat16', "
                             f"got {dtype!r}")
        device = str(device) if not isinstance(device, str) and hasattr(device, "type") else device
        _check_type("device", device, str, "'cpu' or 'cuda[:N]'")
        if device != "cpu" and re.fullmatch(r"cuda(:\d+)?", device) is None:
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
        device = _resolve_cuda(device)
        mean = _triple("mean", mean)
        std = _triple("std", std)
        if cache is not None and cache not in ("bytes", "decoded"):
            raise ValueError(f"cache: expected None, 'bytes' or 'decoded', got {cache!r}")
        if rank is None or world_size is None:
            r, w = _world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        self._world_defaulted = self._args["rank"] is None and self._args["world_size"] is None
        _check_type("rank", rank, int, "an int")
        _check_type("world_size", world_size, int, "an int")
        scale = _pair("scale", scale)
        ratio = _pair("ratio", ratio)
        layout = layout.upper()

        self._return_index = return_index
        self._loader = _feedline.Loader(
            source=source, shards=shards, batch_size=batch_size, shuffle=shuffle, seed=seed,
            drop_last=drop_last, transform=transform, size=size, resize_size=resize_size,
            scale=scale, ratio=ratio, flip=flip, layout=layout,
            workers=_parse_count("workers", workers),
            prefetch=_parse_count("prefetch", prefetch),
            io_depth=_parse_count("io_depth", io_depth),
            memory_budget=_parse_bytes("memory_budget", memory_budget),
            on_error=on_error, rank=rank, world_size=world_size,
            max_image_pixels=max_image_pixels,
            max_errors=_parse_count("max_errors", max_errors),
            read_timeout_ms=1000.0 * _timeout(read_timeout),
            cache=cache or "none",
            dtype=dtype, mean=mean, stddev=std, device=device, accept_corrupt=accept_corrupt,
            exif_transpose=exif_transpose, even_shards=even_shards,
            cache_budget=0 if cache_budget is None else _parse_bytes("cache_budget", cache_budget),
            simulated_read_latency_ms=float(_check_type(
                "simulated_read_latency_ms", simulated_read_latency_ms, (int, float), "a number")),
            worker_nice=worker_nice, epoch_head_start=epoch_head_start)
        self._samples = None
        self.batch_size = batch_size
        self.seed = seed
        self.source = source or shards
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.pin_memory = pin_memory

    def __len__(self):
        """Batches per epoch for this rank."""
        return len(self._loader)

    def _recheck_world(self):
        """A loader made before init_process_group took world_size 1: re-shard now."""
        if not self._world_defaulted:
            return
        rank, world = _world()
        if (rank, world) == (self.rank, self.world_size):
            return
        import warnings
        warnings.warn(f"feedline.ImageLoader: made as rank {self.rank} of {self.world_size}, "
                      f"but torch.distributed now says rank {rank} of {world}: re-sharding "
                      "(create loaders after init_process_group to avoid this)", stacklevel=3)
        args = dict(self._args, rank=rank, world_size=world, seed=self.seed)
        epoch = self._loader.next_epoch
        self.__init__(**args)
        self._loader.set_epoch(epoch)

    def __iter__(self):
        self._recheck_world()
        # The iterator holds the loader: `for x, y in ImageLoader(...)` must see every batch.
        return _EpochIterator(_start_epoch(self), self._return_index, self)

    @property
    def dataset(self):
        """torch's ``loader.dataset``: len() is the data set's size; classes, samples, targets
        and class_to_idx as torchvision's ImageFolder."""
        return _DatasetView(self)

    @property
    def sampler(self):
        """torch's ``loader.sampler``: len() is this rank's samples per epoch (as
        DistributedSampler's); set_epoch(e) chooses the next epoch."""
        return _SamplerView(self)

    @property
    def classes(self):
        """Class names, as torchvision's ImageFolder.classes (empty for list files)."""
        return list(self._loader.classes)

    @property
    def class_to_idx(self):
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def samples(self):
        """(path, class index) pairs, as torchvision's ImageFolder.samples."""
        if self._samples is None:
            # Paths and URLs as messages show them: a URL without its credentials or query.
            self._samples = [(_shown(p), c) for p, c in self._loader.samples]
        return self._samples

    @property
    def targets(self):
        return [label for _, label in self.samples]

    @property
    def num_samples(self):
        """Samples per epoch for this rank."""
        return self._loader.num_samples

    def set_epoch(self, epoch):
        """The epoch the next iteration starts (its permutation and augmentations)."""
        _check_type("epoch", epoch, int, "an int")
        if epoch < 0:
            raise ValueError(f"epoch: must be >= 0, got {epoch}")
        self._loader.set_epoch(epoch)

    def state_dict(self):
        """Where the loader is (epoch, batches already yielded) and what a restored run must
        agree on, as plain Python types: save it next to the model and optimizer state."""
        return dict(self._loader.state())

    def load_state_dict(self, state, resplit=False):
        """The next iteration resumes exactly where `state` was taken: the same batches (indices
        and pixels) as the uninterrupted run, whatever the worker count or prefetch depth.
        A state of another data set, seed or batch layout raises ValueError; one of another
        world size too, unless resplit=True (the position is then carried over in samples)."""
        if not isinstance(state, dict):
            raise TypeError(f"state: expected the dict from state_dict(), got {type(state).__name__}")
        _check_type("resplit", resplit, bool, "a bool")
        self._loader.load_state(state, resplit)

    def stats(self):
        """Per-stage figures, images/s, current settings, bottleneck verdict and errors."""
        return self._loader.stats()

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

    def __repr__(self):
        return (f"feedline.ImageLoader({_shown(self.source)!r}, batch_size={self.batch_size}, "
                f"batches={len(self)}, workers={self.workers}, prefetch={self.prefetch})")


class _DatasetView:
    """What scripts read from ``loader.dataset`` (an ImageFolder's attributes)."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self):
        return len(self._loader.samples)

    classes = property(lambda self: self._loader.classes)
    class_to_idx = property(lambda self: self._loader.class_to_idx)
    samples = property(lambda self: self._loader.samples)
    imgs = samples
    targets = property(lambda self: self._loader.targets)
    root = property(lambda self: _shown(self._loader.source))

    def __repr__(self):
        return f"feedline dataset view ({len(self)} samples of {_shown(self._loader.source)!r})"


class _SamplerView:
    """What scripts read from ``loader.sampler`` (a DistributedSampler's len and set_epoch)."""

    def __init__(self, loader):
        self._loader = loader

    def __len__(self):
        return self._loader._loader.num_samples

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    @property
    def num_replicas(self):
        return self._loader.world_size

    @property
    def rank(self):
        return self._loader.rank


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


class TokenLoader:
    """Batches of token windows from a pre-tokenized token file (a flat array of uint16 or
    uint32 ids: nanoGPT's train.bin, or np.array(ids, dtype).tofile(path)), memory-mapped.

    Sample i is the window of seq_len + 1 tokens at token i * (seq_len + 1): the windows tile
    the file (the tail shorter than a window is left out) and every epoch yields each window
    once, shuffled. Each batch is a dict:
        "input_ids": int64 [B, seq_len]    tokens [start, start + seq_len)
        "labels":    int64 [B, seq_len]    tokens [start + 1, start + seq_len + 1)
    vocab_size: when given, a token id >= vocab_size is a DataError naming the file and the
    offset (on_error="skip" replaces the window instead). shuffle/seed/drop_last/rank/
    world_size/workers/prefetch/memory_budget/state_dict/stats as for ImageLoader;
    return_index=True adds "index" (the window numbers).

    With a document index (index="train.idx": n + 1 uint64 token offsets where documents
    start, np.array(offsets, np.uint64).tofile(path)) and pack="concat" or "bestfit", the
    documents are packed into rows as TextLoader packs them (same fields, window_rows,
    split_long, mask_boundaries, stats()["packing"], exact resume; eos_id appended to each
    document when given; len() raises TypeError); batch_size is then rows per batch.

    path and index may be http(s):// or s3:// URLs: downloaded once into feedline's cache
    (FEEDLINE_CACHE_DIR, within FEEDLINE_SHARD_CACHE_BYTES) and memory-mapped from there;
    errors name the URL.
    """

    def __init__(self, path, seq_len, batch_size=32, dtype="uint16", shuffle=True, seed=0,
                 drop_last=False, vocab_size=None, rank=None, world_size=None, workers="auto",
                 prefetch="auto", memory_budget="auto", on_error="raise", max_errors=None,
                 return_index=False, index=None, pack=None, window_rows=128, split_long=True,
                 mask_boundaries=True, eos_id=None, pad_id=0, max_length=65536):
        path = os.fsdecode(os.fspath(_check_type("path", path, (str, bytes, os.PathLike),
                                                 "a path")))
        if not _is_url(path) and not os.path.exists(path):
            raise FileNotFoundError(f"path: {path}: no such file")
        _check_type("seq_len", seq_len, int, "an int")
        if seq_len < 1:
            raise ValueError(f"seq_len: must be >= 1, got {seq_len}")
        dtype = str(dtype).replace("torch.", "").replace("numpy.", "")
        if dtype not in ("uint16", "uint32"):
            raise ValueError(f"dtype: expected 'uint16' or 'uint32', got {dtype!r}")
        if vocab_size is not None:
            _check_type("vocab_size", vocab_size, int, "an int")
            if vocab_size < 1:
                raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
        _check_type("return_index", return_index, bool, "a bool")
        if (index is None) != (pack is None):
            raise ValueError("index and pack: a document index is for packing its documents "
                             "(pack='concat' or 'bestfit'); without both, windows are read")
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        self.pack = pack
        if pack is None:
            self._loader = _feedline.token_loader(path=path, dtype=dtype, seq_len=seq_len,
                                                  vocab_size=vocab_size or 0, **engine)
        else:
            if pack not in ("concat", "bestfit"):
                raise ValueError(f"pack: expected 'concat' or 'bestfit', got {pack!r}")
            index = os.fsdecode(os.fspath(_check_type("index", index, (str, bytes, os.PathLike),
                                                      "a path")))
            if not _is_url(index) and not os.path.exists(index):
                raise FileNotFoundError(f"index: {index}: no such file")
            for name, v in (("window_rows", window_rows), ("max_length", max_length),
                            ("pad_id", pad_id)):
                _check_type(name, v, int, "an int")
            if window_rows < 1 or max_length < 1 or pad_id < 0:
                raise ValueError("window_rows and max_length must be >= 1, pad_id >= 0")
            if eos_id is not None:
                _check_type("eos_id", eos_id, int, "an int")
            for name, v in (("split_long", split_long), ("mask_boundaries", mask_boundaries)):
                _check_type(name, v, bool, "a bool")
            engine["doc_batch"] = 64
            self._loader = _feedline.packed_token_loader(
                path=path, dtype=dtype, index=index, vocab_size=vocab_size or 0,
                max_length=max_length, eos_id=-1 if eos_id is None else eos_id, pack=pack,
                seq_len=seq_len, window_rows=window_rows, split_long=split_long,
                mask_boundaries=mask_boundaries, pad_id=pad_id, **engine)
        self.path = path
        self.seq_len = seq_len
        self.max_length = max_length
        self.batch_size = batch_size
        self.rank = engine["rank"]
        self.world_size = engine["world_size"]
        self._return_index = return_index

    def __len__(self):
        """Batches per epoch for this rank."""
        if self.pack is not None:
            raise TypeError("len(): packed rows per epoch are known only once they are made")
        return len(self._loader)

    def __iter__(self):
        if self.pack is not None:
            return _FieldsIterator(_start_epoch(self), self._return_index, self,
                                   drop=("cu_seqlens_offsets",))
        return _FieldsIterator(_start_epoch(self), self._return_index, self)

    @property
    def num_samples(self):
        """Windows per epoch for this rank."""
        return self._loader.num_samples

    set_epoch = ImageLoader.set_epoch
    state_dict = ImageLoader.state_dict
    load_state_dict = ImageLoader.load_state_dict
    stats = ImageLoader.stats
    save_trace = ImageLoader.save_trace
    workers = ImageLoader.workers
    prefetch = ImageLoader.prefetch

    def __repr__(self):
        shape = f"batches={len(self)}" if self.pack is None else f"pack={self.pack!r}"
        return (f"feedline.TokenLoader({_shown(self.path)!r}, seq_len={self.seq_len}, "
                f"batch_size={self.batch_size}, {shape}, workers={self.workers})")


class TextLoader:
    """Batches of tokenized documents: a text file (one document per line; blank lines are not
    documents), JSON Lines (field="text": the document's text in that field), or WebDataset
    shards (a .tar or a "{000..009}" pattern: each key's .txt member, or with field its .json
    member's field), tokenized by
    SentencePiece in feedline's worker threads (no Python, no GIL), padded per batch.

    tokenizer: the path of a SentencePiece model (.model, e.g. from spm_train): the ids equal
        Python sentencepiece's encode for it; add_bos/add_eos add the model's BOS/EOS ids.
    word_cache: look each word up in a per-thread cache of the words seen before (up to 131,072
        a worker) before SentencePiece segments it: the same ids, several times the tokens/s
        on natural text. Used with models whose pieces never span whitespace (spm_train's
        default), checked at load and while running; stats()["tokenizer"] shows its hits.
    max_length: longer documents are truncated (after BOS/EOS).
    Each batch is a dict of int64 tensors: "input_ids" [B, L] (L = the batch's longest, padded
    with the model's pad id, else 0), "attention_mask" [B, L] (1 for real tokens), "lengths"
    [B]; "index" [B] (the documents' line order) with return_index=True. An invalid UTF-8
    line, a JSON line without the field and an empty document are DataErrors naming file:line
    (on_error="skip" replaces them). shuffle/seed/rank/world_size/state_dict/stats as for
    ImageLoader. source and tokenizer may be http(s):// or s3:// URLs (a file is downloaded
    once into feedline's cache, shards as for ImageLoader); errors name the URL.

    pack="concat" or "bestfit" gives packed rows of exactly seq_len tokens instead (batch_size
    rows per batch; the documents are tokenized in the workers, the rows made as batches are
    asked for): "concat" joins the documents' tokens in the epoch's order and cuts them into
    rows (GPT pre-training; add_eos=True marks the joins); "bestfit" places whole documents
    into rows by best fit, a window of the epoch's order at a time (the documents that fill
    window_rows rows; SFT; a document longer than a row is
    split into seq_len pieces, or truncated with split_long=False). Each batch: "input_ids",
    "labels" (the next token; -100 at padding and at each document's last token, except with
    pack="concat", mask_boundaries=False), "position_ids" (from 0 in each document's run),
    "attention_mask" [B, seq_len] int64, and "cu_seqlens" int32 (segment starts in the flattened
    batch, then B * seq_len: flash-attention's varlen layout). Documents are read up to
    max_length tokens (default 65536 when packing). len() is not known before the epoch is
    tokenized (TypeError); stats()["packing"] gives rows, tokens and the packing efficiency;
    state_dict() resumes exactly (a document position and offset, never buffered tokens).

    bucket=True keeps padded batches but groups documents of similar lengths (length
    bucketing): window_rows * batch_size documents of the epoch's order are sorted by length,
    cut into batches and the batches shuffled; stats()["packing"]["efficiency"] shows the
    padding saved.
    """

    def __init__(self, source, tokenizer, max_length=None, batch_size=32, field=None,
                 add_bos=False, add_eos=False, pack=None, seq_len=None, window_rows=128,
                 split_long=True, mask_boundaries=True, bucket=False, shuffle=True, seed=0,
                 drop_last=False, rank=None, world_size=None, workers="auto", prefetch="auto",
                 memory_budget="auto", on_error="raise", max_errors=None, return_index=False,
                 word_cache=True):
        source = os.fsdecode(os.fspath(_check_type("source", source, (str, bytes, os.PathLike),
                                                   "a path")))
        if "{" not in source and not _is_url(source) and not os.path.exists(source):
            raise FileNotFoundError(f"source: {source}: no such file")
        _check_type("word_cache", word_cache, bool, "a bool")
        tokenizer = os.fsdecode(os.fspath(_check_type(
            "tokenizer", tokenizer, (str, bytes, os.PathLike), "a SentencePiece model path")))
        if not _is_url(tokenizer) and not os.path.exists(tokenizer):
            raise FileNotFoundError(f"tokenizer: {tokenizer}: no such file")
        if pack not in (None, "concat", "bestfit"):
            raise ValueError(f"pack: expected None, 'concat' or 'bestfit', got {pack!r}")
        if pack is None:
            if seq_len is not None:
                raise ValueError("seq_len: only with pack='concat' or 'bestfit' (padded batches "
                                 "take max_length)")
        else:
            _check_type("seq_len", seq_len, int, "an int (the row length)")
            if seq_len < 1:
                raise ValueError(f"seq_len: must be >= 1, got {seq_len}")
            _check_type("window_rows", window_rows, int, "an int")
            if window_rows < 1:
                raise ValueError(f"window_rows: must be >= 1, got {window_rows}")
            for name, v in (("split_long", split_long), ("mask_boundaries", mask_boundaries)):
                _check_type(name, v, bool, "a bool")
        _check_type("bucket", bucket, bool, "a bool")
        if bucket and pack is not None:
            raise ValueError("bucket: groups padded batches by length; packed rows have none")
        if max_length is None:
            max_length = 512 if pack is None else 65536
        _check_type("max_length", max_length, int, "an int")
        if max_length < 1:
            raise ValueError(f"max_length: must be >= 1, got {max_length}")
        if field is not None:
            _check_type("field", field, str, "a JSON field name")
            if not field:
                raise ValueError("field: must not be empty")
        for name, v in (("add_bos", add_bos), ("add_eos", add_eos),
                        ("return_index", return_index)):
            _check_type(name, v, bool, "a bool")
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        self._tokenizer = _feedline.sentencepiece(model=tokenizer, word_cache=word_cache)
        if bucket:
            # Padded batches of similar lengths: window_rows batches' documents sorted together.
            engine["doc_batch"] = 64
            self._loader = _feedline.packed_text_loader(
                path=source, field=field or "", tokenizer=self._tokenizer, max_length=max_length,
                add_bos=add_bos, add_eos=add_eos, pack="bucket", seq_len=max_length,
                window_rows=window_rows, split_long=False, mask_boundaries=True, **engine)
        elif pack is None:
            self._loader, self._cut = _feedline.text_loader(
                path=source, field=field or "", tokenizer=self._tokenizer, max_length=max_length,
                add_bos=add_bos, add_eos=add_eos, **engine)
        else:
            # The documents are tokenized 64 at a time (the workers' unit); rows are packed
            # from them as the batches are asked for.
            engine["doc_batch"] = 64
            self._loader = _feedline.packed_text_loader(
                path=source, field=field or "", tokenizer=self._tokenizer, max_length=max_length,
                add_bos=add_bos, add_eos=add_eos, pack=pack, seq_len=seq_len, window_rows=window_rows,
                split_long=split_long, mask_boundaries=mask_boundaries, **engine)
        self.pack = pack
        self.bucket = bucket
        self.drop_last = drop_last
        self.seq_len = seq_len
        self.source = source
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.rank = engine["rank"]
        self.world_size = engine["world_size"]
        self._return_index = return_index

    def __len__(self):
        if self.pack is not None:
            raise TypeError("len(): packed rows per epoch are known only once the epoch's "
                            "documents are tokenized")
        if self.bucket:  # every document in one batch of batch_size (the last may be short)
            n = self._loader.num_samples
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self._loader)

    def __iter__(self):
        if self.pack is not None:
            return _FieldsIterator(_start_epoch(self), self._return_index, self,
                                   drop=("cu_seqlens_offsets",))
        return _FieldsIterator(_start_epoch(self), self._return_index, self,
                               padded="input_ids")

    @property
    def num_samples(self):
        return self._loader.num_samples

    set_epoch = ImageLoader.set_epoch
    state_dict = ImageLoader.state_dict
    load_state_dict = ImageLoader.load_state_dict
    save_trace = ImageLoader.save_trace
    workers = ImageLoader.workers
    prefetch = ImageLoader.prefetch

    def stats(self):
        """As ImageLoader.stats(); padded batches add "truncation": the documents cut to
        max_length and the tokens past it, over the loader's life (every epoch's reads; packed
        rows report theirs under "packing"); of them "partly_tokenized": documents of more than
        64 KiB tokenized only as far as max_length needs, whose dropped tokens count only as far
        as they were tokenized (then "tokens" is a lower bound); "tokenizer": whether the word
        cache is in use, and the documents and words encoded through it and the words found in
        it, over the loader's life."""
        s = ImageLoader.stats(self)
        s["tokenizer"] = self._tokenizer.counters()
        cut = getattr(self, "_cut", None)
        if cut is not None:
            s["truncation"] = {"max_length": self.max_length, "documents": cut.documents,
                               "tokens": cut.tokens, "partly_tokenized": cut.partly}
        return s

    def __repr__(self):
        shape = (f"batches={len(self)}" if self.pack is None
                 else f"pack={self.pack!r}, seq_len={self.seq_len}")
        return (f"feedline.TextLoader({_shown(self.source)!r}, tokenizer={_shown(self.tokenizer)!r}, "
                f"batch_size={self.batch_size}, {shape}, workers={self.workers})")


class _EpochIterator:
    """One epoch. Dropping it (or breaking out of the loop) stops the workers promptly."""

    def __init__(self, epoch, return_index, owner):
        import torch  # the consumer's torch; feedline itself does not link it
        self._from_dlpack = torch.from_dlpack
        self._owner = owner
        self._epoch = epoch
        self._return_index = return_index
        # Starting this epoch cancelled the loader's previous one: its iterator must say so.
        previous = getattr(owner, "_current_iterator", None)
        previous = previous() if previous is not None else None
        if previous is not None:
            previous._supersede()
        owner._current_iterator = weakref.ref(self)
        # Counted before the epoch started (_start_epoch): its first samples may fail before
        # this line runs.
        self._errors_at_start = getattr(owner, "_errors_before_epoch", 0)

    def _ended(self):
        """The epoch is over: say once if samples were replaced (on_error="skip")."""
        try:
            st = self._owner.stats()
        except Exception:  # noqa: BLE001 (a loader without stats)
            return
        _warn_replaced(self._owner, st, self._errors_at_start)
        _warn_cut(self._owner, st)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._epoch) if self._epoch is not None else 0

    def _supersede(self):
        """A newer iter(loader) started another epoch: this one raises from now on."""
        if self._epoch is not None:
            self._superseded = True

    def _check(self):
        if getattr(self, "_superseded", False):
            raise RuntimeError("feedline: this epoch was cancelled by a newer iter(loader) (one "
                               "epoch runs at a time: zip(loader, loader) cannot work)")

    def __next__(self):
        self._check()
        if self._epoch is None:
            raise StopIteration
        try:
            images, labels, indices, _ = self._epoch.next()
        except StopIteration:
            self.close()
            self._ended()
            raise
        images = self._from_dlpack(images)
        labels = self._from_dlpack(labels)
        if self._return_index:
            return images, labels, self._from_dlpack(indices)
        return images, labels

    def close(self):
        """Stops the epoch's workers and frees its buffers."""
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            epoch.cancel()
            del epoch

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _start_epoch(owner):
    """Starts the loader's next epoch, noting its error count first (_warn_replaced)."""
    owner._errors_before_epoch = _error_count(owner)
    return owner._loader.start_epoch()


def _error_count(owner):
    try:
        return owner.stats().get("error_count", 0)
    except Exception:  # noqa: BLE001 (a loader without the figure)
        return 0


def _warn_replaced(owner, st, at_start):
    """With on_error="skip" a failed sample is replaced by another sample of the epoch: counted
    in stats() (`st`) and said once per epoch here, never silent (the batches hold a
    duplicate)."""
    n = st.get("error_count", 0) - at_start
    if n <= 0:
        return
    errors = st.get("errors") or []
    first = errors[-n] if len(errors) >= n else (errors[0] if errors else None)
    what = f"; the first: {first.get('path', '?')}: {first.get('cause', '?')}" if isinstance(
        first, dict) else ""
    import warnings
    warnings.warn(f"feedline.{type(owner).__name__}: {n} sample(s) failed this epoch and were "
                  f"replaced by other samples of it (on_error='skip'){what}; stats()['errors'] "
                  "lists them", RuntimeWarning, stacklevel=3)


def _warn_cut(owner, st):
    """A text loader whose documents were cut to max_length (`st`: its stats()) says so, once:
    the tokens past it are in no row (packed) or batch (padded)."""
    if getattr(owner, "_cut_warned", False) or not hasattr(owner, "max_length"):
        return
    if "truncation" in st:
        documents, tokens = st["truncation"]["documents"], st["truncation"]["tokens"]
        partly = st["truncation"].get("partly_tokenized", 0)
        where = "in no batch"
    elif "packing" in st:
        documents, tokens = st["packing"]["cut_documents"], st["packing"]["cut_tokens"]
        partly = st["packing"].get("cut_partly", 0)
        where = "not packed" if getattr(owner, "pack", None) is not None else "in no batch"
    else:
        return
    if tokens > 0:
        owner._cut_warned = True
        import warnings
        warnings.warn(f"feedline.{type(owner).__name__}: {documents} document(s) longer "
                      f"than max_length={owner.max_length} tokens were cut to it "
                      f"({'at least ' if partly else ''}{tokens} tokens {where}); raise "
                      "max_length to keep them",
                      RuntimeWarning, stacklevel=3)


class _FieldsIterator(_EpochIterator):
    """One epoch of a loader of any schema: dicts of tensors by field name."""

    def __init__(self, epoch, return_index, owner, padded=None, drop=()):
        import torch
        super().__init__(epoch, return_index, owner)
        self._torch = torch
        self._padded = padded  # a padded field: "lengths" and "attention_mask" from its lengths
        self._drop = drop  # views the dicts leave out
        self._arange = None  # 0, 1, ... kept for the masks (a slice costs less than arange)

    def __next__(self):
        self._check()
        if self._epoch is None:
            raise StopIteration
        try:
            fields, indices, _ = self._epoch.next_fields()
        except StopIteration:
            self.close()
            self._ended()
            raise
        out = {name: self._from_dlpack(view) for name, view in fields.items()
               if name not in self._drop}
        if self._padded is not None:
            lengths = out.pop(self._padded + "_lengths")
            width = out[self._padded].shape[1]
            if self._arange is None or self._arange.shape[0] < width:
                self._arange = self._torch.arange(max(2 * width, 256))
            out["attention_mask"] = (self._arange[:width] < lengths.unsqueeze(1)).long()
            out["lengths"] = lengths
        if self._return_index:
            out["index"] = self._from_dlpack(indices)
        return out
