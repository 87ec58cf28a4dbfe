"""A whole batch from a worker process (batch mode, and the batches a layout is learned from):
a pickle whose tensors travel beside it, each written once.

`pickle.dumps` of a collated batch copies every tensor's bytes into the pickle (38 MB for 256
images), the pickle was copied into the staging area, and the loader copied it again before
unpickling: three copies of the batch alive at once in the process tree at the epoch's start.
Here a dense CPU tensor of 4 KiB or more is a pickle protocol 5 out-of-band buffer: the worker
writes its bytes straight into the staging area (`dump`), and the loader's tensor is a view of
the one copy the engine keeps of the reply (`load`). Everything else (user collate results of
any type, small tensors) is pickled as usual.

Layout (little-endian int64 words, then bytes): [magic, pickle bytes, buffers], (offset, size)
per buffer, the pickle, then each buffer at its offset (64-byte aligned).
"""

import io
import pickle
import struct

_MAGIC = int.from_bytes(b"FLBATCH1", "little")
_HEAD = struct.Struct("<qqq")
_PAIR = struct.Struct("<qq")
_MIN_OUT_OF_BAND = 4096


def _plain(t):
    """A tensor whose bytes can travel as they are: a plain dense CPU tensor that owns its
    storage whole (a view of a larger storage is pickled as usual, with its storage), without
    autograd history, names or lazy conjugation."""
    import torch
    if (type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu"
            or t.requires_grad or t.is_quantized or not t.is_contiguous()
            or t.storage_offset() != 0 or t.numel() * t.element_size() < _MIN_OUT_OF_BAND):
        return False
    try:
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        return (storage.nbytes() == t.numel() * t.element_size() and not t.has_names()
                and not t.is_conj() and not t.is_neg())
    except (RuntimeError, AttributeError):
        return False


def _rebuild(buffer, dtype, shape):
    import torch
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        import torch
        if isinstance(obj, torch.Tensor) and _plain(obj):
            try:
                raw = obj.reshape(-1).view(torch.uint8).numpy()
            except (RuntimeError, TypeError):  # no numpy
                return NotImplemented
            return _rebuild, (pickle.PickleBuffer(raw), obj.dtype, tuple(obj.shape))
        return NotImplemented


def _aligned(n):
    return (n + 63) // 64 * 64


def dump(obj, area):
    """Writes `obj` into the writable buffer `area` when it fits; returns (size, None), else
    (size, the payload as a bytearray) for the pipe. Raises what pickling raises."""
    buffers, out = [], io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    body = out.getbuffer()
    raws = [b.raw() for b in buffers]
    off = _aligned(_HEAD.size + _PAIR.size * len(raws) + body.nbytes)
    places = []
    for r in raws:
        places.append((off, r.nbytes))
        off = _aligned(off + r.nbytes)
    size = places[-1][0] + places[-1][1] if places else _HEAD.size + body.nbytes
    dest = area if size <= len(area) else bytearray(size)
    head = _HEAD.pack(_MAGIC, body.nbytes, len(raws)) + b"".join(
        _PAIR.pack(*p) for p in places)
    dest[:len(head)] = head
    dest[len(head):len(head) + body.nbytes] = body
    for (o, n), r in zip(places, raws):
        dest[o:o + n] = r
    return size, (None if dest is area else dest)


def load(payload):
    """The object of a `dump`ed payload (any buffer: its tensors are views of it)."""
    view = memoryview(payload).cast("B")
    if view.nbytes < _HEAD.size:
        raise ValueError(f"feedline: a worker's batch reply of {view.nbytes} bytes is truncated")
    magic, body, n = _HEAD.unpack_from(view)
    start = _HEAD.size + _PAIR.size * n
    if magic != _MAGIC or body < 0 or n < 0 or start + body > view.nbytes:
        raise ValueError("feedline: a worker's batch reply is malformed")
    buffers = []
    for i in range(n):
        o, size = _PAIR.unpack_from(view, _HEAD.size + _PAIR.size * i)
        if o < start + body or size < 0 or o + size > view.nbytes:
            raise ValueError("feedline: a worker's batch reply is malformed")
        buffers.append(view[o:o + size])
    return pickle.loads(view[start:start + body], buffers=buffers)


def split(obj):
    """`obj` as (its pickle, [its tensors' bytes as uint8 numpy arrays]): for a transport that
    sends arrays as they are (Dask's out-of-band frames), without a copy into the pickle."""
    import numpy as np
    buffers, out = [], io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    return out.getvalue(), [np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers]


def join(body, arrays):
    """The object `split` gave (body, arrays) for: its tensors are views of `arrays` (copied
    first where one is read-only, which a tensor cannot view)."""
    import numpy as np
    buffers = []
    for a in arrays:
        a = np.asarray(a)
        buffers.append(a if a.flags.writeable else a.copy())
    return pickle.loads(body, buffers=buffers)
