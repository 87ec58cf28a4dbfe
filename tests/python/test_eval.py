"""The eval transform gives torchvision's pixels: Resize(resize_size) + CenterCrop(size).

"eval" is bit for bit torchvision on PIL (same libjpeg decode, Pillow's filter); "eval_fast"
(reduced decode, approximate filter) stays within FAST_MAX_MEAN_ABS_DIFF levels per image."""

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import feedline

FAST_MAX_MEAN_ABS_DIFF = 4.0  # levels (of 255), per image, for eval_fast


def _reference(path, size, resize_size):
    tf = T.Compose([T.Resize(resize_size), T.CenterCrop(size), T.PILToTensor()])
    with Image.open(path) as im:
        return tf(im.convert("RGB")).numpy()


def _diffs(loader, resize_size):
    """{path: (mean, max) |difference| from torchvision} over one epoch of `loader`."""
    out = {}
    for images, labels, indices in loader:
        for img, label, i in zip(images, labels.tolist(), indices.tolist()):
            path, target = loader.samples[i]
            assert label == target
            ref = _reference(path, img.shape[-1], resize_size)
            d = np.abs(img.numpy().astype(np.int16) - ref.astype(np.int16))
            out[path] = (float(d.mean()), int(d.max()))
    return out


@pytest.mark.parametrize("size,resize_size", [(224, 256), (64, 80), (224, 224), (97, 331)])
def test_eval_is_torchvision_bit_for_bit(image_folder, size, resize_size):
    loader = feedline.ImageLoader(image_folder, batch_size=8, transform="eval", shuffle=False,
                                  size=size, resize_size=resize_size, return_index=True)
    seen = []
    for images, _, indices in loader:
        assert images.shape[1:] == (3, size, size)
        seen.extend(indices.tolist())
    assert seen == list(range(len(loader.samples)))  # shuffle=False: data set order
    diffs = _diffs(loader, resize_size)
    assert len(diffs) == len(loader.samples)
    bad = {p: d for p, d in diffs.items() if d[1] != 0}
    assert not bad, f"images differing from torchvision (mean, max): {bad}"


@pytest.mark.parametrize("size,resize_size", [(224, 256), (64, 80)])
def test_eval_fast_is_close_to_torchvision(image_folder, size, resize_size):
    loader = feedline.ImageLoader(image_folder, batch_size=8, transform="eval_fast",
                                  shuffle=False, size=size, resize_size=resize_size,
                                  return_index=True)
    diffs = _diffs(loader, resize_size)
    bad = {p: round(m, 2) for p, (m, _) in diffs.items() if m > FAST_MAX_MEAN_ABS_DIFF}
    assert not bad, f"images differing from torchvision by more than {FAST_MAX_MEAN_ABS_DIFF}"
    # over the data set the match is much closer than the per-image bound (observed: ~0.3 at
    # 224/256, ~0.7 at 64/80); a shifted crop or a different filter shows up here first
    overall = float(np.mean([m for m, _ in diffs.values()]))
    assert overall < 1.5, f"mean abs difference over the data set: {overall:.2f}"


def test_eval_nhwc_is_nchw_permuted(image_folder):
    kw = dict(batch_size=16, transform="eval", shuffle=False, size=64, resize_size=80)
    nchw = [x.clone() for x, _ in feedline.ImageLoader(image_folder, layout="NCHW", **kw)]
    nhwc = [x.clone() for x, _ in feedline.ImageLoader(image_folder, layout="NHWC", **kw)]
    assert len(nchw) == len(nhwc)
    for a, b in zip(nchw, nhwc):
        assert b.shape == (a.shape[0], 64, 64, 3)
        assert torch.equal(a.permute(0, 2, 3, 1), b)


def test_train_nhwc_is_nchw_permuted(small_folder):
    """Same seed: the same crops and flips whatever the layout."""
    kw = dict(batch_size=8, seed=11, size=48)
    nchw = [x.clone() for x, _ in feedline.ImageLoader(small_folder, layout="NCHW", **kw)]
    nhwc = [x.clone() for x, _ in feedline.ImageLoader(small_folder, layout="nhwc", **kw)]
    for a, b in zip(nchw, nhwc):
        assert torch.equal(a.permute(0, 2, 3, 1), b)


