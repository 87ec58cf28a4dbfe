"""Scale-out: WebDataset tar shards, rank sharding under torch.distributed (two real gloo
ranks), exact resume from state_dict."""

import io
import json
import os
import socket
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch

import feedline
import util


def _shards(root, folder, per_shard=10):
    """Writes the samples of `folder` (an ImageFolder) as WebDataset shards; returns the
    brace pattern, the shard paths and the expected (key, label) list in shard order."""
    ds = feedline.ImageLoader(folder, batch_size=1)
    samples = ds.samples
    paths = []
    expected = []
    for s in range(0, len(samples), per_shard):
        path = os.path.join(root, f"train-{s // per_shard:06d}.tar")
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for i, (p, label) in enumerate(samples[s:s + per_shard]):
                key = f"sample{s + i:05d}"
                for name, data in ((f"{key}.jpg", open(p, "rb").read()),
                                   (f"{key}.cls", str(label).encode()),
                                   (f"{key}.json", b"{}")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                expected.append((f"{path}:{key}.jpg", label))
        paths.append(path)
    pattern = os.path.join(root, "train-{%06d..%06d}.tar" % (0, len(paths) - 1))
    return pattern, paths, expected


def test_tar_shards_give_the_same_pixels_as_the_folder(tmp_path, small_folder):
    pattern, paths, expected = _shards(str(tmp_path), small_folder)
    kw = dict(batch_size=5, size=48, resize_size=56, transform="eval", shuffle=False,
              return_index=True)
    from_tar = feedline.ImageLoader(pattern, **kw)
    assert [tuple(s) for s in from_tar.samples] == expected
    assert from_tar.classes == []
    listed = feedline.ImageLoader(paths, **kw)  # a list of shard paths works too
    assert [tuple(s) for s in listed.samples] == expected
    from_dir = feedline.ImageLoader(small_folder, **kw)
    for (a, la, ia), (b, lb, ib) in zip(from_tar, from_dir):
        assert torch.equal(a, b) and torch.equal(la, lb) and torch.equal(ia, ib)


def test_malformed_tar_names_the_shard_and_offset(tmp_path, small_folder):
    pattern, paths, _ = _shards(str(tmp_path), small_folder)
    with tarfile.open(paths[1]) as tar:
        header = tar.getmembers()[4].offset  # a later member's header
    data = bytearray(open(paths[1], "rb").read())
    data[header + 10] ^= 0x5A  # its name changes: the checksum no longer matches
    open(paths[1], "wb").write(bytes(data))
    with pytest.raises(feedline.DataError, match=r"train-000001\.tar.*offset %d" % header):
        feedline.ImageLoader(pattern, batch_size=4)
    with open(paths[0], "r+b") as f:  # a member that runs past the end
        f.truncate(2000)
    with pytest.raises(feedline.DataError, match=r"train-000000\.tar.*offset"):
        feedline.ImageLoader(paths[0], batch_size=4)


def test_bad_brace_pattern_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="brace"):
        feedline.ImageLoader(str(tmp_path / "x-{000..abc}.tar"), batch_size=4)


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (3, 5)])
def test_resume_mid_epoch_gives_the_same_batches(small_folder, workers, prefetch):
    kw = dict(batch_size=4, size=32, seed=17, return_index=True)
    ref = feedline.ImageLoader(small_folder, workers=2, prefetch=2, **kw)
    next(iter(ref))  # epoch 0 (partly)
    epoch1 = [(x.clone(), i.clone()) for x, _, i in ref]  # epoch 1, in full
    run = feedline.ImageLoader(small_folder, workers=2, prefetch=2, **kw)
    run.set_epoch(1)
    it = iter(run)
    for _ in range(3):
        next(it)
    state = run.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 3
    json.dumps(state)  # plain Python types: fits in a checkpoint
    del it
    assert run.state_dict()["batches_done"] == 3  # still known after the loop broke off
    resumed = feedline.ImageLoader(small_folder, workers=workers, prefetch=prefetch, **kw)
    resumed.load_state_dict(state)
    rest = [(x.clone(), i.clone()) for x, _, i in resumed]
    assert len(rest) == len(epoch1) - 3
    for (a, ia), (b, ib) in zip(rest, epoch1[3:]):
        assert torch.equal(ia, ib) and torch.equal(a, b)
    # After the resumed epoch, the next one is epoch 2, as for the uninterrupted run.
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["batches_done"] == 0


