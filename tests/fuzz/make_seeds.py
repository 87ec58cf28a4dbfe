#!/usr/bin/env python3
"""Writes the tar and list-file fuzzers' seed corpora.

Usage: make_seeds.py IMAGE_SEEDS_DIR TAR_OUT_DIR LIST_OUT_DIR

Tar seeds are WebDataset shards (key.jpg/key.png + key.cls) in every header flavour the indexer
reads: ustar (with the prefix field), GNU (long names, base-256 sizes), pax (path records),
with directories, links, empty members, no end-of-archive blocks, and one ending mid-member.
Their images are the decode seeds, so that the tar fuzzer also reaches TarSource's reads.
List seeds are "path label" files, well-formed and not.
"""
import io
import os
import sys
import tarfile


def member(tar, name, data, **kw):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1700000000
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data))


def shard(fmt, entries, extra=None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in entries:
            member(tar, name, data)
        if extra:
            extra(tar)
    return buf.getvalue()


def checksum(header):
    h = bytearray(header)
    h[148:156] = b" " * 8
    return b"%06o\0 " % sum(h)


def base256_size(archive):
    """The first member's size field rewritten in GNU base-256, checksum fixed."""
    h = bytearray(archive[:512])
    size = int(h[124:136].split(b"\0")[0].strip() or b"0", 8)
    h[124:136] = bytes([0x80]) + size.to_bytes(11, "big")
    h[148:156] = checksum(h)
    return bytes(h) + archive[512:]


def format_seeds(out_dir):
    """Small images in the other formats the decoder reads (WebP, GIF, TIFF, BMP, PNM) and
    JPEG/PNG/WebP with an EXIF orientation, written by PIL into the decode seed folder."""
    from PIL import Image
    base = Image.new("RGB", (23, 17))
    base.putdata([((x * 11) % 256, (y * 15) % 256, (x * y) % 256) for y in range(17)
                  for x in range(23)])
    rgba = base.copy()
    rgba.putalpha(128)
    exif = Image.Exif()
    exif[0x0112] = 6
    seeds = [
        ("lossy.webp", base, dict(quality=70)), ("lossless.webp", rgba, dict(lossless=True)),
        ("anim.webp", base, dict(save_all=True, append_images=[rgba], duration=10)),
        ("p.gif", base.convert("P"), {}), ("i.gif", base.convert("P"), dict(interlace=True)),
        ("raw.tif", base, {}), ("lzw.tif", rgba, dict(compression="tiff_lzw")),
        ("jpeg.tif", base, dict(compression="jpeg")), ("p.tif", base.convert("P"), {}),
        ("rgb.bmp", base, {}), ("p.bmp", base.convert("P"), {}), ("1.bmp", base.convert("1"), {}),
        ("rgb.ppm", base, {}), ("l.pgm", base.convert("L"), {}), ("1.pbm", base.convert("1"), {}),
        ("exif.jpg", base, dict(exif=exif.tobytes())), ("exif.png", base, dict(exif=exif.tobytes())),
        ("exif.webp", base, dict(exif=exif.tobytes())),
    ]
    for name, im, kw in seeds:
        im.save(os.path.join(out_dir, "fmt_" + name), **kw)


def main():
    images_dir, tar_dir, list_dir = sys.argv[1:4]
    format_seeds(images_dir)
    os.makedirs(tar_dir, exist_ok=True)
    os.makedirs(list_dir, exist_ok=True)
    images = {}
    for name in sorted(os.listdir(images_dir)):
        with open(os.path.join(images_dir, name), "rb") as f:
            images[name] = f.read()
    small = [n for n in images if len(images[n]) < 2000][:4]

    def samples(prefix=""):
        out = []
        for i, name in enumerate(small):
            ext = name.rsplit(".", 1)[1]
            out.append((f"{prefix}s{i:04d}.{ext}", images[name]))
            out.append((f"{prefix}s{i:04d}.cls", b"%d\n" % i))
        return out

    long_dir = "a_rather_long_directory_name_" * 4 + "/"
    seeds = {
        "ustar.tar": shard(tarfile.USTAR_FORMAT, samples()),
        "ustar_prefix.tar": shard(tarfile.USTAR_FORMAT, samples(long_dir)),
        "gnu_longname.tar": shard(tarfile.GNU_FORMAT, samples(long_dir + "x" * 90 + "/")),
        "pax_path.tar": shard(tarfile.PAX_FORMAT, samples(long_dir + "ü" * 60 + "/")),
        "with_dirs_links.tar": shard(
            tarfile.GNU_FORMAT, samples("d/"),
            lambda t: (member(t, "d", b"", type=tarfile.DIRTYPE),
                       member(t, "d/link.jpg", b"", type=tarfile.SYMTYPE, linkname="s0000.jpg"),
                       member(t, "d/hard.jpg", b"", type=tarfile.LNKTYPE, linkname="d/s0000.jpg"),
                       member(t, "d/s9999.json", b'{"k": 1}'))),
        "empty_member.tar": shard(tarfile.USTAR_FORMAT, [("e.jpg", b""), ("e.cls", b"0")]),
        "label_errors.tar": shard(tarfile.USTAR_FORMAT,
                                  [("a.jpg", images[small[0]]), ("a.cls", b"-3"),
                                   ("b.png", images[small[-1]])]),
        "empty_archive.tar": b"\0" * 1024,
    }
    seeds["no_end_blocks.tar"] = seeds["ustar.tar"].rstrip(b"\0")
    seeds["no_end_blocks.tar"] += b"\0" * (-len(seeds["no_end_blocks.tar"]) % 512)
    seeds["truncated_member.tar"] = seeds["ustar.tar"][: 512 + 100]
    seeds["base256_size.tar"] = base256_size(seeds["ustar.tar"])
    for name, data in seeds.items():
        with open(os.path.join(tar_dir, name), "wb") as f:
            f.write(data)

    lists = {
        "simple.txt": b"class0/img000.jpg 0\nclass1/img001.jpg 1\n",
        "spaces_tabs.txt": b"my photos/a b.jpg\t3\n  /abs/path/c.png   12  \n",
        "comments_blank.txt": b"# header\n\n   \n#x 1\nx.jpg 0\n",
        "no_final_newline.txt": b"a.jpg 0\nb.jpg 7",
        "crlf.txt": b"a.jpg 0\r\nb.jpg 1\r\n",
        "bad_label.txt": b"a.jpg 0\nb.jpg -1\n",
        "overflow_label.txt": b"a.jpg 99999999999999999999999\n",
        "plus_label.txt": b"a.jpg +5\n",
        "label_only.txt": b"5\n",
        "only_comments.txt": b"# nothing\n",
        "nul_byte.txt": b"a\0b.jpg 1\n",
        "utf8.txt": "données/été.jpg 4\n".encode(),
        "long_line.txt": b"x" * 3000 + b" 1\n",
    }
    for name, data in lists.items():
        with open(os.path.join(list_dir, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} tar seeds in {tar_dir}, {len(lists)} list seeds in {list_dir}")


if __name__ == "__main__":
    main()
