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


def _dicts(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def _same_dicts(a, b):
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), k
        for name in x:
            assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), (k, name)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """Documents of 1..300 words and a SentencePiece model trained on them (spm_train)."""
    import shutil
    import subprocess
    if shutil.which("spm_train") is None:
        pytest.skip("spm_train missing")
    import numpy as np
    d = tmp_path_factory.mktemp("offload_text")
    rng = np.random.default_rng(5)
    words = ["".join(rng.choice(list("abcdefghiklmnoprstuvz"), size=int(rng.integers(2, 8))))
             for _ in range(300)] + ["café", "東京", "naïve"]
    docs = [" ".join(rng.choice(words, size=int(rng.integers(1, 300)))) for _ in range(150)]
    (d / "docs.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    subprocess.run(["spm_train", f"--input={d / 'docs.txt'}", f"--model_prefix={d / 'm'}",
                    "--vocab_size=200", "--hard_vocab_limit=false", "--pad_id=3",
                    "--minloglevel=2"], check=True, capture_output=True)
    return d


def test_text_and_token_batches_same_as_local(text_corpus, tmp_path, monkeypatch, cluster):
    """Padded text and token windows (a mixture of two files, named by paths relative to the
    trainer's directory, which a worker does not share) with offload: every batch once, in
    order, with a local run's tensors; the cluster made some of them."""
    import numpy as np
    _, client = cluster
    monkeypatch.chdir(text_corpus)
    kw = dict(tokenizer="m.model", batch_size=8, max_length=96, add_eos=True, seed=4,
              workers=1, return_index=True, epoch_head_start=False)
    local = feedline.TextLoader("docs.txt", **kw)
    off = feedline.TextLoader("docs.txt", offload=client, **kw)
    for _ in range(2):
        _same_dicts(_dicts(off), _dicts(local))
    st = off.stats()["offload"]
    assert st["batches_remote"] > 0 and st["batches_remote"] + st["batches_local"] == 2 * len(
        local), st
    for k, n in enumerate((40_000, 25_000)):
        np.random.default_rng(k).integers(0, 50_000, n).astype("uint16").tofile(f"t{k}.bin")
    mix = feedline.Mix([("t0.bin", 0.7), ("t1.bin", 0.3)])
    kw = dict(seq_len=63, batch_size=16, seed=2, workers=1, return_index=True,
              epoch_head_start=False)
    local = feedline.TokenLoader(mix, **kw)
    off = feedline.TokenLoader(mix, offload=cluster[0].scheduler_address, **kw)
    whole = _dicts(local)
    _same_dicts(_dicts(off), whole)
    assert off.stats()["offload"]["batches_remote"] > 0
    # Delivered counts by source cover every batch, wherever it was made ("read" counts this
    # process's reads: the cluster read the rest).
    def delivered(loader):
        return [(s["delivered"], s["per_epoch"]) for s in loader.stats()["mix"]["sources"]]
    assert delivered(off) == delivered(local)
    # A resume across offload on and off (in epoch 1).
    it = iter(off)
    first = [{k: v.clone() for k, v in next(it).items()} for _ in range(3)]
    state = off.state_dict()
    del it
    rest = feedline.TokenLoader(mix, **kw)
    rest.load_state_dict(state)
    assert (state["epoch"], state["batches_done"]) == (1, 3)
    local.set_epoch(1)
    _same_dicts(first + _dicts(rest), _dicts(local))


def test_packed_rows_are_not_offloaded(text_corpus):
    model = str(text_corpus / "m.model")
    with pytest.raises(ValueError, match="offload: padded batches only"):
        feedline.TextLoader(str(text_corpus / "docs.txt"), model, pack="concat", seq_len=64,
                            offload="tcp://127.0.0.1:9")
    with pytest.raises(ValueError, match="offload: padded batches only"):
        feedline.TextLoader(str(text_corpus / "docs.txt"), model, bucket=True,
                            offload="tcp://127.0.0.1:9")
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        feedline.TextLoader(str(text_corpus / "docs.txt"), model, offload="tcp://127.0.0.1:9")


def test_the_next_epochs_first_batches_are_made_ahead(image_folder, cluster):
    """Once an epoch has no more batches for the cluster, it makes the next epoch's first ones:
    taken over by that epoch (the same bytes), dropped when set_epoch or a resume chooses
    another place."""
    _, client = cluster
    kw = _kwargs(batch_size=2)
    off = feedline.ImageLoader(image_folder, return_index=True, offload=client, **kw)
    off._offload.local = False  # every batch leased: the cluster runs out of this epoch's

    def local(epoch, skip=0):
        ref = feedline.ImageLoader(image_folder, return_index=True, **kw)
        ref.set_epoch(epoch)
        return _epoch(ref)[skip:]

    _same(_epoch(off), local(0))
    _same(_epoch(off), local(1))
    assert off.stats()["offload"]["batches_ahead"] > 0
    ahead = off._offload.ahead
    assert ahead is not None and ahead[0] == 2, ahead
    off.set_epoch(5)  # not the epoch made ahead (2): that work is dropped at once
    assert off._offload.ahead is None
    assert all(f.status in ("cancelled", "finished") for f, _ in ahead[1].values())
    _same(_epoch(off), local(5))
    it = iter(off)  # epoch 6, then a resume at epoch 6's batch 3 while 7's are made ahead
    for _ in range(3):
        next(it)
    state = off.state_dict()
    rest = [tuple(t.clone() for t in b) for b in it]
    off.load_state_dict(state)
    _same(_epoch(off), rest)
    _same(rest, local(6, skip=3))
