"""feedline.Mix: several sources in set proportions, as one loader's source."""

import math
import os

from ._util import _check_type, _is_url, _shown

_ENDS = ("first_source", "last_source")
# What a source of an ImageLoader mixture may set for itself: how its images are augmented. The
# rest (size, layout, dtype, mean, std) shapes every sample of a batch: the loader's.
_PER_SOURCE = ("transform", "resize_size", "scale", "ratio", "flip", "exif_transpose",
               "accept_corrupt", "max_image_pixels")


class Mix:
    """A weighted mixture of sources, for ImageLoader(source=Mix(...)):

        feedline.ImageLoader(feedline.Mix([("photos/", 0.7), ("drawings.tar", 0.3)]), ...)

    sources: (source, weight) pairs, each source what ImageLoader takes (a folder, a list
        file, a shard pattern or a list of shard paths, local or http(s)/s3 URLs), weights > 0
        (normalised to sum to 1); or sources alone with weights=[...].
    Each epoch draws from the sources in these proportions exactly (within one sample of each
    share over the epoch; the loader's shuffle mixes them, so each batch holds them in
    expectation). Each source is read in an order of its own, a new permutation every time it
    has been read whole, continuing from epoch to epoch where it stopped: every record of every
    source comes in turn. The epoch ends when the first source has been read whole
    (end="first_source", the default), when every source has (end="last_source": the others
    restart within the epoch), or after samples_per_epoch samples. All of it follows from the
    loader's seed and the epoch: the same batches for any worker count, on every rank, and
    state_dict() resumes a mixture exactly. The transform options are the loader's; for an
    ImageLoader a source may set its own augmentation as a third item, a dict of ImageLoader
    options among transform, resize_size, scale, ratio, flip, exif_transpose, accept_corrupt and
    max_image_pixels (("sketches/", 0.2, {"transform": "eval"})). Labels are each source's
    own. ImageLoader.stats()["mix"] gives each source's weight, samples per epoch and the
    samples delivered.
    """

    def __init__(self, sources, weights=None, end="first_source", samples_per_epoch=None):
        if isinstance(sources, (str, bytes, os.PathLike)) or not hasattr(sources, "__iter__"):
            raise TypeError("sources: expected a list of (source, weight) pairs or of sources")
        sources = list(sources)
        if not sources:
            raise ValueError("sources: at least one source")
        self.options = [None] * len(sources)  # a source's own image options (ImageLoader)
        if weights is None:
            pairs = []
            for k, item in enumerate(sources):
                if not isinstance(item, tuple) or len(item) not in (2, 3):
                    raise TypeError("sources: expected (source, weight) pairs, or (source, "
                                    "weight, options) (or give weights=)")
                if len(item) == 3:
                    self.options[k] = _options(f"sources[{k}]", item[2])
                pairs.append(item[:2])
        else:
            weights = list(weights)
            if len(weights) != len(sources):
                raise ValueError(f"weights: {len(weights)} weights for {len(sources)} sources")
            pairs = list(zip(sources, weights))
        self.sources, self.weights = [], []
        for k, (source, weight) in enumerate(pairs):
            self.sources.append(_source(f"sources[{k}]", source))
            _check_type(f"weights[{k}]", weight, (int, float), "a number")
            if isinstance(weight, bool) or not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"weights[{k}]: must be > 0 and finite, got {weight!r}")
            self.weights.append(float(weight))
        if end not in _ENDS:
            raise ValueError(f"end: expected 'first_source' or 'last_source', got {end!r}")
        self.end = end
        if samples_per_epoch is not None:
            _check_type("samples_per_epoch", samples_per_epoch, int, "an int")
            if samples_per_epoch < 1:
                raise ValueError(f"samples_per_epoch: must be >= 1, got {samples_per_epoch}")
        self.samples_per_epoch = samples_per_epoch

    def __repr__(self):
        parts = ", ".join(f"({_shown(s)!r}, {w:g}" + (f", {o!r})" if o else ")")
                          for s, w, o in zip(self.sources, self.weights, self.options))
        return f"feedline.Mix([{parts}], end={self.end!r})"


class _Delivered:
    """The samples a loader over a mixture handed out, by source (stats()["mix"]): a batch's
    indices are records, the sources' one after the other."""

    def __init__(self, dataset):
        import torch
        self._torch = torch
        self.dataset = dataset
        n = dataset.num_sources
        self._bounds = torch.tensor([dataset.offset(s) for s in range(1, n)], dtype=torch.int64)
        self.counts = torch.zeros(n, dtype=torch.int64)

    def count(self, indices):
        t = self._torch
        src = t.bucketize(t.from_dlpack(indices), self._bounds, right=True)
        self.counts += t.bincount(src, minlength=len(self.counts))

    def stats(self, mix, delivered=True):
        d, counts = self.dataset, self.counts.tolist()
        total = max(1, sum(counts))
        sources = []
        for k, src in enumerate(mix.sources):
            entry = {"source": _shown(src), "weight": d.weight(k), "per_epoch": d.per_epoch(k),
                     "read": d.reads(k)}
            if delivered:
                entry.update(delivered=counts[k], share=counts[k] / total)
            sources.append(entry)
        return {"samples_per_epoch": d.size, "end": mix.end, "sources": sources}


def _shared_options(mix):
    """A mixture for a loader whose sources all take its options (TextLoader, TokenLoader)."""
    if mix is not None and any(mix.options):
        raise ValueError("source: a source's own options (a third item) are ImageLoader's "
                         "augmentation options; this loader's sources share its options")


def _mix_stats(mix, dataset, delivered):
    """stats()["mix"] of a loader over `mix`: with the samples delivered when it counts them
    (`delivered`, a _Delivered: batches whose rows are records), else without."""
    return (delivered or _Delivered(dataset)).stats(mix, delivered=delivered is not None)


def _options(name, options):
    """A source's own image options: a dict of ImageLoader arguments among _PER_SOURCE."""
    _check_type(name, options, dict, "a dict of ImageLoader options")
    for key in options:
        if key not in _PER_SOURCE:
            raise ValueError(f"{name}: {key!r} cannot differ between sources (a source may set "
                             f"{', '.join(_PER_SOURCE)}; size, layout, dtype, mean and std are "
                             "the loader's)")
    return dict(options)


def _source(name, source):
    """A source as ImageLoader takes it: a path, pattern or URL (str), or a list of shards."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError(f"{name}: an empty list of shards")
        out = [os.fsdecode(os.fspath(_check_type(name, p, (str, bytes, os.PathLike),
                                                 "a list of shard paths"))) for p in source]
        for p in out:
            if not _is_url(p) and not os.path.exists(p):
                raise FileNotFoundError(f"{name}: {p}: no such file")
        return out
    source = os.fsdecode(os.fspath(_check_type(name, source, (str, bytes, os.PathLike),
                                               "a path, a shard pattern or a list of shards")))
    if "{" not in source and not _is_url(source) and not os.path.exists(source):
        raise FileNotFoundError(f"{name}: {source}: no such file or directory")
    return source
