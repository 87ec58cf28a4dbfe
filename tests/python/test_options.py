"""Options are declared once, in C++ (include/feedline/options.h): the Python faces are checked
against the declarations. Every declared option is an ImageLoader keyword argument with the
declared default (or the face's documented spelling of it), and the binding takes the declared
names and types and nothing else."""
import inspect

import pytest

import feedline
from feedline import _feedline

# Where ImageLoader spells an option otherwise than its declaration, and why.
PYTHON_NAME = {
    "stddev": "std",                   # torchvision's Normalize(mean, std)
    "read_timeout_ms": "read_timeout",  # seconds, as Python's timeouts
    "shards": "source",                # a list of shard paths is a source
}
# Declared options ImageLoader does not take, and why.
NOT_IN_IMAGELOADER = {
    "synthetic": "benchmarking only: feedline-bench --source synthetic",
}
# Declared default -> what ImageLoader shows for it, where the face resolves it itself.
FACE_DEFAULT = {
    "seed": None,            # torch.initial_seed(), rank 0's on every rank
    "rank": None,            # torch.distributed's, else RANK
    "world_size": None,      # torch.distributed's, else WORLD_SIZE
    "workers": "auto",       # declared kAuto (0)
    "prefetch": "auto",
    "io_depth": "auto",
    "memory_budget": "auto",  # declared 0: a quarter of the available memory
    "cache": None,           # declared "none"
    "cache_budget": None,    # declared 0: what memory_budget leaves
    "max_errors": None,      # declared 0: no limit
}
# ImageLoader arguments that are not loader options: torch's names, accepted; the face's own.
FACE_ONLY = {"num_workers", "pin_memory", "return_index", "offload"}


def _declarations():
    return {name: (group, default) for name, group, default, _ in _feedline.option_declarations()}


def test_declarations_cover_both_groups():
    decl = _declarations()
    assert {g for g, _ in decl.values()} == {"engine", "image"}
    assert decl["io_depth"] == ("engine", 0)
    assert decl["mean"] == ("image", (0.485, 0.456, 0.406))
    assert decl["transform"] == ("image", "train")
    assert decl["read_timeout_ms"] == ("engine", 60000.0)


def test_imageloader_takes_every_declared_option_with_its_default():
    params = inspect.signature(feedline.ImageLoader).parameters
    seen = set()
    for name, (_, default) in _declarations().items():
        if name in NOT_IN_IMAGELOADER:
            assert name not in params
            continue
        py = PYTHON_NAME.get(name, name)
        assert py in params, f"ImageLoader has no argument for the declared option {name}"
        seen.add(py)
        if py == "source":
            assert params[py].default is inspect.Parameter.empty  # required
            continue
        shown = params[py].default
        if name in FACE_DEFAULT:
            assert shown == FACE_DEFAULT[name], (name, shown)
        elif name == "read_timeout_ms":
            assert shown * 1000.0 == default
        else:
            assert shown == default, f"{py}: ImageLoader's default {shown!r}, declared {default!r}"
    assert set(params) - seen - {"source"} == FACE_ONLY


def test_the_binding_takes_declared_names_and_types_only(image_folder):
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        _feedline.image_loader(source="x", batchsize=4)
    with pytest.raises(TypeError, match="batch_size: expected an int, got str"):
        _feedline.image_loader(source="x", batch_size="4")
    with pytest.raises(TypeError, match="shuffle: expected a bool, got int"):
        _feedline.image_loader(source="x", shuffle=1)
    with pytest.raises(TypeError, match="workers: expected an int, got bool"):
        _feedline.image_loader(source="x", workers=True)
    with pytest.raises(ValueError, match="transform: expected one of 'train', 'eval', "
                                         "'eval_fast', got 'crop'"):
        _feedline.image_loader(source="x", transform="crop")
    with pytest.raises(ValueError, match=r"worker_nice: must be in \[0, 19\]"):
        _feedline.image_loader(source=image_folder, worker_nice=20)


def test_imageloader_passes_the_new_options_through(image_folder):
    ld = feedline.ImageLoader(image_folder, batch_size=4, worker_nice=5, epoch_head_start=False,
                              workers=1)
    assert ld.stats()["worker_nice"] == 5
    with pytest.raises(ValueError, match="worker_nice"):
        feedline.ImageLoader(image_folder, worker_nice=-1)


def test_help_shows_each_declared_option_with_its_doc_line():
    """The doc lines are declared once too (FEEDLINE_ARG's last argument): help() on each face
    and on the binding shows them, with the defaults the face shows."""
    import pydoc
    decl = _feedline.option_declarations()
    docs = {name: doc for name, _, _, doc in decl}
    groups = {name: group for name, group, _, _ in decl}
    assert all(doc and not doc.endswith(".") for doc in docs.values()), docs
    # TokenLoader's dtype is the token files' own, not the image option: engine options only.
    for face, takes in ((feedline.ImageLoader, ("engine", "image")),
                        (feedline.TextLoader, ("engine",)), (feedline.TokenLoader, ("engine",))):
        params = inspect.signature(face).parameters
        text = pydoc.render_doc(face, renderer=pydoc.plaintext)
        shown = 0
        for name, doc in docs.items():
            py = PYTHON_NAME.get(name, name)
            if groups[name] not in takes:
                assert f": {doc}." not in " ".join(text.split()), (face.__name__, name)
                continue
            if py not in params or params[py].default is inspect.Parameter.empty:
                continue
            line = f"{py}={params[py].default!r}: {doc}."
            assert line in " ".join(text.split()), f"{face.__name__}: no line for {py}"
            shown += 1
        assert shown >= (30 if face is feedline.ImageLoader else 10), (face.__name__, shown)
    binding = " ".join(_feedline.image_loader.__doc__.split())
    for name, doc in docs.items():
        assert f" {name}=" in binding and f": {doc}." in binding, name
