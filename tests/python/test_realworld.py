"""The image built-in on 415 real-world files from public image projects' test suites
(../shared/testdata/realworld: Pillow, libjpeg-turbo, image-rs' jpeg-decoder and image-png,
PngSuite; read in place, never copied into the repository).

- No decode depends on the file decoded before it (an MJPEG frame without Huffman tables after
  a JPEG that has its own; every file after every other kind).
- transform="eval" equals torchvision's ImageFolder + Resize + CenterCrop on PIL: bit for bit on
  every file both decode, except where PIL's own result is wrong (KNOWN_PIL_WRONG).
- What PIL refuses, feedline refuses (a DataError naming the file), except that feedline also
  decodes files whose damage PIL fails on only after the region it needs; what feedline
  refuses beyond PIL is corrupt entropy data (CORRUPT_PIL_PAPERS_OVER), which PIL fills in.
"""

import os

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image

import feedline

REALWORLD = os.environ.get("FEEDLINE_REALWORLD", "/work/shared/testdata/realworld")
SIZE, RESIZE = 64, 72

# PIL's own result is wrong here (the realworld README): 16-bit grey PNGs are clipped by
# convert("RGB") (feedline scales 16 to 8 bits, as libpng/libspng do), and out-of-range palette
# indices have no right answer.
KNOWN_PIL_WRONG = ("g16.png", "0g16.png", "i_trns.png", "invalid_palette_index.png")

pytestmark = pytest.mark.skipif(not os.path.isdir(REALWORLD),
                                reason=f"real-world test files not found at {REALWORLD}")


def _files():
    out = []
    for sub in sorted(os.listdir(REALWORLD)):
        d = os.path.join(REALWORLD, sub)
        if os.path.isdir(d):
            out.extend(os.path.join(d, f) for f in sorted(os.listdir(d)))
    return out


def _reference(path):
    tf = T.Compose([T.Resize(RESIZE), T.CenterCrop(SIZE), T.PILToTensor()])
    with Image.open(path) as im:
        return tf(im.convert("RGB")).numpy()


def _write_list(path, files):
    with open(path, "w") as f:
        for p in files:
            f.write(f"{p} 0\n")
    return path


def _loader(lst, **kw):
    return feedline.ImageLoader(lst, batch_size=1, transform="eval", shuffle=False, size=SIZE,
                                resize_size=RESIZE, workers=1, return_index=True, **kw)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """{path: eval output or exception}, each file in a loader of its own."""
    d = tmp_path_factory.mktemp("alone")
    out = {}
    for i, p in enumerate(_files()):
        try:
            images, _, _ = next(iter(_loader(_write_list(str(d / f"{i}.list"), [p]))))
            out[p] = images[0].numpy()
        except Exception as e:  # noqa: BLE001 (the tests inspect it)
            out[p] = e
    return out


@pytest.fixture(scope="module")
def pil(alone):
    """{path: torchvision's output or the exception PIL raised}."""
    out = {}
    for p in alone:
        try:
            out[p] = _reference(p)
        except Exception as e:  # noqa: BLE001
            out[p] = e
    return out


def _sequence(files, lst):
    """Outputs of one single-worker loader over `files` in that order, by position."""
    got = [None] * len(files)
    for images, _, indices in _loader(_write_list(lst, files)):
        got[int(indices[0])] = images[0].numpy()
    return got


def test_no_decode_depends_on_its_predecessor(alone, tmp_path):
    ok = [p for p, v in alone.items() if not isinstance(v, Exception)]
    assert len(ok) > 300
    # In both orders through one decoder (one worker): every file follows another kind.
    for name, order in (("forward", ok), ("reverse", ok[::-1])):
        got = _sequence(order, str(tmp_path / f"{name}.list"))
        changed = [p.rsplit("/", 1)[-1] for p, g in zip(order, got)
                   if not np.array_equal(g, alone[p])]
        assert not changed, f"{name}: outputs that depend on the previous file: {changed}"
    # Every file right after a JPEG with its own tables (the MJPEG case), and after a PNG.
    for before in ("pillow/Tests__images__hopper.jpg", "pillow/Tests__images__hopper.png"):
        first = os.path.join(REALWORLD, before)
        pairs = [q for p in ok for q in (first, p)]
        got = _sequence(pairs, str(tmp_path / "pairs.list"))
        changed = [p.rsplit("/", 1)[-1] for p, g in zip(pairs[1::2], got[1::2])
                   if not np.array_equal(g, alone[p])]
        assert not changed, f"after {before}: outputs that changed: {changed}"


def test_mjpeg_frame_matches_pil(alone, pil):
    p = os.path.join(REALWORLD, "jpeg-decoder/tests__reftest__images__mjpeg.jpg")
    assert np.array_equal(alone[p], pil[p])


