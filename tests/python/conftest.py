"""Fixtures for the feedline pytest suite: data sets written once per session with PIL.

Run: cd <repo> && PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
"""

import os
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
# tests/servers: nginx on loopback (nginx.py), shared with bench/remote_compare.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "servers"))

import util  # noqa: E402

import feedline  # noqa: E402,F401  (fail early, with a clear message, when it is not importable)


# Photo-like data set: (class folder, relative path, width, height, kind). Class names mix
# upper and lower case (torchvision sorts by code point: "Dog" < "bird" < "cat" < "fish").
# Sub-folders test torchvision's walk order: sorted(os.walk()) puts "cat/sub-2" between "cat/sub"
# and "cat/sub/deeper" ('-' < '/'), which a naive depth-first walk gets wrong.
def _layout():
    rng = np.random.default_rng(1234)
    entries = []
    special = {
        "Dog": [("gray_1.jpg", "L"), ("gray_2.JPG", "L"), ("shot.JPG", "rgb"),
                ("full_chroma.jpg", "444")],
        "bird": [("cmyk.jpg", "CMYK"), ("progressive.jpg", "progressive"),
                 ("mixed.Jpeg", "rgb"), ("upper.JPEG", "rgb")],
        "cat": [("png_inside.JPEG", "png_as_jpeg"), ("real.png", "png"),
                ("sub/a.jpg", "rgb"), ("sub/b.jpeg", "rgb"), ("sub-2/c.jpg", "rgb"),
                ("sub/deeper/d.jpg", "rgb"), ("sub/deeper/e.jpg", "L")],
        "fish": [("chroma444.jpeg", "444"), ("gray_3.jpg", "L")],
    }
    counts = {"Dog": 12, "bird": 10, "cat": 8, "fish": 14}
    for cls in sorted(counts):
        for name, kind in special[cls]:
            entries.append((cls, name, kind))
        for i in range(counts[cls]):
            # names that sort differently as strings and as numbers ("img_10" < "img_2")
            entries.append((cls, f"img_{i}.jpg", "rgb"))
    out = []
    for k, (cls, name, kind) in enumerate(entries):
        long_side = int(rng.integers(160, 600))
        short_side = int(rng.integers(100, min(long_side, 450) + 1))
        if k % 3 == 0:  # portrait
            w, h = short_side, long_side
        else:           # landscape (and some squares by chance)
            w, h = long_side, short_side
        out.append((cls, name, w, h, kind, 1000 + k))
    return out


def _write_image(path, w, h, kind, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr = util.photo_like(w, h, seed)
    if kind == "L":
        Image.fromarray(arr).convert("L").save(path, format="JPEG", quality=90)
    elif kind == "CMYK":
        Image.fromarray(arr).convert("CMYK").save(path, format="JPEG", quality=92)
    elif kind == "progressive":
        Image.fromarray(arr).save(path, format="JPEG", quality=90, progressive=True)
    elif kind == "444":
        Image.fromarray(arr).save(path, format="JPEG", quality=92, subsampling=0)
    elif kind in ("png", "png_as_jpeg"):
        Image.fromarray(arr).save(path, format="PNG")
    else:
        Image.fromarray(arr).save(path, format="JPEG", quality=88)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    """An ImageFolder tree of ~60 photo-like images in 4 classes, with nested folders, mixed-case
    extensions, grayscale/CMYK/progressive/4:4:4 JPEGs, a PNG named .JPEG, a real .png and files
    that must be ignored. Returns the root path (str)."""
    root = tmp_path_factory.mktemp("imagefolder")
    for cls, name, w, h, kind, seed in _layout():
        _write_image(os.path.join(root, cls, name), w, h, kind, seed)
    # Not images: ignored by torchvision (extension) and so by feedline.
    with open(os.path.join(root, "bird", "notes.txt"), "w") as f:
        f.write("not an image\n")
    with open(os.path.join(root, "cat", "sub", "labels.csv"), "w") as f:
        f.write("a,b\n")
    with open(os.path.join(root, "README"), "w") as f:  # a file next to the class folders
        f.write("a data set\n")
    return str(root)


@pytest.fixture(scope="session")
def coord_folder(tmp_path_factory):
    """One class of 96 copies of a 400x300 coordinate image (R = x, G = y), quality 97, 4:4:4."""
    root = tmp_path_factory.mktemp("coords")
    cls = root / "c"
    cls.mkdir()
    first = str(cls / "im_000.jpg")
    Image.fromarray(util.coord_image(400, 300)).save(first, format="JPEG", quality=97,
                                                     subsampling=0)
    for i in range(1, 96):
        shutil.copyfile(first, str(cls / f"im_{i:03d}.jpg"))
    return str(root)


@pytest.fixture(scope="session")
def bad_folder(tmp_path_factory):
    """Two classes of good images plus three bad files in class 'a' (truncated JPEG, random bytes
    named .jpg, empty file). Returns (root, [bad paths])."""
    root = tmp_path_factory.mktemp("badfiles")
    rng = np.random.default_rng(7)
    for cls, n in (("a", 8), ("b", 5)):
        for i in range(n):
            w, h = int(rng.integers(120, 300)), int(rng.integers(120, 300))
            _write_image(os.path.join(root, cls, f"good_{i}.jpg"), w, h, "rgb", 50 + i)
    bad = []
    # truncated: a valid JPEG cut at 40% of its length (PIL refuses it: "image file is truncated")
    path = os.path.join(root, "a", "truncated.jpg")
    _write_image(path, 256, 256, "rgb", 99)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * 0.4)])
    bad.append(path)
    path = os.path.join(root, "a", "random.jpg")
    with open(path, "wb") as f:
        f.write(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    bad.append(path)
    path = os.path.join(root, "a", "empty.jpg")
    open(path, "wb").close()
    bad.append(path)
    return str(root), sorted(bad)


@pytest.fixture(scope="session")
def small_folder(tmp_path_factory):
    """A small, cheap data set: 2 classes x 13 images of 96..160 px (26 samples)."""
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(3)
    for cls in ("x", "y"):
        for i in range(13):
            w, h = int(rng.integers(96, 160)), int(rng.integers(96, 160))
            _write_image(os.path.join(root, cls, f"{i:02d}.jpg"), w, h, "rgb", 300 + i)
    return str(root)
