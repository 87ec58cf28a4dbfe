"""torch's default_collate, as a schema: the engine collates in place, Python rebuilds.

The first sample's structure (dicts, namedtuples, lists, tuples of tensors, numpy arrays,
numbers, strings) is inferred once into a tree of nodes whose leaves are either *fields* (a
tensor column of the batch slot, dtype and shape as torch's ``default_collate`` gives) or
*objects* (strings, bytes: kept per sample as torch keeps them, in a list). Each sample is then
flattened along that tree into contiguous numpy arrays written into the slot, and each batch is
rebuilt from the slot's columns by the same rules as torch (a tuple becomes a list, a Mapping
keeps its type when it can, ...). A sample that does not fit the tree (another shape, a missing
key) is that sample's error, as torch's ``default_collate`` would fail on the batch.

Variable-length leaves (``DataLoader(pad=...)``): a field whose dimensions may vary has
``shape`` entries ``-max`` for those dimensions; the engine pads each batch to its longest sample
with ``pad_value`` and gives each sample's length along the first variable dimension beside it.
A sample longer than ``max`` raises PadOverflow, which the loader answers by growing the bound
and restarting the epoch at the batch it stopped at (so bounds learned from the first samples
never fail a run).

What the tree cannot hold (None, PIL images, custom classes, numpy arrays of strings) makes
``infer`` return None: the loader then collates whole batches in Python with torch's own
``default_collate`` (which raises what torch raises).
"""

import collections.abc
import pickle

import numpy as np
import torch

# torch dtype -> (feedline dtype name, numpy dtype used for the slot's bytes)
_DTYPES = {
    torch.uint8: ("uint8", np.uint8), torch.int8: ("int8", np.int8),
    torch.int16: ("int16", np.int16), torch.int32: ("int32", np.int32),
    torch.int64: ("int64", np.int64), torch.float16: ("float16", np.float16),
    torch.bfloat16: ("bfloat16", np.int16), torch.float32: ("float32", np.float32),
    torch.float64: ("float64", np.float64), torch.bool: ("bool", np.bool_),
}

# The most bytes of strings/bytes one sample may carry (pickled) in the slot.
OBJECT_BYTES = 64 * 1024
OBJECTS_FIELD = "__objects__"


class Field:
    """A tensor leaf: column `index` of the slot. `shape` has -max for a variable dimension
    (padded to the batch's longest, lengths beside); `lengths_key` is the mapping key the
    lengths go under (None: the leaf becomes a (padded, lengths) pair)."""
    __slots__ = ("index", "path", "kind", "dtype", "np_dtype", "shape", "pad_value",
                 "lengths_key", "padded")

    def __init__(self, index, path, kind, dtype, shape):
        self.index, self.path, self.kind, self.dtype = index, path, kind, dtype
        self.np_dtype = _DTYPES[dtype][1]
        self.shape = tuple(shape)
        self.pad_value = 0
        self.lengths_key = None
        self.padded = False  # pad= names it: any of its dimensions may become variable

    @property
    def variable(self):
        return any(d < 0 for d in self.shape)

    def slot_elements(self):
        """The most elements one sample may have."""
        n = 1
        for d in self.shape:
            n *= abs(d)
        return n


class Obj:
    """A string/bytes leaf: torch keeps the batch's values as they come, a list under a
    Mapping (built with a list comprehension), a tuple under a sequence (built with zip)."""
    __slots__ = ("index", "path", "types", "as_tuple")

    def __init__(self, index, path, types, as_tuple):
        self.index, self.path, self.types, self.as_tuple = index, path, types, as_tuple


class Node:
    """A container: kind 'map' (keys), 'ntuple', 'tuple', 'list'."""
    __slots__ = ("kind", "type", "keys", "children", "path")

    def __init__(self, kind, type_, keys, children, path):
        self.kind, self.type, self.keys, self.children, self.path = (kind, type_, keys, children,
                                                                     path)


