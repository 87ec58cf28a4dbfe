"""Iterating an epoch from Python: batches as torch tensors, errors and warnings in order."""

import weakref

from ._util import _shown


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
        _warn_large(self._owner, st)

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
        delivered = getattr(self._owner, "_mix_delivered", None)
        if delivered is not None:  # a mixture's samples by source (stats()["mix"])
            delivered.count(indices)
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
    if n <= 0 or getattr(getattr(owner, "_loader", None), "on_error", "skip") != "skip":
        return  # (on_error="raise": each one was raised at its batch)
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


class _FieldShaper:
    """A batch's fields (torch tensors by name) as a loader of any schema gives them: a padded
    field's "lengths" and "attention_mask" made from its lengths, `drop`'s fields left out,
    "index" added with return_index. Offloaded batches are shaped by the same one."""

    def __init__(self, return_index, padded=None, drop=()):
        import torch
        self._torch = torch
        self._return_index = return_index
        self._padded = padded  # a padded field: "lengths" and "attention_mask" from its lengths
        self._drop = drop  # fields the dicts leave out
        self._arange = None  # 0, 1, ... kept for the masks (a slice costs less than arange)

    def __call__(self, fields, indices):
        out = {name: t for name, t in fields.items() if name not in self._drop}
        if self._padded is not None:
            lengths = out.pop(self._padded + "_lengths")
            width = out[self._padded].shape[1]
            if self._arange is None or self._arange.shape[0] < width:
                self._arange = self._torch.arange(max(2 * width, 256))
            out["attention_mask"] = (self._arange[:width] < lengths.unsqueeze(1)).long()
            out["lengths"] = lengths
        if self._return_index:
            out["index"] = indices
        return out


class _FieldsIterator(_EpochIterator):
    """One epoch of a loader of any schema: dicts of tensors by field name."""

    def __init__(self, epoch, return_index, owner, padded=None, drop=(), ranks=None):
        super().__init__(epoch, return_index, owner)
        self._shape = _FieldShaper(return_index, padded, drop)
        self._ranks = ranks  # packed rows on several ranks: the step agreement (_ranks.py)
        self._rows_left = True

    def __next__(self):
        self._check()
        if self._epoch is None:
            raise StopIteration
        got = None
        if self._rows_left:
            try:
                got = self._epoch.next_fields()
            except StopIteration:
                self._rows_left = False
        if self._ranks is not None and self._ranks.any_left(got is not None) and got is None:
            got = self._epoch.padding_fields()  # another rank still has rows: the same step
        if got is None:
            self.close()
            self._ended()
            raise StopIteration
        fields, indices, _ = got
        delivered = getattr(self._owner, "_mix_delivered", None)
        if delivered is not None:  # a mixture's documents by source (padded and bucketed)
            delivered.count(indices)
        return self._shape({name: self._from_dlpack(view) for name, view in fields.items()},
                           self._from_dlpack(indices))


def _warn_large(owner, st):
    """Images above half of max_image_pixels (PIL's DecompressionBombWarning band: it warns
    there and refuses above) are decoded, counted in stats()["transform"]["large_images"] and
    said once per loader: a few bytes can cost gigabytes and seconds there."""
    counters = st.get("transform") or {}
    n = counters.get("large_images", 0)
    if n <= 0 or getattr(owner, "_large_warned", False):
        return
    owner._large_warned = True
    first = counters.get("first_large_image", -1)
    samples = getattr(owner, "samples", None)
    where = ""
    if samples is not None and 0 <= first < len(samples):
        where = f" (the first: {_shown(samples[first][0])})"
    limit = (getattr(owner, "_args", None) or {}).get("max_image_pixels")
    import warnings
    warnings.warn(f"feedline.{type(owner).__name__}: {n} image(s) had more than half of "
                  f"max_image_pixels={limit} pixels{where}, as PIL's DecompressionBombWarning: "
                  "decoding them costs memory and time; larger ones are refused",
                  RuntimeWarning, stacklevel=3)