def test_eval_is_deterministic_across_seeds(small_folder):
    """Nothing random in eval: seeds do not change the pixels (shuffle=False)."""
    kw = dict(batch_size=8, transform="eval", shuffle=False, size=48, resize_size=56)
    a = [x.clone() for x, _ in feedline.ImageLoader(small_folder, seed=1, **kw)]
    b = [x.clone() for x, _ in feedline.ImageLoader(small_folder, seed=2, **kw)]
    assert all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory):
    """Less common encodings and shapes, one class: EXIF orientation (torchvision does not apply
    it), PNG modes (RGBA, palette, L, LA), a 1x1 and a 17x23 image, very long/tall images,
    4:2:2 subsampling, odd sizes, quality 100, optimized Huffman tables, progressive CMYK, and a
    large 2000x1500 JPEG (DCT-scaled decode territory)."""
    import util
    root = tmp_path_factory.mktemp("odd")
    d = root / "c"
    d.mkdir()
    base = util.photo_like(300, 200, 5)
    im = Image.fromarray(base)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    im.save(str(d / "exif_rot.jpg"), quality=90, exif=exif.tobytes())
    Image.fromarray(np.dstack([base, np.full(base.shape[:2], 100, np.uint8)])).save(
        str(d / "rgba.png"))
    im.convert("P").save(str(d / "palette.png"))
    im.convert("L").save(str(d / "gray.png"))
    im.convert("LA").save(str(d / "gray_alpha.png"))
    im.save(str(d / "optimized.jpg"), quality=90, optimize=True)
    for name, (w, h), kw in (("tiny.jpg", (17, 23), {}), ("one_pixel.jpg", (1, 1), {}),
                             ("long.jpg", (700, 60), {}), ("tall.jpg", (60, 700), {}),
                             ("s422.jpg", (333, 257), dict(subsampling=1)),
                             ("q100.jpg", (333, 257), dict(quality=100)),
                             ("big.jpg", (2000, 1500), {})):
        args = dict(quality=90)
        args.update(kw)
        Image.fromarray(util.photo_like(w, h, w + h)).save(str(d / name), **args)
    Image.fromarray(util.photo_like(333, 257, 12)).convert("CMYK").save(
        str(d / "cmyk_progressive.jpg"), quality=90, progressive=True)
    return str(root)


@pytest.mark.parametrize("transform", ["eval", "eval_fast"])
@pytest.mark.parametrize("size,resize_size", [(224, 256), (64, 80)])
def test_eval_odd_files_match_torchvision(odd_folder, size, resize_size, transform):
    loader = feedline.ImageLoader(odd_folder, batch_size=4, transform=transform, shuffle=False,
                                  size=size, resize_size=resize_size, return_index=True)
    assert len(loader.samples) == 14
    results = {p.rsplit("/", 1)[-1]: d for p, d in _diffs(loader, resize_size).items()}
    assert len(results) == 14
    if transform == "eval":
        bad = {k: d for k, d in results.items() if d[1] != 0}
    else:
        bad = {k: round(d[0], 2) for k, d in results.items() if d[0] > FAST_MAX_MEAN_ABS_DIFF}
    assert not bad, f"{transform}: differences from torchvision: {bad}"


@pytest.mark.parametrize("transform", ["eval", "eval_fast"])
@pytest.mark.parametrize("size,resize_size", [(64, 40), (48, 20)])
def test_eval_crop_larger_than_resize_is_padded_like_torchvision(odd_folder, tmp_path, size,
                                                                 resize_size, transform):
    """CenterCrop larger than the resized image pads with zeros, as torchvision does, for every
    shape: ordinary images (the whole image is resized) and thin ones, whose resized image would
    be huge (1 x 3000 at resize 40 is 40 x 120000) and where only the visible part of the window
    is resampled, so memory follows the output."""
    import shutil
    import util
    root = tmp_path / "pad"
    shutil.copytree(odd_folder, root)
    for name, (w, h) in {"thin.jpg": (1, 3000), "flat.jpg": (3000, 2)}.items():
        Image.fromarray(util.photo_like(w, h, 7)).save(str(root / "c" / name), quality=95)
    loader = feedline.ImageLoader(str(root), batch_size=4, transform=transform, shuffle=False,
                                  size=size, resize_size=resize_size, return_index=True)
    results = {}
    for images, _, indices in loader:
        for img, i in zip(images, indices.tolist()):
            path = loader.samples[i][0]
            ref = _reference(path, size, resize_size)
            got = img.numpy()
            # where torchvision pads (whole zero rows/columns of the reference), so do we
            pad_cols = np.flatnonzero(ref.max(axis=(0, 1)) == 0)
            pad_rows = np.flatnonzero(ref.max(axis=(0, 2)) == 0)
            assert not got[:, :, pad_cols].any() and not got[:, pad_rows, :].any(), path
            results[path.rsplit("/", 1)[-1]] = float(
                np.abs(got.astype(np.int16) - ref.astype(np.int16)).mean())
    assert len(results) == 16 and {"thin.jpg", "flat.jpg"} <= results.keys()
    limit = 0.0 if transform == "eval" else FAST_MAX_MEAN_ABS_DIFF
    bad = {k: round(v, 2) for k, v in results.items() if v > limit}
    assert not bad, f"{transform}: mean abs difference vs torchvision > {limit}: {bad}"
