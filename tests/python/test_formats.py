"""Every format torchvision's ImageFolder accepts (and GIF, which PIL reads) loads with the
pixels torchvision's default loader gives (`Image.open(f).convert("RGB")`), bit for bit through
transform="eval". Files are written by PIL, or by hand where PIL writes no such variant (16-bit
and RLE BMPs, PPMs with another maxval, plain PNMs) and then read by PIL as the reference."""

import struct

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image

import feedline
import util

SIZE, RESIZE = 64, 72


def _reference(path):
    tf = T.Compose([T.Resize(RESIZE), T.CenterCrop(SIZE), T.PILToTensor()])
    with Image.open(path) as im:
        return tf(im.convert("RGB")).numpy()


def _load_each(paths, **kw):
    """{path: CHW uint8 array or the exception}, one loader per file (errors stay per file)."""
    out = {}
    for p in paths:
        lst = p + ".list"
        with open(lst, "w") as f:
            f.write(f"{p} 0\n")
        try:
            loader = feedline.ImageLoader(lst, batch_size=1, transform="eval", shuffle=False,
                                          size=SIZE, resize_size=RESIZE, workers=1, **kw)
            out[p] = next(iter(loader))[0][0].numpy()
        except Exception as e:  # noqa: BLE001 (the test inspects it)
            out[p] = e
    return out


def _bmp(path, width, height, bits, pixel_rows, compression=0, masks=None, palette=None,
         top_down=False):
    """A BMP with a 40-byte info header; `pixel_rows` = the encoded pixel data (rows padded)."""
    extra = b"".join(struct.pack("<I", m) for m in masks) if masks else b""
    pal = b"".join(bytes((b, g, r, 0)) for r, g, b in (palette or []))
    offset = 14 + 40 + len(extra) + len(pal)
    info = struct.pack("<IiiHHIIiiII", 40, width, -height if top_down else height, 1, bits,
                       compression, len(pixel_rows), 2835, 2835, len(palette or []), 0)
    head = b"BM" + struct.pack("<IHHI", offset + len(pixel_rows), 0, 0, offset)
    with open(path, "wb") as f:
        f.write(head + info + extra + pal + pixel_rows)
    return path


def _rows(values, row_bytes):
    """Pads each row (bytes) to a multiple of 4."""
    pad = (-row_bytes) % 4
    return b"".join(bytes(r) + b"\0" * pad for r in values)


