"""feedline.TokenLoader: pre-tokenized token files (windows, or packed documents)."""

import os

from . import _feedline, _offload_epoch, offload as _offloading
from ._epoch import _FieldShaper, _FieldsIterator, _start_epoch
from ._ranks import _agreement
from ._util import _LoaderFace, _check_type, _engine_args, _is_url, _options_doc, _shown
from .mix import Mix, _Delivered, _mix_stats, _shared_options


class TokenLoader(_LoaderFace):
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
    document when given; len() raises TypeError); batch_size is then rows per batch. On
    several ranks each document is packed on one rank, and every rank takes the same number
    of steps as TextLoader's packed rows do (process_group as there).

    path and index may be http(s):// or s3:// URLs: downloaded once into feedline's cache
    (FEEDLINE_CACHE_DIR, within FEEDLINE_SHARD_CACHE_BYTES) and memory-mapped from there;
    errors name the URL.

    offload: a distributed.Client or a Dask scheduler's address: the cluster's workers make
    part of each epoch's windows, with the bytes a local run gives (as ImageLoader's offload;
    not with pack). The workers read the token files themselves.

    path may be a feedline.Mix of token files (windows, or with index= a list of their indexes
    in the same order, packed documents, packed across the files): each epoch draws from them
    in its proportions, the same for any worker count and resumable, as ImageLoader's
    mixtures; the files share dtype and seq_len. stats()["mix"] gives each file's samples per
    epoch, read and (windows) delivered with their share.
    """

    def __init__(self, path, seq_len, batch_size=32, dtype="uint16", shuffle=True, seed=0,
                 drop_last=False, vocab_size=None, rank=None, world_size=None, workers="auto",
                 prefetch="auto", memory_budget="auto", on_error="raise", max_errors=None,
                 return_index=False, index=None, pack=None, window_rows=128, split_long=True,
                 mask_boundaries=True, eos_id=None, pad_id=0, max_length=65536,
                 process_group=None, worker_nice=19, epoch_head_start=True, offload=None):
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        mix = path if isinstance(path, Mix) else None
        _shared_options(mix)
        if mix is None:
            path = os.fsdecode(os.fspath(_check_type("path", path, (str, bytes, os.PathLike),
                                                     "a path or a feedline.Mix")))
            paths = [path]
        else:
            if any(not isinstance(p, str) for p in mix.sources):
                raise TypeError("path: a token mixture's sources are paths or URLs of token "
                                "files (not lists of shards)")
            paths = list(mix.sources)
        for p in paths:
            if not _is_url(p) and not os.path.exists(p):
                raise FileNotFoundError(f"path: {p}: no such file")
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
        if offload is not None and pack is not None:
            raise ValueError("offload: windows only; packed rows are cut from the epoch's "
                             "documents in order (a row depends on every document before it), "
                             "so they are made where they are iterated")
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        engine.update(worker_nice=worker_nice, epoch_head_start=epoch_head_start)
        self.pack = pack
        self._mix, self._mix_dataset, self._mix_delivered = mix, None, None
        if pack is None and mix is not None:
            self._loader, self._mix_dataset = _feedline.token_mix_loader(
                paths=paths, weights=mix.weights, end=mix.end,
                samples_per_epoch=mix.samples_per_epoch or 0, dtype=dtype, seq_len=seq_len,
                vocab_size=vocab_size or 0, **engine)
            self._mix_delivered = _Delivered(self._mix_dataset)  # windows: counted as delivered
        elif pack is None:
            self._loader = _feedline.token_loader(path=path, dtype=dtype, seq_len=seq_len,
                                                  vocab_size=vocab_size or 0, **engine)
        else:
            if pack not in ("concat", "bestfit"):
                raise ValueError(f"pack: expected 'concat' or 'bestfit', got {pack!r}")
            if mix is not None:
                _check_type("index", index, (list, tuple), "a list of index paths, one per source")
                if len(index) != len(paths):
                    raise ValueError(f"index: {len(index)} indexes for {len(paths)} sources")
                indexes = [os.fsdecode(os.fspath(_check_type(
                    f"index[{k}]", x, (str, bytes, os.PathLike), "a path")))
                    for k, x in enumerate(index)]
            else:
                indexes = [os.fsdecode(os.fspath(_check_type(
                    "index", index, (str, bytes, os.PathLike), "a path")))]
            for x in indexes:
                if not _is_url(x) and not os.path.exists(x):
                    raise FileNotFoundError(f"index: {x}: no such file")
            index = indexes[0] if mix is None else indexes
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
            packing = dict(dtype=dtype, vocab_size=vocab_size or 0, max_length=max_length,
                           eos_id=-1 if eos_id is None else eos_id, pack=pack, seq_len=seq_len,
                           window_rows=window_rows, split_long=split_long,
                           mask_boundaries=mask_boundaries, pad_id=pad_id)
            if mix is not None:
                self._loader, self._mix_dataset = _feedline.packed_token_mix_loader(
                    paths=paths, indexes=index, weights=mix.weights, end=mix.end,
                    samples_per_epoch=mix.samples_per_epoch or 0, **packing, **engine)
            else:
                self._loader = _feedline.packed_token_loader(path=path, index=index, **packing,
                                                             **engine)
        self.path = path
        self.seq_len = seq_len
        self.max_length = max_length
        self.batch_size = batch_size
        self.rank = engine["rank"]
        self.world_size = engine["world_size"]
        self.process_group = process_group
        self._return_index = return_index
        self._shaped = _FieldShaper(return_index)
        _offload_epoch.link(self, offload, "tokens", args, seed)

    def __len__(self):
        """Batches per epoch for this rank."""
        if self.pack is not None:
            raise TypeError("len(): packed rows per epoch are known only once they are made")
        return len(self._loader)

    def __iter__(self):
        if self.pack is not None:
            ranks = _agreement(self)
            return _FieldsIterator(_start_epoch(self), self._return_index, self,
                                   drop=("cu_seqlens_offsets",), ranks=ranks)
        offloading = _offload_epoch.start(self, self._shaped)
        if offloading is not None:
            return offloading
        return _FieldsIterator(_start_epoch(self), self._return_index, self)

    @property
    def num_samples(self):
        """Windows per epoch for this rank."""
        return self._loader.num_samples

    def stats(self):
        """As ImageLoader.stats(); with a mixture, "mix": each file's weight, samples per epoch,
        reads, and for windows the samples delivered and their share."""
        s = _LoaderFace.stats(self)
        if self._mix is not None:
            s["mix"] = _mix_stats(self._mix, self._mix_dataset, self._mix_delivered)
        return s

    def __repr__(self):
        shape = f"batches={len(self)}" if self.pack is None else f"pack={self.pack!r}"
        path = self.path if self._mix is None else f"Mix of {len(self._mix.sources)}"
        return (f"feedline.TokenLoader({_shown(path)!r}, seq_len={self.seq_len}, "
                f"batch_size={self.batch_size}, {shape}, workers={self.workers})")


TokenLoader.__doc__ += _options_doc(TokenLoader)
_offloading.FACES["tokens"] = TokenLoader  # what a cluster's worker makes batches with