class Schema:
    def __init__(self, root, fields, objects):
        self.root, self.fields, self.objects = root, fields, objects

    def engine_fields(self):
        """(name, dtype, shape, ragged, pad_value) for feedline's PythonTransform."""
        out = [(f"f{f.index}", _DTYPES[f.dtype][0], list(f.shape), False, float(f.pad_value))
               for f in self.fields]
        if self.objects:
            out.append((OBJECTS_FIELD, "bytes", [-OBJECT_BYTES], True, 0.0))
        return out


class _Unsupported(Exception):
    pass


def _name(path):
    return "sample" + "".join(f"[{p!r}]" for p in path)


def _leaf_kind(x):
    """torch's collate_fn_map dispatch, in its order; None for a container or unsupported."""
    if isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, np.ndarray):
        return "ndarray"
    if isinstance(x, (np.bool_, np.number)):
        return "npscalar"
    if isinstance(x, float):
        return "float"
    if isinstance(x, int):
        return "int"
    if isinstance(x, (str, bytes)):
        return "object"
    return None


def _infer(x, path, in_sequence, fields, objects):  # a module function: see _rebuild
    kind = _leaf_kind(x)
    if kind == "object":
        objects.append(Obj(len(objects), path, (str, bytes), in_sequence))
        return objects[-1]
    if kind is not None:
        one = torch.utils.data.default_collate([x])  # what torch makes of it, exactly
        if not isinstance(one, torch.Tensor) or one.dtype not in _DTYPES:
            raise _Unsupported(path)
        if kind == "tensor" and (x.is_sparse or x.device.type != "cpu"):
            raise _Unsupported(path)
        fields.append(Field(len(fields), path, kind, one.dtype, one.shape[1:]))
        return fields[-1]
    if isinstance(x, np.generic):  # np.object_ scalars and the like
        raise _Unsupported(path)
    if isinstance(x, collections.abc.Mapping):
        keys = list(x)
        return Node("map", type(x), keys,
                    [_infer(x[k], path + (k,), False, fields, objects) for k in keys], path)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return Node("ntuple", type(x), None,
                    [_infer(v, path + (i,), True, fields, objects) for i, v in enumerate(x)],
                    path)
    if isinstance(x, collections.abc.Sequence):
        return Node("tuple" if isinstance(x, tuple) else "list", type(x), None,
                    [_infer(v, path + (i,), True, fields, objects) for i, v in enumerate(x)],
                    path)
    raise _Unsupported(path)


def infer(sample):
    """The Schema of `sample`, or None when it needs torch's collate in Python."""
    fields, objects = [], []

    try:
        root = _infer(sample, (), False, fields, objects)
    except (_Unsupported, TypeError, RuntimeError):
        return None
    if not fields:  # nothing for the slot: objects only
        return None
    return Schema(root, fields, objects)


class SampleMismatch(RuntimeError):
    """A sample unlike the first one (torch's default_collate would fail on its batch)."""


class PadOverflow(SampleMismatch):
    """A padded leaf longer than its field's bound. The message's last line is
    ``<field index> <dimension> <size>``: the loader grows the bound and goes on (so it is
    never replaced by another sample under on_error="skip")."""
    replaceable = False


def overflow_of(text):
    """(field index, dimension, size) from a PadOverflow's message, else None."""
    try:
        f, d, n = text.strip().rsplit("\n", 1)[-1].split()
        return int(f), int(d), int(n)
    except ValueError:
        return None


def learned_bound(longest):
    """The bound of a padded dimension whose longest sample so far is `longest`: twice that,
    rounded up to a power of two (at least 16), so that growing it is rare."""
    return 1 << max(4, (2 * longest - 1).bit_length())


def _leaf_name(path):
    """A leaf's name for pad={...}: its mapping key or sequence index (the last path step)."""
    return path[-1] if path else None