@pytest.fixture(scope="module")
def format_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    rgb = util.photo_like(97, 83, 3)
    im = Image.fromarray(rgb)
    rgba = Image.fromarray(np.dstack([rgb, (np.arange(97 * 83) % 251).reshape(83, 97)
                                      .astype(np.uint8)]))
    files = []

    def save(name, image, **kw):
        p = str(d / name)
        image.save(p, **kw)
        files.append(p)

    # WebP: lossy, lossless, with alpha, animated (the first frame)
    save("lossy.webp", im, quality=80)
    save("lossless.webp", im, lossless=True)
    save("alpha.webp", rgba, quality=90)
    save("alpha_lossless.webp", rgba, lossless=True)
    frames = [Image.fromarray(util.photo_like(97, 83, s)) for s in (4, 5, 6)]
    save("animated.webp", frames[0], save_all=True, append_images=frames[1:], duration=40)
    # GIF: palette, interlaced, grey, with transparency, animated
    save("plain.gif", im.convert("P"))
    save("interlaced.gif", im.convert("P"), interlace=True)
    save("gray.gif", im.convert("L"))
    save("transparent.gif", im.convert("P"), transparency=5)
    save("animated.gif", frames[0].convert("P"), save_all=True,
         append_images=[f.convert("P") for f in frames[1:]], duration=40)
    # TIFF: compressions, modes, strips
    for comp in ("raw", "tiff_lzw", "tiff_deflate", "packbits", "jpeg", "tiff_adobe_deflate"):
        save(f"{comp}.tif", im, compression=comp)
    save("gray.tiff", im.convert("L"))
    save("palette.tif", im.convert("P"))
    save("bilevel.tif", im.convert("1"))
    save("rgba.tif", rgba)
    save("cmyk.tif", im.convert("CMYK"))
    # BMP by PIL: 1-bit, 8-bit grey and palette, 24-bit, 32-bit (RGBA)
    save("bilevel.bmp", im.convert("1"))
    save("gray.bmp", im.convert("L"))
    save("palette.bmp", im.convert("P"))
    save("rgb.bmp", im)
    save("rgba.bmp", rgba)
    # PPM/PGM/PBM by PIL
    save("rgb.ppm", im)
    save("gray.pgm", im.convert("L"))
    save("bilevel.pbm", im.convert("1"))

    # BMPs by hand: 16-bit 5-5-5 (default) and 5-6-5 (bit fields), top-down 24-bit, 4-bit,
    # RLE8 (with a delta, end-of-line and absolute runs) and RLE4.
    w, h = 37, 29
    v = np.random.default_rng(7).integers(0, 1 << 16, (h, w), dtype=np.uint32)
    files.append(_bmp(str(d / "bgr555.bmp"), w, h, 16,
                      _rows([struct.pack(f"<{w}H", *r) for r in (v & 0x7FFF)], 2 * w)))
    files.append(_bmp(str(d / "bgr565.bmp"), w, h, 16,
                      _rows([struct.pack(f"<{w}H", *r) for r in v], 2 * w), compression=3,
                      masks=(0xF800, 0x07E0, 0x001F)))
    small = util.photo_like(w, h, 9)
    files.append(_bmp(str(d / "topdown.bmp"), w, h, 24,
                      _rows([small[y, :, ::-1].tobytes() for y in range(h)], 3 * w),
                      top_down=True))
    pal = [tuple(int(c) for c in np.random.default_rng(i).integers(0, 256, 3)) for i in range(16)]
    idx = np.random.default_rng(8).integers(0, 16, (h, w))
    packed = [bytes((int(r[i]) << 4) | (int(r[i + 1]) if i + 1 < w else 0)
                    for i in range(0, w, 2)) for r in idx]
    files.append(_bmp(str(d / "pal4.bmp"), w, h, 4, _rows(packed, (w + 1) // 2), palette=pal))
    pal8 = [tuple(int(c) for c in np.random.default_rng(100 + i).integers(0, 256, 3))
            for i in range(256)]
    rle = bytearray()
    for y in range(h):
        rle += bytes((10, (y * 7) % 256))  # a run of 10
        lit = [(y + i * 13) % 256 for i in range(6)]
        rle += bytes((0, 6)) + bytes(lit)  # absolute run of 6 (even: no padding)
        rle += bytes((0, 5)) + bytes(lit[:5]) + b"\0"  # absolute run of 5, padded
        rle += bytes((w - 21, 200))
        rle += bytes((0, 0))  # end of line
    rle += bytes((0, 1))  # end of bitmap
    files.append(_bmp(str(d / "rle8.bmp"), w, h, 8, bytes(rle), compression=1, palette=pal8))
    rle4 = bytearray()
    for y in range(h):
        rle4 += bytes((12, 0x3A)) + bytes((0, 4, 0x12, 0x34)) + bytes((w - 16, 0x5F)) + b"\0\0"
    rle4 += bytes((0, 1))
    files.append(_bmp(str(d / "rle4.bmp"), w, h, 4, bytes(rle4), compression=2, palette=pal))
    # PNMs by hand: maxval other than 255 (8 and 16 bit), plain (ASCII) P1/P2/P3.
    vals = np.random.default_rng(5).integers(0, 1001, (h, w, 3))
    p = str(d / "max1000.ppm")
    with open(p, "wb") as f:
        f.write(b"P6\n# a comment\n%d %d\n1000\n" % (w, h) + vals.astype(">u2").tobytes())
    files.append(p)
    p = str(d / "max100.pgm")
    with open(p, "wb") as f:
        f.write(b"P5 %d %d 100\n" % (w, h) + (vals[..., 0] % 101).astype(np.uint8).tobytes())
    files.append(p)
    p = str(d / "plain.ppm")
    with open(p, "wb") as f:
        f.write(b"P3\n%d %d\n255\n" % (w, h) +
                " ".join(str(int(x)) for x in small.reshape(-1)).encode() + b"\n")
    files.append(p)
    p = str(d / "plain.pgm")
    with open(p, "wb") as f:
        f.write(b"P2\n%d %d\n15\n" % (w, h) +
                "\n".join(" ".join(str(int(x) % 16) for x in r) for r in idx).encode() + b"\n")
    files.append(p)
    p = str(d / "plain.pbm")
    with open(p, "wb") as f:
        f.write(b"P1\n%d %d\n" % (w, h) +
                "\n".join("".join(str(int(x) & 1) for x in r) for r in idx).encode() + b"\n")
    files.append(p)
    return files


def test_every_format_is_torchvision_bit_for_bit(format_files):
    got = _load_each(format_files)
    failed = {p.rsplit("/", 1)[-1]: repr(v)[:200] for p, v in got.items()
              if isinstance(v, Exception)}
    assert not failed, f"files PIL reads that feedline refused: {failed}"
    diff = {}
    for p, img in got.items():
        ref = _reference(p)
        d = np.abs(img.astype(np.int16) - ref.astype(np.int16))
        if d.max() != 0:
            diff[p.rsplit("/", 1)[-1]] = (round(float(d.mean()), 3), int(d.max()))
    assert not diff, f"differences from torchvision (mean, max): {diff}"


def test_rle_delta_follows_the_bmp_spec(tmp_path):
    """RLE8 with a delta escape (Pillow 9.4 misreads it: it consumes four bytes), against the
    pixels the format defines: unset pixels are index 0, rows bottom-up."""
    pal = [(10, 20, 30), (200, 0, 0), (0, 200, 0), (1, 2, 3), (4, 5, 6), (7, 8, 9), (90, 90, 9),
           (0, 0, 250)]
    rle = bytes((8, 1, 0, 0,  # row 0: eight 1s
                 0, 2, 3, 1,  # delta: row 1 skipped, on to row 2, x = 3
                 2, 2, 0, 0,  # two 2s, end of line
                 0, 4, 3, 4, 5, 6, 4, 7, 0, 0,  # row 3: literal 3 4 5 6, then four 7s
                 0, 1))
    bmp = _bmp(str(tmp_path / "delta.bmp"), 8, 4, 8, rle, compression=1, palette=pal)
    rows = [[1] * 8, [0] * 8, [0, 0, 0, 2, 2, 0, 0, 0], [3, 4, 5, 6, 7, 7, 7, 7]]
    expected = np.array(pal, np.uint8)[np.array(rows[::-1])]  # file rows are bottom-up
    png = str(tmp_path / "delta_expected.png")
    Image.fromarray(expected).save(png)
    got = _load_each([bmp])[bmp]
    assert not isinstance(got, Exception), got
    assert np.array_equal(got, _reference(png))


def test_format_is_told_by_content_not_name(format_files, tmp_path):
    """A WebP, a GIF and a BMP named .jpg / .png decode as what they are."""
    import shutil
    by_name = {p.rsplit("/", 1)[-1]: p for p in format_files}
    renamed = []
    for src, name in (("lossy.webp", "a.jpg"), ("plain.gif", "b.png"), ("rgb.bmp", "c.jpeg")):
        dst = str(tmp_path / name)
        shutil.copy(by_name[src], dst)
        renamed.append((by_name[src], dst))
    got = _load_each([d for _, d in renamed])
    for src, dst in renamed:
        assert not isinstance(got[dst], Exception), got[dst]
        assert np.array_equal(got[dst], _reference(src))


def test_image_folder_lists_the_other_formats(format_files, tmp_path):
    """ImageFolder takes torchvision's extensions (.webp .bmp .ppm .pgm .tif .tiff; not .gif,
    as torchvision), and all of them load."""
    import shutil
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    for p in format_files:
        shutil.copy(p, root / p.rsplit("/", 1)[-1])
    loader = feedline.ImageLoader(str(tmp_path / "folder"), batch_size=4, transform="eval",
                                  shuffle=False, size=SIZE, resize_size=RESIZE)
    names = sorted(p.rsplit("/", 1)[-1] for p, _ in loader.samples)
    exts = (".webp", ".bmp", ".ppm", ".pgm", ".tif", ".tiff")
    assert names == sorted(p.rsplit("/", 1)[-1] for p in format_files if p.endswith(exts))
    assert sum(len(x) for x, _ in loader) == len(names)


def test_damaged_files_of_each_format_fail_clearly(format_files, tmp_path):
    """Truncated or garbled files of every format are DataErrors naming the file and the
    format; nothing crashes or hangs."""
    cases = []
    for p in format_files:
        data = open(p, "rb").read()
        stem = p.rsplit("/", 1)[-1]
        for how, bad in (("half", data[:len(data) // 2]), ("header", data[:12])):
            q = str(tmp_path / f"{how}_{stem}")
            with open(q, "wb") as f:
                f.write(bad)
            cases.append(q)
    got = _load_each(cases)
    for p, v in got.items():
        try:
            ref = _reference(p)
        except Exception:  # noqa: BLE001 (PIL refuses it: so must we)
            ref = None
        if ref is None:
            assert isinstance(v, feedline.DataError), (p, v)
            assert p.rsplit("/", 1)[-1] in str(v), str(v)
        elif not isinstance(v, Exception):
            # what PIL still reads (an animated GIF's complete first frame) is the same image
            assert np.array_equal(v, ref), p
        else:
            assert isinstance(v, feedline.DataError), (p, v)
    # the truncated single-image files are all refused (PIL agrees on each, checked above)
    refused = [p for p, v in got.items() if isinstance(v, Exception)]
    assert len(refused) >= len(cases) - 2, sorted(set(cases) - set(refused))


def test_bombs_are_refused_before_decoding(tmp_path):
    """Each format's header is read first: a claimed 100000 x 100000 image is refused by
    max_image_pixels without allocating its pixels."""
    w = h = 100000
    files = []
    p = tmp_path / "bomb.bmp"
    _bmp(str(p), w, h, 24, b"\0" * 64)
    files.append(str(p))
    p = tmp_path / "bomb.ppm"
    p.write_bytes(b"P6 %d %d 255\n" % (w, h) + b"\0" * 64)
    files.append(str(p))
    p = tmp_path / "bomb.gif"
    p.write_bytes(b"GIF89a" + struct.pack("<HH", 65535, 65535) + b"\0\0\0" +  # screen
                  b"\x2c" + struct.pack("<HHHH", 0, 0, 65535, 65535) + b"\0" +  # first frame
                  b"\x08" + b"\x02\x4c\x01\0" + b"\x3b")
    files.append(str(p))
    got = _load_each(files, max_image_pixels=10_000_000)
    for p, e in got.items():
        assert isinstance(e, feedline.DataError), (p, e)
        assert "max_image_pixels" in str(e), str(e)
