"""feedline.DataLoader(offload=): a LocalCluster of worker processes on loopback, started here.
The batches of a dataset that draws from torch's, Python's and numpy's RNGs are those of a
local run (the same bytes), each once, in order, wherever they were made; a sample's error
reaches its batch with its type; a worker killed, a scheduler gone, a resume across offload on
and off."""

import os
import random
import signal
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import feedline
import util

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  worker_dashboard_address=None) as c:
        with distributed.Client(c, set_as_default=False) as client:
            yield c, client


class Augmented(tud.Dataset):
    """A sample that takes a few ms and draws from all three global RNGs, as augmentations do;
    keys in `bad` raise KeyError."""

    def __init__(self, n=46, bad=(), delay=0.004):
        self.n, self.bad, self.delay = n, set(bad), delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"no sample {i} here")
        time.sleep(self.delay)
        noise = torch.rand(3, 6, 6) + random.random() + float(np.random.rand())
        return {"x": noise + i, "label": i, "id": torch.tensor([i], dtype=torch.uint8)}


def _loader(dataset, off=None, **kw):
    args = dict(batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(5))
    args.update(kw)
    return feedline.DataLoader(dataset, offload=off, **args)


def _epochs(loader, n=1):
    return [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(n)]


def _same(a, b):
    assert len(a) == len(b)
    for e, (ea, eb) in enumerate(zip(a, b)):
        assert len(ea) == len(eb), e
        for k, (x, y) in enumerate(zip(ea, eb)):
            assert x.keys() == y.keys()
            for name in x:
                assert x[name].dtype == y[name].dtype, (e, k, name)
                assert torch.equal(x[name], y[name]), (e, k, name)


def test_same_bytes_as_local_every_batch_once_in_order(cluster):
    _, client = cluster
    ds = Augmented()
    with util.deadline(120, "three epochs, local and offloaded"):
        local = _epochs(_loader(ds), 3)
        off = _loader(ds, client)
        got = _epochs(off, 3)
    _same(got, local)
    st = off.stats()["offload"]
    assert st["batches_remote"] > 0 and st["batches_local"] > 0, st
    # The first epoch's first batches (one per worker process) teach the layout, locally.
    assert st["batches_remote"] + st["batches_local"] + st["batches_remade"] == 3 * len(off) - 2
    assert st["bytes_received"] > 0


def test_every_batch_from_the_cluster_and_a_user_collate_fn(cluster):
    """Every batch leased, and whole batches of a collate_fn of the user's: the same bytes.
    Made here still: the first epoch's first batch per worker process, where they teach the
    layout for in-place collation, and a short last batch of samples in place (it is not one of
    the engine's full batches); whole batches are all leased."""
    _, client = cluster
    ds = Augmented(n=23)

    def collate(samples):
        return {"x": torch.stack([s["x"] for s in samples]) * 2,
                "id": torch.cat([s["id"] for s in samples])}

    for kw, remote in (({}, 2 * 5 - 2), ({"collate_fn": collate}, 2 * 6)):
        local = _epochs(_loader(ds, **kw), 2)
        off = _loader(ds, client, **kw)
        off._offload.local = False
        _same(_epochs(off, 2), local)
        assert off.stats()["offload"]["batches_remote"] == remote, kw


def test_a_sample_error_reaches_its_batch_with_its_type(cluster):
    _, client = cluster
    ds = Augmented(n=24, bad={13})
    for local_share in (False, True):
        loader = _loader(ds, client, shuffle=False)
        loader._offload.local = local_share
        it = iter(loader)
        got = []
        for b in range(len(loader)):
            if b == 3:
                with pytest.raises(KeyError, match="no sample 13 here"):
                    next(it)
            else:
                got.append(next(it)["label"].tolist())
        assert got == [list(range(4 * b, 4 * b + 4)) for b in range(6) if b != 3]
        with pytest.raises(StopIteration):
            next(it)


def test_resume_across_offload_on_and_off(cluster):
    _, client = cluster
    ds = Augmented()
    whole = _epochs(_loader(ds), 2)
    off = _loader(ds, client)
    _epochs(off)  # epoch 0
    it = iter(off)
    first = [{k: v.clone() for k, v in next(it).items()} for _ in range(3)]
    state = off.state_dict()
    del it
    rest_local = _loader(ds)
    rest_local.load_state_dict(state)
    _same([first + _epochs(rest_local)[0]], [whole[1]])
    rest_off = _loader(ds, client)
    rest_off.load_state_dict(state)
    _same([first + _epochs(rest_off)[0]], [whole[1]])


