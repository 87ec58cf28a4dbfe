"""Bad arguments and bad files."""

import os
import warnings

import pytest

import feedline
import util


# --- bad arguments --------------------------------------------------------------------------

BAD_ARGS = [
    # (keyword arguments, exception type, text the message must contain)
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=-3), ValueError, "batch_size"),
    (dict(batch_size="x"), TypeError, "batch_size"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(transform="foo"), ValueError, "transform"),
    (dict(layout="xyz"), ValueError, "layout"),
    (dict(workers=-1), ValueError, "workers"),
    (dict(workers=0), ValueError, "workers"),
    (dict(workers="many"), TypeError, "workers"),
    (dict(prefetch=0), ValueError, "prefetch"),
    (dict(io_depth=-2), ValueError, "io_depth"),
    (dict(memory_budget="lots"), ValueError, "memory_budget"),
    (dict(memory_budget=-5), ValueError, "memory_budget"),
    (dict(memory_budget=1.5), TypeError, "memory_budget"),
    (dict(scale=(0.9, 0.1)), ValueError, "scale"),
    (dict(scale=(0.0, 1.0)), ValueError, "scale"),
    (dict(scale=0.5), TypeError, "scale"),
    (dict(ratio=(4 / 3, 3 / 4)), ValueError, "ratio"),
    (dict(ratio=(-1.0, 1.0)), ValueError, "ratio"),
    (dict(rank=2, world_size=2), ValueError, "rank"),
    (dict(rank=-1, world_size=2), ValueError, "rank"),
    (dict(rank=0, world_size=0), ValueError, "world_size"),
    (dict(dtype="int7"), ValueError, "dtype"),
    (dict(size=0), ValueError, "size"),
    (dict(size="224"), TypeError, "size"),
    (dict(resize_size=-1, transform="eval"), ValueError, "resize_size"),
    (dict(on_error="ignore"), ValueError, "on_error"),
    (dict(shuffle="yes"), TypeError, "shuffle"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed=1.0), TypeError, "seed"),
    (dict(device="tpu"), ValueError, "device"),
    (dict(cache="everything"), ValueError, "cache"),
    (dict(return_index=1), TypeError, "return_index"),
]


@pytest.mark.parametrize("kwargs,exc,name", BAD_ARGS,
                         ids=[next(iter(k)) + "=" + repr(v[0][next(iter(k))])
                              for k, v in ((a[0], a) for a in BAD_ARGS)])
def test_bad_argument_names_itself(small_folder, kwargs, exc, name):
    with pytest.raises(exc) as e:
        feedline.ImageLoader(small_folder, **kwargs)
    assert name in str(e.value), f"{exc.__name__} does not name {name!r}: {e.value}"


def test_missing_source(tmp_path):
    missing = str(tmp_path / "no" / "such" / "dir")
    with pytest.raises(FileNotFoundError) as e:
        feedline.ImageLoader(missing)
    assert missing in str(e.value)


def test_source_wrong_type():
    with pytest.raises(TypeError, match="source"):
        feedline.ImageLoader(42)


def test_valid_byte_sizes_accepted(small_folder):
    for budget in ("64MiB", "100 MB", 256 * 2**20, "auto", "1.5GiB"):
        feedline.ImageLoader(small_folder, batch_size=2, memory_budget=budget)


# --- bad files ------------------------------------------------------------------------------

def _drain(it, limit_s=30):
    """Consumes an iterator that may raise DataError: ([batches], [errors])."""
    batches, errors = [], []
    with util.deadline(limit_s, "draining an epoch with bad files"):
        while True:
            try:
                batches.append(next(it))
            except StopIteration:
                break
            except feedline.DataError as e:
                errors.append(e)
                if len(errors) > 50:
                    raise AssertionError("DataError repeats: the epoch does not move on")
    return batches, errors


