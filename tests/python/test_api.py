"""The Python surface: tensors, stats(), build_info(), properties."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

import feedline
import util


# --- tensors --------------------------------------------------------------------------------

def test_default_tensors(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=16)
    n = len(loader.samples)
    seen = 0
    for k, (images, labels) in enumerate(loader):
        b = 16 if k < len(loader) - 1 else n - 16 * k
        assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)
        assert images.dtype == torch.uint8 and images.shape == (b, 3, 224, 224)
        assert labels.dtype == torch.int64 and labels.shape == (b,)
        assert images.device.type == "cpu" and labels.device.type == "cpu"
        assert images.is_contiguous() and labels.is_contiguous()
        assert 0 <= int(labels.min()) and int(labels.max()) < len(loader.classes)
        assert images.float().std() > 5  # pictures, not blank memory
        seen += b
    assert seen == n


def test_return_index_tensors(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=8, size=32, return_index=True)
    for images, labels, idx in loader:
        assert idx.dtype == torch.int64 and idx.shape == labels.shape
        assert labels.tolist() == [loader.samples[i][1] for i in idx.tolist()]


def test_grayscale_gives_equal_channels(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=8, transform="eval", shuffle=False,
                                  size=64, resize_size=72, return_index=True)
    gray = set()
    for i, (path, _) in enumerate(loader.samples):
        with Image.open(path) as im:
            if im.mode == "L":
                gray.add(i)
    assert len(gray) == 4
    found = 0
    for images, _, idx in loader:
        for img, i in zip(images, idx.tolist()):
            if i in gray:
                found += 1
                assert torch.equal(img[0], img[1]) and torch.equal(img[1], img[2])
    assert found == len(gray)


def test_tensors_are_writable_in_place(small_folder):
    """Batches are the consumer's memory: in-place ops work and do not disturb later batches."""
    kw = dict(batch_size=4, size=32, seed=13, prefetch=2, workers=2)
    ref_loader = feedline.ImageLoader(small_folder, **kw)
    reference = [(x.clone(), y.clone()) for x, y in ref_loader]
    loader = feedline.ImageLoader(small_folder, **kw)
    for (x, y), (rx, ry) in zip(loader, reference):
        assert torch.equal(x, rx) and torch.equal(y, ry)
        x.mul_(0).add_(7)            # in-place ops on the batch's memory
        x[:, 1] = 200
        y.zero_()
        assert int(x[0, 0, 0, 0]) == 7 and int(x[0, 1, 5, 5]) == 200
        assert int(y.abs().sum()) == 0
    # the next epoch (reusing the ring) is unaffected by the scribbles: compare with a fresh
    # loader's second epoch
    for _ in ref_loader:
        pass
    second_ref = None
    ref2 = feedline.ImageLoader(small_folder, **kw)
    ref2.set_epoch(1)
    second_ref = [(x.clone(), y.clone()) for x, y in ref2]
    for (x, y), (rx, ry) in zip(loader, second_ref):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_numpy_view_shares_memory(small_folder):
    """The tensor is a view of the batch (DLPack, no copy): numpy sees in-place writes."""
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32)
    x, _ = next(iter(loader))
    a = x.numpy()
    x[0, 0, 0, 0] = 123
    assert a[0, 0, 0, 0] == 123
    a[0, 0, 0, 1] = 45
    assert int(x[0, 0, 0, 1]) == 45


# --- stats ----------------------------------------------------------------------------------

STAT_KEYS = {"images_per_s", "stages", "workers", "prefetch", "bottleneck", "images",
             "batches", "errors", "error_count"}


def test_stats_after_epochs(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=8, size=64)
    before = loader.stats()
    assert STAT_KEYS <= set(before)
    assert before["images"] == 0 and before["batches"] == 0
    delivered = batches = 0
    for _ in range(2):
        for x, _ in loader:
            delivered += int(x.shape[0])
            batches += 1
    s = loader.stats()
    assert STAT_KEYS <= set(s)
    assert s["images"] == delivered == 2 * len(loader.samples)
    assert s["batches"] == batches
    assert s["images_per_s"] > 0 and math.isfinite(s["images_per_s"])
    stages = s["stages"]
    for name in ("read", "decode", "consumer"):
        assert name in stages, f"stats()['stages'] lacks {name!r}: {list(stages)}"
        assert stages[name]["busy_s"] >= 0
    assert stages["decode"]["busy_s"] > 0
    assert stages["decode"]["items"] >= delivered
    assert stages["read"]["items"] >= delivered
    assert isinstance(s["workers"], int) and s["workers"] >= 1
    assert isinstance(s["prefetch"], int) and s["prefetch"] >= 1
    assert s["bottleneck"] in ("storage", "decode", "consumer", "copy", "unknown")
    assert s["error_count"] == 0 and s["errors"] == []
    # each epoch's first batch is waited for (the pipeline fills up): part of the consumer's wait
    assert 0 < s["epoch_start_wait_s"] <= s["consumer_wait_s"]
    assert s["consumer_wait_fraction"] == pytest.approx(s["consumer_wait_s"] / s["elapsed_s"],
                                                        rel=0.05)