def test_eval_is_torchvision_on_real_world_files(alone, pil):
    both = [p for p in alone
            if not isinstance(alone[p], Exception) and not isinstance(pil[p], Exception)]
    assert len(both) >= 320
    stats = {}
    for p in both:
        d = np.abs(alone[p].astype(np.int16) - pil[p].astype(np.int16))
        stats[p] = (float(d.mean()), int(d.max()))
    wrong = {p for p in both if p.endswith(KNOWN_PIL_WRONG + DAMAGED_BOTH_DECODE)}
    exact = [p for p in both if stats[p][1] == 0]
    close = [p for p in both if stats[p][0] < 0.5]
    # measured: every file outside KNOWN_PIL_WRONG is bit-exact (313 of 328 at 64/72)
    bad = {p.rsplit("/", 1)[-1]: stats[p] for p in both if p not in wrong and stats[p][1] != 0}
    assert not bad, f"differences from torchvision (mean, max): {bad}"
    assert len(close) >= 0.97 * (len(both) - len(wrong))
    assert len(exact) == len(both) - len(wrong)


# Files PIL decodes that feedline refuses by default: their entropy-coded data is damaged
# (libjpeg warns of bad Huffman codes, a marker inside a scan, an impossible progression) and
# PIL shows the filled-in result; two fuzz files that lost their end-of-image marker (PIL
# reads them because the damage lies after the last row it needs).
CORRUPT_PIL_PAPERS_OVER = {
    "op_flip2_pos_503__cov.jpg", "id_001655_src_001333_op_flip2_pos_455.jpg",
    "28c74d9284d9836017fd519f6932efd8.jpg", "5482a54657765056f1a94116a8dbffe7.jpg",
    "8e5e74dbf9b68a322fbb9512db837329.jpg", "dc-predictor-overflow.jpg",
    "subtract-with-overflow.jpg", "partial_progressive.jpg", "progressive-missing-dc.jpg",
    "hopper_bad_exif.jpg", "extraneous-bytes-after-sos.jpg",
}
# Damaged files both decode, each filling the damage its own way.
DAMAGED_BOTH_DECODE = ("clusterfuzz-testcase-minimized-fuzzer_script_tiff-5026894169374720.tif",)
# Formats torchvision's ImageFolder does not list and feedline does not read (PIL does).
NOT_IMAGEFOLDER_FORMATS = (".jp2",)


def test_errors_agree_with_pil(alone, pil):
    for p, v in alone.items():
        name = p.rsplit("/", 1)[-1]
        if isinstance(v, Exception):
            # a clear error: the file and the cause, as a DataError
            assert isinstance(v, feedline.DataError), (p, v)
            assert p in str(v), str(v)
    refused_pil_ok = {p.rsplit("/", 1)[-1] for p in alone
                      if isinstance(alone[p], Exception) and not isinstance(pil[p], Exception)}
    unexpected = {n for n in refused_pil_ok
                  if not n.endswith(NOT_IMAGEFOLDER_FORMATS)
                  and not any(n.endswith(c) for c in CORRUPT_PIL_PAPERS_OVER)}
    assert not unexpected, f"files PIL reads that feedline refuses: {sorted(unexpected)}"
    # a PNG whose IHDR checksum is wrong (PngSuite xhdn0g08) is refused
    x = os.path.join(REALWORLD, "pngsuite/tests__pngsuite__xhdn0g08.png")
    assert isinstance(alone[x], feedline.DataError) and "checksum" in str(alone[x]), alone[x]


def test_accept_corrupt_decodes_what_pil_papers_over(alone, pil, tmp_path):
    refused = [p for p, v in alone.items()
               if isinstance(v, feedline.DataError) and "Corrupt JPEG data" in str(v)
               and not isinstance(pil[p], Exception)]
    assert len(refused) >= 5
    same = 0
    for i, p in enumerate(refused):
        lst = _write_list(str(tmp_path / f"{i}.list"), [p])
        images, _, _ = next(iter(_loader(lst, accept_corrupt=True)))
        same += np.array_equal(images[0].numpy(), pil[p])
    # the same libjpeg fills in the same pixels, except where the data runs out (PIL's own
    # source manager ends differently from libjpeg's memory source)
    assert same >= len(refused) - 2, f"{same} of {len(refused)} equal to PIL"