def resolve_pad(samples, schema, pad, pad_value, bounds):
    """Makes the variable dimensions of `schema`'s fields from `pad` (True: every leaf whose
    shape differs among `samples`; a dict {name: True | max | per-dimension maxima}) and the
    bounds grown earlier in this loader (`bounds`: {(field, dim): max}). A learned bound is
    twice the longest seen, rounded up to a power of two."""
    if not pad and not bounds:
        return schema
    names = {} if pad is True or not pad else dict(pad)
    seen = [[[] for _ in f.shape] for f in schema.fields]
    for s in samples:
        try:
            leaves = flatten(s, schema, check_shapes=False)
        except SampleMismatch:
            continue
        for f, a in zip(schema.fields, leaves):
            if a.ndim == len(f.shape):
                for d, n in enumerate(a.shape):
                    seen[f.index][d].append(n)
    used = set()
    for f in schema.fields:
        if not f.shape:
            continue
        spec = True if pad is True else names.get(_leaf_name(f.path), None)
        if _leaf_name(f.path) in names:
            used.add(_leaf_name(f.path))
        shape = list(f.shape)
        if spec is not None and spec is not False:
            if spec is True:
                var = [len(set(v)) > 1 for v in seen[f.index]]
                maxima = [0] * len(shape)
            elif isinstance(spec, int):
                var = [d == 0 for d in range(len(shape))]
                maxima = [spec] + [0] * (len(shape) - 1)
            else:
                spec = list(spec)
                if len(spec) != len(shape):
                    raise ValueError(f"pad: {_leaf_name(f.path)!r} has {len(shape)} dimensions, "
                                     f"got {len(spec)} bounds")
                var = [m is not None for m in spec]
                maxima = [m if isinstance(m, int) and not isinstance(m, bool) else 0
                          for m in spec]
            for d in range(len(shape)):
                if var[d]:
                    longest = max(seen[f.index][d] + [shape[d], 1])
                    bound = maxima[d] or learned_bound(longest)
                    shape[d] = -bound
            f.pad_value = pad_value
            f.padded = True
        for (fi, d), m in bounds.items():
            if fi == f.index and d < len(shape):
                shape[d] = -max(abs(shape[d]), m)
        f.shape = tuple(shape)
        _name_lengths(schema, f)
    unknown = set(names) - used
    if unknown:
        raise ValueError(f"pad: no tensor field named {sorted(unknown, key=repr)[0]!r} in the "
                         "samples")
    return schema


def with_bounds(schema, bounds):
    """A copy of `schema` whose padded dimensions are at least the bounds grown since it was
    learned ({(field, dim): max})."""
    import copy
    out = copy.deepcopy(schema)
    for f in out.fields:
        shape = list(f.shape)
        for (fi, d), m in bounds.items():
            if fi == f.index and d < len(shape):
                shape[d] = -max(abs(shape[d]), m)
        if tuple(shape) != f.shape:
            f.shape = tuple(shape)
            _name_lengths(out, f)
    return out


def _name_lengths(schema, f):
    """A variable leaf in a mapping gets its lengths under `<key>_lengths` beside it (when the
    mapping has no such key); elsewhere the leaf becomes a (padded, lengths) pair."""
    if not f.variable or not f.path or f.lengths_key is not None:
        return
    parent = _parent(schema.root, f.path)
    if parent is not None and parent.kind == "map":
        key = f"{f.path[-1]}_lengths"
        if key not in parent.keys:
            f.lengths_key = key


def _parent(root, path):
    node = root
    for step in path[:-1]:
        if not isinstance(node, Node):
            return None
        if node.kind == "map":
            node = node.children[node.keys.index(step)]
        else:
            node = node.children[step]
    return node if isinstance(node, Node) else None


