"""The eval transform gives torchvision's pixels: Resize(resize_size) + CenterCrop(size)."""

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import feedline

MAX_MEAN_ABS_DIFF = 4.0  # levels (of 255), per image


def _reference(path, size, resize_size):
    tf = T.Compose([T.Resize(resize_size), T.CenterCrop(size), T.PILToTensor()])
    with Image.open(path) as im:
        return tf(im.convert("RGB")).numpy()


@pytest.mark.parametrize("size,resize_size", [(224, 256), (64, 80)])
def test_eval_matches_torchvision(image_folder, size, resize_size):
    loader = feedline.ImageLoader(image_folder, batch_size=8, transform="eval", shuffle=False,
                                  size=size, resize_size=resize_size, return_index=True)
    samples = loader.samples
    seen = []
    worst = []
    for images, labels, indices in loader:
        assert images.shape[1:] == (3, size, size)
        for img, label, i in zip(images, labels.tolist(), indices.tolist()):
            path = samples[i][0]
            assert label == samples[i][1]
            ref = _reference(path, size, resize_size)
            mad = np.abs(img.numpy().astype(np.int16) - ref.astype(np.int16)).mean()
            worst.append((mad, path))
            seen.append(i)
    assert seen == list(range(len(samples)))  # shuffle=False: data set order
    bad = [(round(float(m), 2), p) for m, p in worst if m > MAX_MEAN_ABS_DIFF]
    assert not bad, f"images differing from torchvision by more than {MAX_MEAN_ABS_DIFF}: {bad}"
    # over the data set the match is much closer than the per-image bound (observed: ~0.3 at
    # 224/256, ~0.7 at 64/80); a shifted crop or a different filter shows up here first
    overall = float(np.mean([m for m, _ in worst]))
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


@pytest.mark.parametrize("size,resize_size", [(224, 256), (64, 80)])
def test_eval_odd_files_match_torchvision(odd_folder, size, resize_size):
    loader = feedline.ImageLoader(odd_folder, batch_size=4, transform="eval", shuffle=False,
                                  size=size, resize_size=resize_size, return_index=True)
    assert len(loader.samples) == 14
    results = {}
    for images, _, indices in loader:
        for img, i in zip(images, indices.tolist()):
            path = loader.samples[i][0]
            ref = _reference(path, size, resize_size)
            results[path.rsplit("/", 1)[-1]] = float(
                np.abs(img.numpy().astype(np.int16) - ref.astype(np.int16)).mean())
    assert len(results) == 14
    bad = {k: round(v, 2) for k, v in results.items() if v > MAX_MEAN_ABS_DIFF}
    assert not bad, f"mean abs difference vs torchvision > {MAX_MEAN_ABS_DIFF}: {bad}"


@pytest.mark.parametrize("size,resize_size", [(64, 40), (48, 20)])
def test_eval_crop_larger_than_resize_is_padded_like_torchvision(odd_folder, tmp_path, size,
                                                                 resize_size):
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
    loader = feedline.ImageLoader(str(root), batch_size=4, transform="eval", shuffle=False,
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
    bad = {k: round(v, 2) for k, v in results.items() if v > MAX_MEAN_ABS_DIFF}
    assert not bad, f"mean abs difference vs torchvision > {MAX_MEAN_ABS_DIFF}: {bad}"
