"""feedline.ImageLoader: image folders, list files and shards, local or remote."""

import os
import re

from . import _feedline
from ._epoch import _EpochIterator, _start_epoch
from .mix import Mix, _Delivered
from . import _offload_epoch, offload as _offloading
from ._util import (_LoaderFace, _check_type, _default_seed, _engine_args, _is_url,
                    _options_doc, _pair, _parse_bytes, _parse_count, _resolve_cuda, _shown,
                    _timeout, _triple, _world)


class ImageLoader(_LoaderFace):
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
        ~/.cache/feedline/shards) and read from there; or feedline.Mix([(source, weight),
        ...]): several of these in set proportions (see Mix).
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
    max_record_bytes: a file, URL body or shard member larger than this fails as a bad sample
        (an int or a size such as "1GiB"), before more of it is read.
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
    offload: a distributed.Client or a Dask scheduler's address ("tcp://host:8786"): the
        cluster's workers make part of each epoch's batches (each worker needs feedline and
        read access to the source), this process the rest, in order, each batch once and with
        the bytes a local run gives; stats()["offload"] says how many came from where. A
        scheduler that goes away mid-epoch: the rest is made here, with a warning.

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
                 max_record_bytes=268435456, num_workers=None, pin_memory=False, offload=None):
        self._args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if num_workers is not None:  # accepted, not obeyed: feedline sizes its threads
            _check_type("num_workers", num_workers, int, "an int")
        _check_type("pin_memory", pin_memory, bool, "a bool")
        _check_type("even_shards", even_shards, bool, "a bool")
        seed = _default_seed() if seed is None else seed
        shards = []
        mix = source if isinstance(source, Mix) else None
        if mix is not None:
            source = ""
        elif isinstance(source, (list, tuple)):
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
        if offload is not None and device != "cpu":
            raise ValueError("offload: batches made on the cluster arrive in host memory; "
                             "use device='cpu' (and .to(device) in the loop)")
        device = _resolve_cuda(device)
        mean = _triple("mean", mean)
        std = _triple("std", std)
        if cache is not None and cache not in ("bytes", "decoded"):
            raise ValueError(f"cache: expected None, 'bytes' or 'decoded', got {cache!r}")
        # The engine's options, checked as every face checks them (rank and world_size from
        # torch.distributed or the environment when not given).
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        self._world_defaulted = self._args["rank"] is None and self._args["world_size"] is None
        rank, world_size = engine["rank"], engine["world_size"]
        scale = _pair("scale", scale)
        ratio = _pair("ratio", ratio)
        layout = layout.upper()

        max_record_bytes = _parse_bytes("max_record_bytes", max_record_bytes)
        self._return_index = return_index
        more = {}
        self._mix = mix
        if mix is not None:
            more["dataset"] = _feedline.mix_dataset(
                sources=mix.sources, weights=mix.weights, seed=seed, end=mix.end,
                samples_per_epoch=mix.samples_per_epoch or 0, shuffle=shuffle,
                read_timeout_ms=1000.0 * _timeout(read_timeout), max_record_bytes=max_record_bytes,
                memory_budget=engine["memory_budget"])
            self._mix_delivered = _Delivered(more["dataset"])
            if any(mix.options):  # sources augmented each their own way
                loader_args = dict(transform=transform, resize_size=resize_size, scale=scale,
                                   ratio=ratio, flip=flip, exif_transpose=exif_transpose,
                                   accept_corrupt=accept_corrupt,
                                   max_image_pixels=max_image_pixels)
                more["source_options"] = [_own_options(dict(loader_args, **(o or {})))
                                          for o in mix.options]
        self._loader = _feedline.image_loader(
            **more, source=source, shards=shards, transform=transform, size=size,
            resize_size=resize_size, scale=scale, ratio=ratio, flip=flip, layout=layout,
            io_depth=_parse_count("io_depth", io_depth), max_image_pixels=max_image_pixels,
            read_timeout_ms=1000.0 * _timeout(read_timeout),
            max_record_bytes=max_record_bytes, cache=cache or "none",
            dtype=dtype, mean=mean, stddev=std, device=device, accept_corrupt=accept_corrupt,
            exif_transpose=exif_transpose, even_shards=even_shards,
            cache_budget=0 if cache_budget is None else _parse_bytes("cache_budget", cache_budget),
            simulated_read_latency_ms=float(_check_type(
                "simulated_read_latency_ms", simulated_read_latency_ms, (int, float), "a number")),
            worker_nice=worker_nice, epoch_head_start=epoch_head_start, **engine)
        self._samples = None
        self.batch_size = batch_size
        self.seed = seed
        self.source = mix if mix is not None else (source or shards)
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        _offload_epoch.link(self, offload, "image", self._args, seed)

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
        offloading = _offload_epoch.start(self, self._shaped)
        if offloading is not None:
            return offloading
        # The iterator holds the loader: `for x, y in ImageLoader(...)` must see every batch.
        return _EpochIterator(_start_epoch(self), self._return_index, self)

    def _shaped(self, fields, indices):
        """An offloaded batch (its fields by name) as the iterator gives it."""
        batch = (fields["image"], fields["label"])
        return batch + (indices,) if self._return_index else batch

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
        return list(_feedline.image_classes(self._loader))

    @property
    def class_to_idx(self):
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def samples(self):
        """(path, class index) pairs, as torchvision's ImageFolder.samples."""
        if self._samples is None:
            # Paths and URLs as messages show them: a URL without its credentials or query.
            self._samples = [(_shown(p), c) for p, c in _feedline.image_samples(self._loader)]
        return self._samples

    @property
    def targets(self):
        return [label for _, label in self.samples]

    @property
    def num_samples(self):
        """Samples per epoch for this rank."""
        return self._loader.num_samples

    def stats(self):
        """The engine's figures (see the README's stats section: samples, samples_per_s, the
        "read", "map" and "consumer" stages, the bottleneck verdict, settings and errors) in the
        image built-in's words: "images", "images_per_s", "demand_images_per_s" and
        "decode_ms_per_image" beside their sample names; the map stage is the "decode" stage,
        and a map-bound verdict says "decode"."""
        s = _image_words(_LoaderFace.stats(self))
        if self._mix is not None:
            s["mix"] = self._mix_delivered.stats(self._mix)
        return s

    def __repr__(self):
        return (f"feedline.ImageLoader({_shown(self.source)!r}, batch_size={self.batch_size}, "
                f"batches={len(self)}, workers={self.workers}, prefetch={self.prefetch})")


