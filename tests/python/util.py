"""Helpers shared by the feedline pytest suite: image makers, a deadline guard, process probes."""

import contextlib
import io
import math
import os
import signal
import tarfile
import time

import numpy as np
from PIL import Image


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------

def photo_like(width, height, seed, noise=6.0):
    """An RGB uint8 array [height, width, 3] that looks like a photo to a codec and a resampler:
    smooth gradients, a few soft blobs and edges, plus mild Gaussian noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    xn, yn = x / max(width - 1, 1), y / max(height - 1, 1)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * (a * xn + b * yn) + 25 * np.sin(2 * math.pi * (xn * (1 + c) + p))
    for _ in range(4):  # soft blobs
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(0.08, 0.3) * min(width, height)
        amp = rng.uniform(-70, 70, 3)
        g = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        img += g[..., None] * amp
    # one hard edge (a rectangle), as objects have
    x0, y0 = int(rng.uniform(0, width * 0.6)), int(rng.uniform(0, height * 0.6))
    img[y0:y0 + height // 4, x0:x0 + width // 4] += rng.uniform(-50, 50, 3)
    img += rng.normal(0, noise, img.shape)
    return np.clip(img, 0, 255).round().astype(np.uint8)


def save_jpeg(path, array_or_image, quality=90, **kwargs):
    """Writes a JPEG with PIL; returns the path."""
    im = array_or_image if isinstance(array_or_image, Image.Image) else Image.fromarray(
        array_or_image)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    im.save(path, format="JPEG", quality=quality, **kwargs)
    return path


def coord_image(width, height):
    """An RGB image that encodes its own coordinates: R = x gradient (0 at x=0 .. 255 at
    x=width-1), G = y gradient, B = 128."""
    x = np.linspace(0, 255, width, dtype=np.float64)
    y = np.linspace(0, 255, height, dtype=np.float64)
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = np.round(x)[None, :]
    img[..., 1] = np.round(y)[:, None]
    img[..., 2] = 128
    return img


def estimate_crop(image_chw, src_w, src_h):
    """From one output image of a coordinate image, estimates the crop box in source pixels.

    Returns (x0, y0, w, h, flipped). A least-squares line through the mean R value of each
    output column (x = a + b * column) gives the box's width as |b| * out_w; flipped when b < 0.
    The same on G over the rows gives the height."""
    img = image_chw.astype(np.float64)
    out_h, out_w = img.shape[1], img.shape[2]
    col_x = img[0].mean(axis=0) * (src_w - 1) / 255.0  # source x of each output column
    row_y = img[1].mean(axis=1) * (src_h - 1) / 255.0  # source y of each output row
    j = np.arange(out_w) + 0.5
    i = np.arange(out_h) + 0.5
    bx, ax = np.polyfit(j, col_x, 1)
    by, ay = np.polyfit(i, row_y, 1)
    w = abs(bx) * out_w
    h = abs(by) * out_h
    left = min(ax, ax + bx * out_w)
    top = ay
    return left, top, w, h, bx < 0


# --------------------------------------------------------------------------------------------
# Process probes and guards
# --------------------------------------------------------------------------------------------

def thread_count():
    """OS threads of this process (C++ threads included)."""
    return len(os.listdir("/proc/self/task"))


def wait_thread_count(at_most, timeout=3.0):
    """Polls until the process has at most `at_most` threads; returns the last count."""
    deadline = time.monotonic() + timeout
    n = thread_count()
    while n > at_most and time.monotonic() < deadline:
        time.sleep(0.02)
        n = thread_count()
    return n


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class DeadlineExceeded(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds, what="operation"):
    """Raises DeadlineExceeded in the main thread when the block runs longer than `seconds`.
    feedline's blocking calls poll for signals, so a hang (deadlock) becomes a test failure."""
    def on_alarm(signum, frame):
        raise DeadlineExceeded(f"{what} did not finish within {seconds} s (deadlock?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def collect_epoch(loader):
    """One epoch of a return_index=True loader as (images uint8 numpy list, labels, indices)."""
    images, labels, indices = [], [], []
    for x, y, idx in loader:
        images.append(x.numpy().copy())
        labels.append(y.numpy().copy())
        indices.append(idx.numpy().copy())
    return images, labels, indices


# --------------------------------------------------------------------------------------------
# WebDataset shards
# --------------------------------------------------------------------------------------------

def write_tar(path, members):
    """A tar file of `members`: (name, bytes) pairs, in order (a WebDataset shard)."""
    with tarfile.open(path, "w") as tar:
        for name, blob in members:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
