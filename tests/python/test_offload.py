"""Offload to a Dask cluster: a LocalCluster of worker processes on loopback, started here.
Every batch once, in order, with the bytes of a local-only run; workers killed, a scheduler
killed, a worker that cannot make its batch, resume across offload on and off."""

import os
import signal
import warnings

import pytest
import torch

import feedline

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes of one thread each, on 127.0.0.1; torn down after the module."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  worker_dashboard_address=None) as c:
        with distributed.Client(c, set_as_default=False) as client:
            yield c, client


def _kwargs(**more):
    kw = dict(batch_size=4, seed=3, size=32, resize_size=40, workers=1, epoch_head_start=False)
    kw.update(more)
    return kw


def _epoch(loader):
    return [(x.clone(), y.clone(), i.clone()) for x, y, i in loader]


def _same(a, b):
    assert len(a) == len(b)
    for k, ((x1, y1, i1), (x2, y2, i2)) in enumerate(zip(a, b)):
        assert torch.equal(i1, i2), k
        assert torch.equal(y1, y2), k
        assert torch.equal(x1, x2), k


def test_same_bytes_as_local_every_batch_once_in_order(image_folder, cluster):
    _, client = cluster
    local = feedline.ImageLoader(image_folder, return_index=True, **_kwargs())
    off = feedline.ImageLoader(image_folder, return_index=True, offload=client, **_kwargs())
    for epoch in range(2):  # the second epoch with the share tuned by the first
        _same(_epoch(off), _epoch(local))
    st = off.stats()["offload"]
    assert st["batches_remote"] > 0 and st["batches_local"] > 0, st
    assert st["batches_remote"] + st["batches_local"] == 2 * len(local)
    assert st["bytes_received"] > 0
    # The scheduler's address works as well as a client.
    by_address = feedline.ImageLoader(image_folder, return_index=True,
                                      offload=cluster[0].scheduler_address, **_kwargs())
    _same(_epoch(by_address),
          _epoch(feedline.ImageLoader(image_folder, return_index=True, **_kwargs())))


def test_train_float32_and_skip_same_as_local(image_folder, tmp_path, cluster):
    _, client = cluster
    # A folder with broken files: on_error="skip" replaces them, the same way everywhere.
    import shutil
    root = tmp_path / "d"
    shutil.copytree(image_folder, root)
    files = sorted(p for p in (root / "cat").iterdir() if p.is_file())
    for k, path in enumerate(files[:2]):
        path.write_bytes(b"not an image %d" % k)
    kw = _kwargs(dtype="float32", on_error="skip", batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        local = _epoch(feedline.ImageLoader(str(root), return_index=True, **kw))
    off = feedline.ImageLoader(str(root), return_index=True, offload=client, **kw)
    for epoch in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            remote = _epoch(off)
        if epoch == 0:
            _same(remote, local)
        # Whichever side replaced them, the epoch says it once, with the count, and stats()
        # lists both files (the cluster's replacements count as the loader's).
        said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(said) == 1 and "2 sample(s) failed this epoch" in said[0], said
        st = off.stats()
        assert st["error_count"] == 2 * (epoch + 1), st["error_count"]
        named = " ".join(e["path"] for e in st["errors"])
        assert all(p.name in named for p in files[:2]), named


def test_a_data_error_reaches_its_batch(image_folder, tmp_path, cluster):
    _, client = cluster
    import shutil
    root = tmp_path / "d"
    shutil.copytree(image_folder, root)
    bad = sorted(p.name for p in (root / "Dog").iterdir() if p.is_file())[0]
    (root / "Dog" / bad).write_bytes(b"broken")
    kw = _kwargs(shuffle=False, batch_size=2)
    loader = feedline.ImageLoader(str(root), offload=client, **kw)
    local = feedline.ImageLoader(str(root), **kw)
    where = [k for k, (p, _) in enumerate(local.samples) if p.endswith(bad)][0] // 2
    for attempt in range(2):  # whichever side made it
        it = iter(loader)
        for b in range(len(loader)):
            if b == where:
                with pytest.raises(feedline.DataError, match=bad):
                    next(it)
            else:
                next(it)
        with pytest.raises(StopIteration):
            next(it)


def test_resume_across_offload_on_and_off(image_folder, cluster):
    _, client = cluster
    local = feedline.ImageLoader(image_folder, return_index=True, **_kwargs())
    whole = _epoch(local)
    off = feedline.ImageLoader(image_folder, return_index=True, offload=client, **_kwargs())
    it = iter(off)
    first = [tuple(t.clone() for t in next(it)) for _ in range(3)]
    state = off.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 3)
    del it
    # Off -> the rest made locally; on -> the rest made with the cluster.
    rest_local = feedline.ImageLoader(image_folder, return_index=True, **_kwargs())
    rest_local.load_state_dict(state)
    _same(first + _epoch(rest_local), whole)
    rest_off = feedline.ImageLoader(image_folder, return_index=True, offload=client, **_kwargs())
    rest_off.load_state_dict(state)
    _same(first + _epoch(rest_off), whole)
    # And a local state resumes on an offloading loader.
    local = feedline.ImageLoader(image_folder, return_index=True, **_kwargs())
    it = iter(local)
    for _ in range(2):
        next(it)
    state = local.state_dict()
    del it
    rest_off.load_state_dict(state)
    _same(whole[:2] + _epoch(rest_off), whole)


def test_a_killed_worker_loses_no_batch(image_folder):
    """SIGKILL to a worker while its batches are in flight: they are made again, once each."""
    kw = _kwargs(batch_size=2)
    whole = _epoch(feedline.ImageLoader(image_folder, return_index=True, **kw))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as c, \
            distributed.Client(c, set_as_default=False) as client:
        loader = feedline.ImageLoader(image_folder, return_index=True, offload=client, **kw)
        got = []
        for k, batch in enumerate(loader):
            got.append(tuple(t.clone() for t in batch))
            if k == 2:
                pids = [p for p in client.run(os.getpid).values()]
                os.kill(pids[0], signal.SIGKILL)
        _same(got, whole)


def test_a_scheduler_that_goes_falls_back_to_local(image_folder):
    kw = _kwargs(batch_size=2)
    whole = _epoch(feedline.ImageLoader(image_folder, return_index=True, **kw))
    c = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                 host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(c, set_as_default=False)
    loader = feedline.ImageLoader(image_folder, return_index=True, offload=client, **kw)
    got = []
    with pytest.warns(RuntimeWarning, match="making every batch locally"):
        for k, batch in enumerate(loader):
            got.append(tuple(t.clone() for t in batch))
            if k == 1:
                client.close()
                c.close()
    _same(got, whole)
    assert not loader.stats()["offload"]["active"]
    local = feedline.ImageLoader(image_folder, return_index=True, **kw)
    local.set_epoch(1)
    _same(_epoch(loader), _epoch(local))  # the next epoch: local only


def test_an_unreachable_scheduler_is_named(image_folder):
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        feedline.ImageLoader(image_folder, offload="tcp://127.0.0.1:9")
    with pytest.raises(ValueError, match="device='cpu'"):
        feedline.ImageLoader(image_folder, offload="tcp://127.0.0.1:9", device="cuda")
    with pytest.raises(TypeError, match="offload: expected a distributed.Client"):
        feedline.ImageLoader(image_folder, offload=8786)
