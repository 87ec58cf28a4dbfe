"""feedline.TextLoader: text and JSON Lines documents tokenized in feedline's threads."""

import os

from . import _feedline, _offload_epoch, offload as _offloading
from ._epoch import _FieldShaper, _FieldsIterator, _start_epoch
from .mix import Mix, _Delivered, _mix_stats, _shared_options
from ._ranks import _agreement
from ._util import _LoaderFace, _check_type, _engine_args, _is_url, _options_doc, _shown


class TextLoader(_LoaderFace):
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
    once into feedline's cache, shards as for ImageLoader); errors name the URL. source may be
    a feedline.Mix of such sources (documents in set proportions, as for ImageLoader; packed
    rows are packed across them; stats()["mix"] gives each source's documents per epoch, read,
    and delivered with their share: for padded and bucketed batches, whose rows are documents).

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
    On several ranks each document is packed on one rank (every real token once per epoch
    over the ranks), and every rank takes the same number of steps: each step the ranks agree
    through torch.distributed (the default group, or process_group: the ranks that split the
    data; one all-reduce of one int over gloo) whether any still has rows, and a rank that
    has none meanwhile gets batches of padding rows (labels -100, attention_mask 0, "index"
    -1), counted in stats()["packing"]["padding_rows"]. Without torch.distributed
    initialized the ranks cannot agree (warned once).

    offload: a distributed.Client or a Dask scheduler's address: the cluster's workers make
        part of each epoch's padded batches, with the bytes a local run gives (as ImageLoader's
        offload; not with pack or bucket, whose rows depend on every document before them).
        The workers read source and tokenizer themselves.

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
                 word_cache=True, process_group=None, worker_nice=19, epoch_head_start=True,
                 offload=None):
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        mix = source if isinstance(source, Mix) else None
        _shared_options(mix)
        if mix is None:
            source = os.fsdecode(os.fspath(_check_type(
                "source", source, (str, bytes, os.PathLike), "a path or a feedline.Mix")))
            if "{" not in source and not _is_url(source) and not os.path.exists(source):
                raise FileNotFoundError(f"source: {source}: no such file")
        elif any(not isinstance(s, str) for s in mix.sources):
            raise TypeError("source: a text mixture's sources are paths, patterns or URLs "
                            "(str), not lists of shards")
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
        if offload is not None and (pack is not None or bucket):
            raise ValueError("offload: padded batches only; packed rows and length buckets are "
                             "cut from the epoch's documents in order (a row depends on every "
                             "document before it), so they are made where they are iterated")
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        engine.update(worker_nice=worker_nice, epoch_head_start=epoch_head_start)
        self._tokenizer = _feedline.sentencepiece(model=tokenizer, word_cache=word_cache)
        self._mix, self._mix_dataset, self._mix_delivered = mix, None, None
        if mix is not None:  # the documents of every source, mixed (feedline.Mix)
            engine["documents"] = self._mix_dataset = _feedline.text_mix(
                sources=mix.sources, weights=mix.weights, field=field or "", seed=seed,
                end=mix.end, samples_per_epoch=mix.samples_per_epoch or 0, shuffle=shuffle)
            source = ""
            if pack is None:  # padded and bucketed batches are documents: counted as delivered
                self._mix_delivered = _Delivered(self._mix_dataset)
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
        self.source = mix if mix is not None else source
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.rank = engine["rank"]
        self.world_size = engine["world_size"]
        self.process_group = process_group
        self._return_index = return_index
        self._shaped = _FieldShaper(return_index, padded="input_ids")
        _offload_epoch.link(self, offload, "text", args, seed)

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
            ranks = _agreement(self)
            return _FieldsIterator(_start_epoch(self), self._return_index, self,
                                   drop=("cu_seqlens_offsets",), ranks=ranks)
        offloading = _offload_epoch.start(self, self._shaped)
        if offloading is not None:
            return offloading
        return _FieldsIterator(_start_epoch(self), self._return_index, self,
                               padded="input_ids")

    @property
    def num_samples(self):
        return self._loader.num_samples

    def stats(self):
        """As ImageLoader.stats(); padded batches add "truncation": the documents cut to
        max_length and the tokens past it, over the loader's life (every epoch's reads; packed
        rows report theirs under "packing"); of them "partly_tokenized": documents of more than
        64 KiB tokenized only as far as max_length needs, whose dropped tokens count only as far
        as they were tokenized (then "tokens" is a lower bound); "tokenizer": whether the word
        cache is in use, and the documents and words encoded through it and the words found in
        it, over the loader's life."""
        s = _LoaderFace.stats(self)
        s["tokenizer"] = self._tokenizer.counters()
        if self._mix is not None:
            s["mix"] = _mix_stats(self._mix, self._mix_dataset, self._mix_delivered)
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


TextLoader.__doc__ += _options_doc(TextLoader)
_offloading.FACES["text"] = TextLoader  # what a cluster's worker makes batches with