def test_flipped_bytes_are_data_errors(tmp_path):
    """20 flipped bytes in the entropy-coded data of real photos: a DataError naming the file
    and libjpeg's complaint (PIL shows such files with a smeared band)."""
    photos = ["pillow/Tests__images__hopper.jpg", "libjpeg-turbo/testimages__testorig.jpg",
              "libjpeg-turbo/testimages__testimgint.jpg"]
    rng = np.random.default_rng(20)
    cases = []
    for rel in photos:
        data = bytearray(open(os.path.join(REALWORLD, rel), "rb").read())
        sos = data.rfind(b"\xff\xda")
        for k in range(5):
            bad = bytearray(data)
            for pos in rng.integers(sos + 20, len(bad) - 2, 20):
                bad[pos] ^= 0xFF
            q = str(tmp_path / f"flip{k}_{rel.rsplit('/', 1)[-1]}")
            with open(q, "wb") as f:
                f.write(bad)
            cases.append(q)
    refused = 0
    for i, q in enumerate(cases):
        lst = _write_list(str(tmp_path / f"c{i}.list"), [q])
        try:
            next(iter(_loader(lst)))
        except feedline.DataError as e:
            assert q in str(e) and "corrupt JPEG" in str(e), str(e)
            refused += 1
    # A flip that leaves valid Huffman codes and no left-over bytes changes the picture without
    # any sign libjpeg can see (JPEG has no checksum): measured 2 of these 15. PIL refuses 3.
    assert refused >= 12, f"{refused} of {len(cases)} flipped files refused"


def _upright_reference(path, size=SIZE, resize=RESIZE):
    from PIL import ImageOps
    tf = T.Compose([T.Resize(resize), T.CenterCrop(size), T.PILToTensor()])
    with Image.open(path) as im:
        return tf(ImageOps.exif_transpose(im).convert("RGB")).numpy()


def test_exif_transpose_matches_pil_on_all_eight_orientations(alone, pil, tmp_path):
    """exif_transpose=True equals PIL's ImageOps.exif_transpose before torchvision's eval, bit
    for bit; off (the default, as torchvision) leaves the stored orientation."""
    names = [f"pillow/Tests__images__hopper_orientation_{k}.jpg" for k in range(2, 9)]
    names += ["pillow/Tests__images__orientation_rectangle.jpg", "pillow/Tests__images__hopper.jpg"]
    paths = [os.path.join(REALWORLD, n) for n in names]
    for i, p in enumerate(paths):
        lst = _write_list(str(tmp_path / f"{i}.list"), [p])
        for transform in ("eval", "eval_fast"):
            images, _ = next(iter(feedline.ImageLoader(
                lst, batch_size=1, transform=transform, shuffle=False, size=SIZE,
                resize_size=RESIZE, workers=1, exif_transpose=True)))
            ref = _upright_reference(p)
            d = np.abs(images[0].numpy().astype(np.int16) - ref.astype(np.int16))
            if transform == "eval":
                assert d.max() == 0, (p, float(d.mean()))
            else:
                assert d.mean() < 4.0, (p, float(d.mean()))
        assert np.array_equal(alone[p], pil[p])  # by default not applied, as in torchvision


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "JPEG"])
def test_exif_transpose_train_crops_the_upright_image(tmp_path, fmt):
    """Train with exif_transpose: the same crops as from the image stored upright (lossless
    formats: the same pixels, so the same bytes), for orientations that swap the axes or not."""
    import util
    up = util.photo_like(120, 80, 4)
    to_stored = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90,
                 8: Image.Transpose.ROTATE_270, 5: Image.Transpose.TRANSPOSE}
    files = []
    for k, op in to_stored.items():
        stored = Image.fromarray(up).transpose(op)  # what a camera held that way writes
        exif = Image.Exif()
        exif[0x0112] = k
        p = str(tmp_path / f"o{k}.{fmt.lower()}")
        kw = {"lossless": True} if fmt == "WEBP" else {"quality": 100} if fmt == "JPEG" else {}
        stored.save(p, format=fmt, exif=exif.tobytes(), **kw)
        with Image.open(p) as im:  # PIL agrees that it is upright
            from PIL import ImageOps
            assert ImageOps.exif_transpose(im).size == (120, 80)
        files.append(p)
    upright = str(tmp_path / "upright.png")
    Image.fromarray(up).save(upright)
    kw = dict(batch_size=1, shuffle=False, size=48, seed=3, workers=1)
    ref = next(iter(feedline.ImageLoader(_write_list(str(tmp_path / "u.list"), [upright]), **kw)))
    for p in files:
        got = next(iter(feedline.ImageLoader(_write_list(p + ".list", [p]), exif_transpose=True,
                                             **kw)))
        d = np.abs(got[0].numpy().astype(np.int16) - ref[0].numpy().astype(np.int16))
        if fmt == "JPEG":
            assert d.mean() < 3.0, (p, float(d.mean()))  # lossy: near, not equal
        else:
            assert d.max() == 0, (p, float(d.mean()))