def _to_numpy(x, f, check_shapes=True, contiguous=True):
    if f.kind == "tensor":
        if not isinstance(x, torch.Tensor):
            raise SampleMismatch(f"{_name(f.path)}: a {type(x).__name__}, the first sample has "
                                 "a tensor")
        if x.dtype != f.dtype:
            raise SampleMismatch(f"{_name(f.path)}: dtype {x.dtype}, the first sample's is "
                                 f"{f.dtype}")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if f.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        # contiguous=False: a strided view as it is (the thread executor's C++ copy reads the
        # strides: PILToTensor's CHW view of an HWC image costs one pass, not two).
        a = (t.contiguous() if contiguous else t).numpy()
    elif f.kind == "ndarray":
        if not isinstance(x, np.ndarray):
            raise SampleMismatch(f"{_name(f.path)}: a {type(x).__name__}, the first sample has "
                                 "a numpy array")
        if x.dtype != f.np_dtype and f.dtype != torch.bfloat16:
            raise SampleMismatch(f"{_name(f.path)}: dtype {x.dtype}, the first sample's is "
                                 f"{np.dtype(f.np_dtype)}")
        a = np.ascontiguousarray(x)
    else:  # numbers: as torch.tensor / torch.as_tensor of the batch would type them
        if _leaf_kind(x) not in ("npscalar", "float", "int"):
            raise SampleMismatch(f"{_name(f.path)}: a {type(x).__name__}, the first sample has "
                                 "a number")
        a = np.asarray(x, dtype=f.np_dtype)
    if check_shapes:
        _check_shape(a, f)
    return a


def _check_shape(a, f):
    """Raises unless array `a` fits field `f` (PadOverflow: it would, with a larger bound)."""
    if a.shape == f.shape:
        return
    if (f.variable or f.padded) and a.ndim == len(f.shape):
        for d, (n, m) in enumerate(zip(a.shape, f.shape)):
            if (m < 0 and n > -m) or (m >= 0 and n != m and f.padded):
                raise PadOverflow(f"{_name(f.path)}: {n} along dimension {d}, more than the "
                                  f"padded field's bound {abs(m)}\n{f.index} {d} {n}")
            if m >= 0 and n != m:
                break
        else:
            return
    raise SampleMismatch(
        f"{_name(f.path)}: shape {list(a.shape)}, the first sample's is {list(f.shape)} "
        "(torch's default_collate cannot stack them either; pass pad=True or collate_fn=)")