def test_a_killed_worker_loses_no_batch():
    """SIGKILL to a Dask worker while its leases are in flight: their batches are made again
    (in this process, seeded as the worker would be), once each, with the same bytes."""
    ds = Augmented(n=60, delay=0.01)
    whole = _epochs(_loader(ds))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as c, \
            distributed.Client(c, set_as_default=False) as client, \
            util.deadline(120, "an epoch with a worker killed"):
        loader = _loader(ds, client)
        loader._offload.local = False
        got = []
        for k, batch in enumerate(loader):
            got.append({n: v.clone() for n, v in batch.items()})
            if k == 3:
                pids = list(client.run(os.getpid).values())
                os.kill(pids[0], signal.SIGKILL)
        _same([got], whole)
        st = loader.stats()["offload"]
        assert st["batches_remote"] + st["batches_remade"] == len(loader) - 2, st


def test_a_scheduler_that_goes_falls_back_to_local():
    ds = Augmented(n=40)
    whole = _epochs(_loader(ds), 2)
    c = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                 host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(c, set_as_default=False)
    loader = _loader(ds, client)
    got = []
    with util.deadline(120, "an epoch whose scheduler goes"), \
            pytest.warns(RuntimeWarning, match="making every batch locally"):
        for k, batch in enumerate(loader):
            got.append({n: v.clone() for n, v in batch.items()})
            if k == 3:
                client.close()
                c.close()
    _same([got, _epochs(loader)[0]], whole)  # the next epoch: local only
    assert not loader.stats()["offload"]["active"]


def test_what_offload_needs_is_said():
    ds = Augmented()
    for kw, words in (({"num_workers": 0}, "num_workers=0"),
                      ({"executor": "thread"}, "executor='thread'"),
                      ({"on_error": "skip"}, "on_error='raise' only")):
        with pytest.raises(ValueError, match=words):
            _loader(ds, "tcp://127.0.0.1:9", **kw)

    class Stream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="map-style"):
        feedline.DataLoader(Stream(), offload="tcp://127.0.0.1:9")
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        _loader(ds, "tcp://127.0.0.1:9")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="offload: expected a distributed.Client"):
            _loader(ds, 8786)


def test_keys_worker_processes_cannot_take_are_refused(cluster):
    """A sampler of string keys: the automatic executor would choose worker threads, which
    offload cannot pair with; refused at iter(), naming why."""
    class Named(tud.Dataset):
        def __getitem__(self, key):
            return torch.zeros(2)

        def __len__(self):
            return 4

    loader = feedline.DataLoader(Named(), sampler=["a", "b", "c", "d"], batch_size=2,
                                 num_workers=1, offload=cluster[1])
    with pytest.raises(TypeError, match="offload: .*int sample keys"):
        next(iter(loader))


def test_the_next_epochs_first_batches_are_leased_ahead(cluster):
    """Near an epoch's end the next epoch's order is foreseen (drawn on a copy of torch's RNG
    states) and the cluster makes its first batches ahead: taken over when iter() draws that
    order; dropped when it draws another (a training step drew from torch's RNG), with the
    batches still a local run's."""
    _, client = cluster
    ds = Augmented(n=40)
    local = _epochs(_loader(ds), 3)
    off = _loader(ds, client)
    off._offload.local = False  # every batch leased: the cluster runs out of this epoch's
    _same(_epochs(off, 3), local)
    assert off.stats()["offload"]["batches_ahead"] > 0
    # A loop whose steps draw from torch's RNG: what was leased ahead on the old state is not
    # this order's (or is leased again on the new one at the epoch's end).
    def drawing(loader):
        out = []
        for _ in range(3):
            epoch = []
            for b in loader:
                epoch.append({k: v.clone() for k, v in b.items()})
                torch.rand(3)
            out.append(epoch)
        return out

    torch.manual_seed(1)
    reference = drawing(_loader(ds, generator=None))  # the order from torch's global RNG
    torch.manual_seed(1)
    again = _loader(ds, client, generator=None)
    again._offload.local = False
    _same(drawing(again), reference)
