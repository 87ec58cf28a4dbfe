"""torch's default_collate, as a schema: the engine collates in place, Python rebuilds.

The first sample's structure (dicts, namedtuples, lists, tuples of tensors, numpy arrays,
numbers, strings) is inferred once into a tree of nodes whose leaves are either *fields* (a
tensor column of the batch slot, dtype and shape as torch's ``default_collate`` gives) or
*objects* (strings, bytes: kept per sample as torch keeps them, in a list). Each sample is then
flattened along that tree into contiguous numpy arrays written into the slot, and each batch is
rebuilt from the slot's columns by the same rules as torch (a tuple becomes a list, a Mapping
keeps its type when it can, ...). A sample that does not fit the tree (another shape, a missing
key) is that sample's error, as torch's ``default_collate`` would fail on the batch.

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
    """A tensor leaf: column `index` of the slot."""
    __slots__ = ("index", "path", "kind", "dtype", "np_dtype", "shape")

    def __init__(self, index, path, kind, dtype, shape):
        self.index, self.path, self.kind, self.dtype = index, path, kind, dtype
        self.np_dtype = _DTYPES[dtype][1]
        self.shape = tuple(shape)


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
        """(name, dtype, shape, ragged) for feedline's PythonTransform."""
        out = [(f"f{f.index}", _DTYPES[f.dtype][0], list(f.shape), False) for f in self.fields]
        if self.objects:
            out.append((OBJECTS_FIELD, "bytes", [-OBJECT_BYTES], True))
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


def infer(sample):
    """The Schema of `sample`, or None when it needs torch's collate in Python."""
    fields, objects = [], []

    def walk(x, path, in_sequence=False):
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
            return Node("map", type(x), keys, [walk(x[k], path + (k,)) for k in keys], path)
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return Node("ntuple", type(x), None,
                        [walk(v, path + (i,), True) for i, v in enumerate(x)], path)
        if isinstance(x, collections.abc.Sequence):
            return Node("tuple" if isinstance(x, tuple) else "list", type(x), None,
                        [walk(v, path + (i,), True) for i, v in enumerate(x)], path)
        raise _Unsupported(path)

    try:
        root = walk(sample, ())
    except (_Unsupported, TypeError, RuntimeError):
        return None
    if not fields:  # nothing for the slot: objects only
        return None
    return Schema(root, fields, objects)


class SampleMismatch(RuntimeError):
    """A sample unlike the first one (torch's default_collate would fail on its batch)."""


def _to_numpy(x, f):
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
        a = t.contiguous().numpy()
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
    if a.shape != f.shape:
        raise SampleMismatch(
            f"{_name(f.path)}: shape {list(a.shape)}, the first sample's is {list(f.shape)} "
            "(torch's default_collate cannot stack them either; pass collate_fn= to pad)")
    return a


def flatten(sample, schema):
    """The sample's slot columns (contiguous numpy arrays, in field order, then the pickled
    objects as uint8 when there are any)."""
    leaves = [None] * len(schema.fields)
    objs = [None] * len(schema.objects)

    def walk(x, node):
        if isinstance(node, Field):
            leaves[node.index] = _to_numpy(x, node)
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
                walk(x[k], child)
        else:
            if not isinstance(x, collections.abc.Sequence) or len(x) != len(node.children):
                raise SampleMismatch("each element in list of batch should be of equal size "
                                     f"({_name(node.path)})")
            for v, child in zip(x, node.children):
                walk(v, child)

    walk(sample, schema.root)
    if schema.objects:
        blob = pickle.dumps(objs, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) > OBJECT_BYTES:
            raise SampleMismatch(f"the sample's strings take {len(blob)} bytes, more than "
                                 f"feedline's {OBJECT_BYTES} per sample: pass collate_fn=")
        leaves.append(np.frombuffer(blob, np.uint8))
    return leaves


def rebuild(schema, columns, objects):
    """The batch as torch's default_collate gives it: `columns` are the fields' [B, ...]
    tensors, `objects` a list (per sample) of the object leaves."""

    def walk(node):
        if isinstance(node, Field):
            return columns[node.index]
        if isinstance(node, Obj):
            values = [o[node.index] for o in objects]
            return tuple(values) if node.as_tuple else values
        values = [walk(c) for c in node.children]
        if node.kind == "map":
            d = {k: v for k, v in zip(node.keys, values)}
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

    return walk(schema.root)
