"""pytorch/examples' imagenet/main.py data path with its two DataLoader calls renamed to
feedline.DataLoader: single process and 2 ranks (gloo), ImageFolder and --dummy (FakeData).
The same batches, samples and validation coverage as with torch's DataLoader."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

SCRIPT = os.path.join(os.path.dirname(__file__), "imagenet_example.py")


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(3)
    for split, per_class in (("train", 6), ("val", 5)):  # val: 21 images, not a multiple of 2
        for c in range(4):
            d = root / split / f"n0{c}"
            d.mkdir(parents=True)
            for i in range(per_class + (split == "val" and c == 0)):
                a = rng.integers(0, 256, (rng.integers(180, 300), rng.integers(180, 300), 3),
                                 dtype=np.uint8)
                Image.fromarray(a).save(d / f"{i}.jpg", quality=90)
    return str(root)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(data, loader, world, dummy):
    cmd = [sys.executable, SCRIPT, data, "--loader", loader, "--world-size", str(world),
           "--dist-url", f"tcp://127.0.0.1:{_port()}"] + (["--dummy"] if dummy else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("result "):
            f = dict(w.split("=") for w in line.split()[1:])
            results[int(f.pop("rank"))] = f
    assert sorted(results) == list(range(world)), out.stdout
    return results


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("dummy", [False, True])
def test_imagenet_main_runs_with_feedline_dataloader(imagenet_dir, world, dummy):
    ref = run(imagenet_dir, "torch", world, dummy)
    got = run(imagenet_dir, "feedline", world, dummy)
    for rank in range(world):
        executor = got[rank].pop("executor")
        assert executor in ("thread", "process")
        ref[rank].pop("executor")
        assert got[rank] == ref[rank]
    # validation saw every sample once over all ranks (DistributedSampler + the aux loader)
    assert int(got[0]["val_samples"]) == (37 if dummy else 21)
    if dummy:  # FakeData reseeds torch's global RNG per sample: threads would race on it
        assert executor == "process"