def test_stats_speak_samples_and_the_image_loader_adds_images(image_folder):
    """The engine's words are a workload's-neutral samples and map stage; ImageLoader says the
    same figures in images too, and calls its map stage "decode"."""
    data = list(range(64))
    generic = feedline.DataLoader(data, batch_size=8, num_workers=2)
    for _ in range(2):
        for _ in generic:
            pass
    g = generic.stats()
    # Over the loader's life, although its first batches (made whole in the worker processes,
    # to learn the layout) ran on an engine run of their own.
    assert g["samples"] == 128 and g["batches"] == 16 and g["samples_per_s"] > 0
    assert {"read", "map", "consumer"} <= set(g["stages"]) and "decode" not in g["stages"]
    assert g["stages"]["map"]["items"] >= 16  # positions: a sample, or a batch made whole
    assert g["stages"]["consumer"]["items"] == 16
    assert g["bottleneck"] in ("storage", "map", "consumer", "copy", "unknown")
    assert "images" not in g and "images_per_s" not in g and "decode_ms_per_image" not in g
    assert "map_ms_per_sample" in g and "demand_samples_per_s" in g

    loader = feedline.ImageLoader(image_folder, batch_size=8, size=64)
    for _ in loader:
        pass
    s = loader.stats()
    for sample_word, image_word in (("samples", "images"), ("samples_per_s", "images_per_s"),
                                    ("demand_samples_per_s", "demand_images_per_s"),
                                    ("map_ms_per_sample", "decode_ms_per_image")):
        assert s[image_word] == s[sample_word]
    assert "decode" in s["stages"] and "map" not in s["stages"]
    assert s["bottleneck"] != "map"
    for event in s["tuning"] + s["timeline"]:
        assert event["images_per_s"] == event["samples_per_s"]


def test_stats_count_only_delivered_images(image_folder):
    """Prefetched batches the consumer never took are not 'delivered'."""
    loader = feedline.ImageLoader(image_folder, batch_size=4, size=64, prefetch=6, workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    import time
    time.sleep(0.3)  # let the workers fill the ring
    s = loader.stats()
    assert s["images"] == 12 and s["batches"] == 3
    del it


def test_fixed_resources_are_reported(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32, workers=3, prefetch=5)
    assert loader.workers == 3 and loader.prefetch == 5
    for _ in loader:
        pass
    s = loader.stats()
    assert s["workers"] == 3 and s["prefetch"] == 5


def test_len_and_repr(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4)
    assert len(loader) == math.ceil(26 / 4)
    assert loader.num_samples == 26
    assert "ImageLoader" in repr(loader)
    it = iter(loader)
    assert len(it) == len(loader)
    del it


# --- build_info -----------------------------------------------------------------------------

def test_build_info():
    info = feedline.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["cuda_compiled"], bool)
    assert feedline.__version__ == info["version"]


def test_cuda_request_without_cuda_is_clear(small_folder):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    import time
    start = time.monotonic()
    with pytest.raises(feedline.DeviceError, match="no CUDA device/driver|no CUDA path"):
        feedline.ImageLoader(small_folder, device="cuda")
    assert time.monotonic() - start < 1.0  # fails at once, not after a hang
    with pytest.raises(ValueError, match="device"):
        feedline.ImageLoader(small_folder, device="gpu")


def test_device_error_is_not_a_data_error():
    """A dead GPU must not be swallowed by `except feedline.DataError: continue`."""
    assert issubclass(feedline.DeviceError, RuntimeError)
    assert not issubclass(feedline.DeviceError, feedline.DataError)
    assert not issubclass(feedline.DataError, feedline.DeviceError)


def test_cuda_means_torchs_current_device(small_folder, monkeypatch):
    """device="cuda" is torch's current device (torchrun: torch.cuda.set_device(local_rank)),
    not GPU 0: resolved through torch when torch has CUDA (faked here: no GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    with pytest.raises(feedline.DeviceError, match="cuda:3"):
        feedline.ImageLoader(small_folder, device="cuda")
    with pytest.raises(feedline.DeviceError, match="cuda:1"):  # explicit indices stay
        feedline.ImageLoader(small_folder, device="cuda:1")


# --- documented in DESIGN.md, not (yet) in the package ------------------------------------------

def test_state_dict_resumes_mid_epoch(small_folder):
    kw = dict(batch_size=4, size=32, seed=17, return_index=True)
    ref = feedline.ImageLoader(small_folder, **kw)
    full = [idx.tolist() for _, _, idx in ref]
    loader = feedline.ImageLoader(small_folder, **kw)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    resumed = feedline.ImageLoader(small_folder, **kw)
    resumed.load_state_dict(state)
    rest = [idx.tolist() for _, _, idx in resumed]
    assert rest == full[3:]


def test_save_trace_writes_chrome_trace(small_folder, tmp_path):
    """save_trace() (DESIGN.md): Chrome trace format, with complete events for the work done."""
    import json
    import pathlib
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32)
    for _ in loader:
        pass
    path = tmp_path / "trace.json"
    loader.save_trace(pathlib.Path(path))  # a path-like is accepted
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert isinstance(events, list) and events
    for e in events:
        assert "name" in e and "ph" in e and "pid" in e
        if e["ph"] == "X":  # complete events: a start and a duration, in microseconds
            assert e["ts"] >= 0 and e["dur"] >= 0 and "tid" in e
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) >= len(loader)  # at least one event per batch