def flatten(sample, schema, check_shapes=True, contiguous=True):
    """The sample's slot columns (numpy arrays, in field order, then the pickled objects as
    uint8 when there are any): contiguous, or tensors' strided views when not `contiguous`."""
    leaves = [None] * len(schema.fields)
    objs = [None] * len(schema.objects)
    _flatten(sample, schema.root, leaves, objs, check_shapes, contiguous)
    if schema.objects:
        blob = pickle.dumps(objs, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > OBJECT_BYTES:
            raise SampleMismatch(f"the sample's strings take {len(blob)} bytes, more than "
                                 f"feedline's {OBJECT_BYTES} per sample: pass collate_fn=")
        leaves.append(np.frombuffer(blob, np.uint8))
    return leaves


def _flatten(x, node, leaves, objs, check_shapes, contiguous=True):  # module function: _rebuild
    if isinstance(node, Field):
        leaves[node.index] = _to_numpy(x, node, check_shapes, contiguous)
    elif isinstance(node, Obj):
        if not isinstance(x, node.types):
            raise SampleMismatch(f"{_name(node.path)}: a {type(x).__name__}, the first "
                                 "sample has a string")
        objs[node.index] = x
    elif node.kind == "map":
        if not isinstance(x, collections.abc.Mapping):
            raise SampleMismatch(f"{_name(node.path)}: a {type(x).__name__}, the first "
                                 "sample has a mapping")
        for k, child in zip(node.keys, node.children):
            if k not in x:
                raise SampleMismatch(f"{_name(node.path)}: no key {k!r}")
            _flatten(x[k], child, leaves, objs, check_shapes, contiguous)
    else:
        if not isinstance(x, collections.abc.Sequence) or len(x) != len(node.children):
            raise SampleMismatch("each element in list of batch should be of equal size "
                                 f"({_name(node.path)})")
        for v, child in zip(x, node.children):
            _flatten(v, child, leaves, objs, check_shapes, contiguous)


def as_field_dtype(t, f):
    """A column's tensor with its field's torch dtype: bool and bfloat16 travel as bytes and
    int16 (numpy and DLPack have no bfloat16)."""
    if f.dtype in (torch.bool, torch.bfloat16) and t.dtype != f.dtype:
        return t.view(f.dtype)
    return t


class PaddedCollate:
    """default_collate with pad=, for batches collated in Python (num_workers=0, and irregular
    batch_sampler batches in the workers): the samples' schema is inferred from the first batch
    (padded leaves resolved on it), then every batch is padded to its own longest, lengths
    beside. Samples the schema does not describe go to torch's default_collate. Picklable (a
    worker process gets its own copy)."""

    def __init__(self, pad, pad_value):
        self.pad, self.pad_value, self.schema = pad, pad_value, None

    def __call__(self, samples):
        if self.schema is None:
            schema = infer(samples[0]) or False
            if schema:
                resolve_pad(samples, schema, self.pad, self.pad_value, {})
            self.schema = schema
        if not self.schema:
            return torch.utils.data.default_collate(samples)
        return collate_padded(samples, self.schema)


def collate_padded(samples, schema):
    """Python's padded collation (num_workers=0): the engine's layout for `schema` — variable
    leaves padded to the batch's longest with lengths beside them; a pad= leaf whose fixed
    dimension differs becomes variable there (as the engine's restart does)."""
    flat = [flatten(s, schema, check_shapes=False) for s in samples]
    columns, lengths = [], {}
    for f in schema.fields:
        arrays = [leaves[f.index] for leaves in flat]
        for a in arrays:
            try:
                _check_shape(a, f)
            except PadOverflow:
                f.shape = tuple(-max(abs(m), n) if (m < 0 or n != m) else m
                                for m, n in zip(f.shape, a.shape))
        if not f.variable:
            t = torch.from_numpy(np.stack(arrays))
        else:
            longest = [max(a.shape[d] for a in arrays) for d in range(len(f.shape))]
            out = np.full([len(arrays)] + longest, f.pad_value, dtype=f.np_dtype)
            for i, a in enumerate(arrays):
                out[(i,) + tuple(slice(0, n) for n in a.shape)] = a
            t = torch.from_numpy(out)
            first = next(d for d, m in enumerate(f.shape) if m < 0)
            lengths[f.index] = torch.tensor([a.shape[first] for a in arrays], dtype=torch.int64)
        columns.append(as_field_dtype(t, f))
        _name_lengths(schema, f)
    objects = None
    if schema.objects:
        objects = [pickle.loads(leaves[-1].tobytes()) for leaves in flat]
    return rebuild(schema, columns, objects, lengths)


def rebuild(schema, columns, objects, lengths=None):
    """The batch as torch's default_collate gives it: `columns` are the fields' [B, ...]
    tensors, `objects` a list (per sample) of the object leaves, `lengths` the padded fields'
    [B] lengths by field index (under `<key>_lengths` in their mapping, else beside the padded
    tensor as a (padded, lengths) pair)."""
    return _rebuild(schema.root, columns, objects, lengths)


# The recursive walks are module functions, not closures: a closure that calls itself is a
# reference cycle (function -> cell -> function) that keeps what it captured alive until
# Python's cycle collector runs. For a batch that is its tensors, so their slots: the ring made
# a new slot for every batch until then (hundreds of MB with worker processes, where the main
# thread allocates too few objects for the collector to run often).
def _rebuild(node, columns, objects, lengths):
    if isinstance(node, Field):
        if node.variable and node.lengths_key is None:
            return (columns[node.index], lengths[node.index])
        return columns[node.index]
    if isinstance(node, Obj):
        values = [o[node.index] for o in objects]
        return tuple(values) if node.as_tuple else values
    values = [_rebuild(c, columns, objects, lengths) for c in node.children]
    if node.kind == "map":
        d = {k: v for k, v in zip(node.keys, values)}
        for c in node.children:
            if isinstance(c, Field) and c.lengths_key is not None:
                d[c.lengths_key] = lengths[c.index]
        try:
            return node.type(d)
        except TypeError:
            return d
    if node.kind == "ntuple":
        return node.type(*values)
    if node.kind == "tuple":
        return values
    try:
        return node.type(values)
    except TypeError:
        return values