ImageLoader.__doc__ += _options_doc(ImageLoader, groups=("engine", "image"))
_offloading.FACES["image"] = ImageLoader  # what a cluster's worker makes batches with


def _own_options(o):
    """A mixture source's image options as the engine takes them."""
    _check_type("transform", o["transform"], str, "'train', 'eval' or 'eval_fast'")
    return dict(o, scale=_pair("scale", o["scale"]), ratio=_pair("ratio", o["ratio"]))


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


def _image_words(s):
    """The engine's stats() dict, said in images: the scalars gain image names; the map stage
    and a map-bound verdict are called "decode"."""
    for sample_word, image_word in (("samples", "images"), ("samples_per_s", "images_per_s"),
                                    ("demand_samples_per_s", "demand_images_per_s"),
                                    ("map_ms_per_sample", "decode_ms_per_image")):
        if sample_word in s:
            s[image_word] = s[sample_word]
    stages = s.get("stages") or {}
    if "map" in stages:
        s["stages"] = {("decode" if k == "map" else k): v for k, v in stages.items()}
    if s.get("bottleneck") == "map":
        s["bottleneck"] = "decode"
    for event in list(s.get("tuning") or []) + list(s.get("timeline") or []):
        event["images_per_s"] = event.get("samples_per_s", 0.0)
    return s