def test_state_of_another_run_is_refused(small_folder, image_folder):
    a = feedline.ImageLoader(small_folder, batch_size=4, seed=1)
    state = a.state_dict()
    with pytest.raises(ValueError, match="data set"):
        feedline.ImageLoader(image_folder, batch_size=4, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        feedline.ImageLoader(small_folder, batch_size=4, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size"):
        feedline.ImageLoader(small_folder, batch_size=4, seed=1, rank=0,
                             world_size=2).load_state_dict(state)
    feedline.ImageLoader(small_folder, batch_size=4, seed=1, rank=0,
                         world_size=2).load_state_dict(state, resplit=True)
    with pytest.raises(ValueError, match="missing key"):
        a.load_state_dict({"epoch": 0})
    with pytest.raises(TypeError):
        a.load_state_dict([1, 2])


@pytest.mark.parametrize("key,value,error", [
    ("batch_size", -4, ValueError), ("batch_size", 0, ValueError), ("world_size", -1, ValueError),
    ("world_size", 0, ValueError), ("rank", 5, ValueError), ("rank", -1, ValueError),
    ("batches_done", -3, ValueError), ("batches_done", 10**6, ValueError),
    ("batch_size", 2**63, ValueError), ("world_size", 2**40, ValueError),
    ("epoch", -1, ValueError), ("batch_size", "4", TypeError), ("shuffle", 1, TypeError),
    ("batches_done", True, TypeError), ("dataset_fingerprint", 7, TypeError)])
@pytest.mark.parametrize("resplit", [False, True])
def test_every_field_of_a_state_is_validated(small_folder, key, value, error, resplit):
    """A state is a file anyone who can write the checkpoint hands in: a negative batch or
    world size, or values whose product overflows, once crashed the resplit path."""
    a = feedline.ImageLoader(small_folder, batch_size=4, seed=1)
    state = a.state_dict()
    state[key] = value
    b = feedline.ImageLoader(small_folder, batch_size=2, seed=1, rank=1, world_size=2)
    with pytest.raises(error, match=key):
        b.load_state_dict(state, resplit=resplit)
    assert len(list(b)) == len(b)  # the loader is unharmed


def test_a_state_of_another_rank_is_refused_without_resplit(small_folder):
    a = feedline.ImageLoader(small_folder, batch_size=2, seed=1, rank=0, world_size=2)
    state = a.state_dict()
    b = feedline.ImageLoader(small_folder, batch_size=2, seed=1, rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank"):
        b.load_state_dict(state)
    b.load_state_dict(state, resplit=True)


_RANK_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
import feedline
dist.init_process_group("gloo")
loader = feedline.ImageLoader(sys.argv[1], batch_size=3, size=32, seed=4, return_index=True,
                              drop_last=sys.argv[3] == "1")
seen = [int(i) for _, _, idx in loader for i in idx]
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "len": len(loader),
       "loader_rank": loader.rank, "loader_world": loader.world_size, "seen": seen}
# Every rank must have the same batch count, or the collective below would hang.
for _ in range(len(loader)):
    dist.barrier()
json.dump(out, open(os.path.join(sys.argv[2], "rank%d.json" % dist.get_rank()), "w"))
dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_gloo_ranks_get_disjoint_complete_equal_shards(tmp_path, small_folder, drop_last):
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, str(script), small_folder, str(tmp_path), "1" if drop_last else "0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    r = [json.load(open(tmp_path / f"rank{k}.json")) for k in range(2)]
    assert [x["loader_rank"] for x in r] == [0, 1]  # taken from torch.distributed
    assert all(x["loader_world"] == 2 for x in r)
    assert r[0]["len"] == r[1]["len"]
    assert len(r[0]["seen"]) == len(r[1]["seen"])
    a, b = set(r[0]["seen"]), set(r[1]["seen"])
    assert not (a & b)  # 26 samples split evenly: nothing repeated, nothing shared
    if drop_last:
        assert len(r[0]["seen"]) == 12  # 13 per rank, cut to whole batches of 3
    else:
        assert a | b == set(range(26))