def test_raise_names_each_bad_file(bad_folder):
    root, bad = bad_folder
    loader = feedline.ImageLoader(root, batch_size=1, shuffle=False, size=32,
                                  on_error="raise", return_index=True)
    n = len(loader.samples)
    batches, errors = _drain(iter(loader))
    assert len(errors) == len(bad)
    named = set()
    for e in errors:
        assert isinstance(e, feedline.DataError)
        hits = [p for p in bad if p in str(e)]
        assert len(hits) == 1, f"DataError does not name one bad file: {e}"
        named.add(hits[0])
    assert named == set(bad)
    # the epoch went on after each error: every good sample came out
    delivered = sorted(int(b[2][0]) for b in batches)
    bad_idx = {i for i, (p, _) in enumerate(loader.samples) if p in bad}
    assert delivered == sorted(set(range(n)) - bad_idx)


def test_raise_with_larger_batches_moves_on(bad_folder):
    root, bad = bad_folder
    loader = feedline.ImageLoader(root, batch_size=4, size=32, on_error="raise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches, errors = _drain(iter(loader))
    # Each error was raised at its batch: no warning that samples were replaced (there were
    # none: that is on_error="skip").
    assert not [w for w in caught if "replaced" in str(w.message)], [str(w.message) for w in caught]
    assert 1 <= len(errors) <= len(bad)
    for e in errors:
        assert any(p in str(e) for p in bad), str(e)
    assert len(batches) + len(errors) <= len(loader)
    # and the next epoch works as well
    batches2, errors2 = _drain(iter(loader))
    assert len(errors2) >= 1


def test_data_error_is_an_exception_class():
    assert issubclass(feedline.DataError, Exception)


def test_skip_keeps_batches_full(bad_folder):
    root, bad = bad_folder
    loader = feedline.ImageLoader(root, batch_size=5, size=32, on_error="skip",
                                  return_index=True)
    n = len(loader.samples)
    bad_idx = {i for i, (p, _) in enumerate(loader.samples) if p in bad}
    assert len(bad_idx) == 3
    for epoch in range(2):
        sizes = []
        # Replacements are never silent: counted in stats() and said once per epoch.
        with util.deadline(30, "an epoch with on_error='skip'"), pytest.warns(
                RuntimeWarning, match=r"3 sample\(s\) failed this epoch and were replaced .*"
                                      r"the first: .*: ") as said:
            for images, labels, idx in loader:
                sizes.append(int(images.shape[0]))
                for img, label, i in zip(images, labels.tolist(), idx.tolist()):
                    assert i not in bad_idx, "a failed sample was delivered"
                    assert label == loader.samples[i][1]
                    assert img.float().std() > 1.0  # a real picture, not a blank
        assert sizes == [5, 5, 5, 1]  # n = 16: full batches, as without errors
        assert len([w for w in said if "replaced" in str(w.message)]) == 1
        s = loader.stats()
        assert s["error_count"] == len(bad) * (epoch + 1)
        assert len(s["errors"]) == s["error_count"]
        assert {e["path"] for e in s["errors"]} == set(bad)
        for e in s["errors"]:
            assert e["cause"]
            assert loader.samples[e["sample"]][0] == e["path"]
            assert e["epoch"] in (0, 1)
    assert s["images"] == 2 * n


def test_image_over_pixel_limit(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32, max_image_pixels=50 * 50,
                                  shuffle=False)
    with util.deadline(30, "the pixel limit"):
        with pytest.raises(feedline.DataError) as e:
            next(iter(loader))
    assert os.path.join(small_folder, "x") in str(e.value)


def test_a_record_over_max_record_bytes_is_a_bad_sample_named(small_folder):
    """A file larger than max_record_bytes fails as its sample, before it is read whole; under
    on_error="skip" it is replaced and counted like any bad sample."""
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32, shuffle=False,
                                  max_record_bytes="1KiB")
    with util.deadline(30, "the record limit"):
        with pytest.raises(feedline.DataError, match="max_record_bytes") as e:
            next(iter(loader))
    assert small_folder in str(e.value)
    sizes = sorted(os.path.getsize(p) for p, _ in loader.samples)
    limit = sizes[len(sizes) // 2]
    skip = feedline.ImageLoader(small_folder, batch_size=4, size=32, shuffle=False,
                                max_record_bytes=limit, on_error="skip")
    with util.deadline(30, "an epoch"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = sum(b[0].shape[0] for b in skip)
    assert n == len(sizes)
    assert skip.stats()["error_count"] == sum(s > limit for s in sizes)
    with pytest.raises(ValueError, match="max_record_bytes"):
        feedline.ImageLoader(small_folder, max_record_bytes="lots")


def test_images_in_the_bomb_warning_band_are_counted_and_said_once(small_folder):
    """Between half of max_image_pixels and the limit, as PIL's DecompressionBombWarning band:
    decoded, counted in stats(), said once per loader with the first file; above, refused."""
    from PIL import Image
    # No head start: the next epoch's first decodes would add to the counts while one is read.
    loader = feedline.ImageLoader(small_folder, batch_size=8, size=32, shuffle=False,
                                  max_image_pixels=160 * 160, epoch_head_start=False)
    sizes = [Image.open(p).size for p, _ in loader.samples]
    large = [i for i, (w, h) in enumerate(sizes) if w * h > 160 * 160 // 2]
    assert 0 < len(large) < len(sizes)  # the fixture's 96..160 px straddle the band's edge
    with util.deadline(30, "two epochs"), pytest.warns(RuntimeWarning) as said:
        for _ in range(2):
            for _ in loader:
                pass
    bomb = [w for w in said if "DecompressionBombWarning" in str(w.message)]
    assert len(bomb) == 1
    assert f"{len(large)} image(s)" in str(bomb[0].message)
    assert loader.samples[large[0]][0] in str(bomb[0].message)
    counters = loader.stats()["transform"]
    assert counters["large_images"] == 2 * len(large)  # each decode, over the loader's life
    assert counters["first_large_image"] == large[0]
    quiet = feedline.ImageLoader(small_folder, batch_size=8, size=32)  # the default limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in quiet:
            pass
    assert quiet.stats()["transform"]["large_images"] == 0


def test_file_deleted_after_scan(tmp_path, small_folder):
    import shutil
    root = tmp_path / "ds"
    shutil.copytree(small_folder, root)
    loader = feedline.ImageLoader(str(root), batch_size=2, shuffle=False, size=32)
    victim = loader.samples[0][0]
    os.remove(victim)
    with util.deadline(30, "a file deleted after the scan"):
        with pytest.raises(feedline.DataError) as e:
            next(iter(loader))
    assert victim in str(e.value)


def test_names_with_control_characters_are_escaped_everywhere(tmp_path, small_folder):
    """A tar member or a file whose name holds a terminal escape or a newline: the DataError,
    stats()["errors"], the skip warning and `samples` show it escaped (\\x1b, \\x0a), so that a
    name from a shard cannot colour a terminal or forge a log line (before: raw in all but
    `samples`)."""
    import glob
    import warnings
    good = open(sorted(glob.glob(os.path.join(small_folder, "*", "*")))[0], "rb").read()
    evil = "ok\x1b[31mred\nline"
    util.write_tar(tmp_path / "evil.tar", [(f"{evil}.jpg", b"not an image"), (f"{evil}.cls", b"1"),
                                           ("good.jpg", good), ("good.cls", b"0")])
    folder = tmp_path / "folder" / "cls"
    folder.mkdir(parents=True)
    (folder / f"{evil}.jpg").write_bytes(b"not an image")
    (folder / "good.jpg").write_bytes(good)
    kw = dict(batch_size=1, size=32, resize_size=32, transform="eval", shuffle=False)
    for source in (str(tmp_path / "evil.tar"), str(tmp_path / "folder")):
        texts = []
        with pytest.raises(feedline.DataError) as e:
            list(feedline.ImageLoader(source, **kw))
        texts.append(str(e.value))
        skip = feedline.ImageLoader(source, on_error="skip", **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(skip)
        texts += [str(w.message) for w in caught]
        texts += [err["path"] + err["cause"] for err in skip.stats()["errors"]]
        texts += [path for path, _ in skip.samples]
        assert any("ok\\x1b[31mred\\x0aline.jpg" in t for t in texts[:1]), texts
        for t in texts:
            assert "\x1b" not in t and "red\nline" not in t, t
