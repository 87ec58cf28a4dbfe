"""feedline.Mix: image sources in set proportions — shares over an epoch, the same bytes for any
worker count, exact resume mid-epoch, every record in turn, and clear errors."""

import collections

import pytest
import torch

import feedline
from util import write_tar

KW = dict(batch_size=8, size=32, transform="train", seed=11, return_index=True,
          epoch_head_start=False)


def _epoch(loader):
    images, index = [], []
    for x, _, i in loader:
        images.append(x.clone())
        index.append(i.clone())
    return torch.cat(images), torch.cat(index)


def test_two_sources_at_70_30(small_folder, image_folder):
    mix = feedline.Mix([(image_folder, 0.7), (small_folder, 0.3)], samples_per_epoch=400)
    one = feedline.ImageLoader(mix, workers=1, **KW)
    n_a = len(feedline.ImageLoader(image_folder, batch_size=1).samples)
    assert len(one.samples) == n_a + 26  # the sources' records one after the other
    x1, i1 = _epoch(one)
    assert len(i1) == 400
    share = float((i1 < n_a).float().mean())
    assert abs(share - 0.7) < 0.01  # 280 of 400, within one sample
    st = one.stats()["mix"]
    assert [s["delivered"] for s in st["sources"]] == [int((i1 < n_a).sum()),
                                                       int((i1 >= n_a).sum())]
    assert abs(st["sources"][0]["share"] - 0.7) < 0.01 and st["samples_per_epoch"] == 400
    # Labels are each source's own; the pixels are the source's record's.
    for j in (0, 5, 399):
        path, _ = one.samples[int(i1[j])]
        assert path.startswith(image_folder if int(i1[j]) < n_a else small_folder)
    # The same bytes with two workers, and a new mixture of samples in the next epoch.
    two = feedline.ImageLoader(mix, workers=2, **KW)
    x2, i2 = _epoch(two)
    assert torch.equal(i1, i2) and torch.equal(x1, x2)
    _, i1b = _epoch(one)
    assert not torch.equal(i1, i1b)
    # The small source (26 records, 120 draws an epoch) comes whole in every pass.
    small = collections.Counter(int(i) for i in i1 if int(i) >= n_a)
    assert len(small) == 26 and max(small.values()) - min(small.values()) <= 1


def test_a_mixture_resumes_exactly_mid_epoch(small_folder, image_folder):
    mix = feedline.Mix([image_folder, small_folder], weights=[2, 1], end="last_source")
    whole = feedline.ImageLoader(mix, workers=2, **KW)
    _epoch(whole)
    x_e1, i_e1 = _epoch(whole)
    first = feedline.ImageLoader(mix, workers=1, **KW)
    _epoch(first)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = feedline.ImageLoader(mix, workers=2, **KW)
    resumed.load_state_dict(state)
    x_rest, i_rest = _epoch(resumed)
    assert torch.equal(i_rest, i_e1[3 * 8:]) and torch.equal(x_rest, x_e1[3 * 8:])
    # A state of another mixture is refused.
    other = feedline.ImageLoader(feedline.Mix([image_folder, small_folder], weights=[1, 1]),
                                 **KW)
    with pytest.raises(ValueError, match="data set"):
        other.load_state_dict(state)


def test_shards_and_folders_mix(tmp_path, small_folder, image_folder):
    """A WebDataset source beside a folder: its records read from the shard."""
    ld = feedline.ImageLoader(small_folder, batch_size=1)
    members = []
    for k, (p, label) in enumerate(ld.samples[:10]):
        members += [(f"s{k:03d}.jpg", open(p, "rb").read()), (f"s{k:03d}.cls",
                                                             str(label).encode())]
    write_tar(tmp_path / "a.tar", members)
    mix = feedline.Mix([(str(tmp_path / "a.tar"), 1), (image_folder, 1)], end="last_source")
    loader = feedline.ImageLoader(mix, **dict(KW, transform="eval"))
    _, index = _epoch(loader)
    n = len(feedline.ImageLoader(image_folder, batch_size=1).samples)
    assert len(index) == 2 * n  # the larger source read whole, at half the epoch
    assert sum(int(i) < 10 for i in index) == n  # the shard's 10 records, restarted
    assert loader.samples[0][0].endswith("a.tar:s000.jpg")


def test_bad_mixtures_are_refused_by_name(small_folder):
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        feedline.Mix([(small_folder, 1), (small_folder, 0)])
    with pytest.raises(ValueError, match="weights"):
        feedline.Mix([small_folder, small_folder], weights=[1])
    with pytest.raises(TypeError, match="pairs"):
        feedline.Mix([small_folder])
    with pytest.raises(FileNotFoundError, match=r"sources\[0\]"):
        feedline.Mix([("/no/such/folder", 1)])
    with pytest.raises(ValueError, match="end"):
        feedline.Mix([(small_folder, 1)], end="never")
    with pytest.raises(ValueError, match="samples_per_epoch"):
        feedline.Mix([(small_folder, 1)], samples_per_epoch=0)
    assert "small" in repr(feedline.Mix([(small_folder, 3)]))


def test_each_image_source_augmented_its_own_way(small_folder, image_folder):
    """Mix([(a, w), (b, w, {"transform": "eval"})]): source b's samples are exactly what an
    eval loader of b alone makes of the same records (the same every epoch), source a's are
    augmented as the loader says (train: they change from epoch to epoch); the same bytes for
    1 and 2 workers. Options that shape the batch stay the loader's."""
    mix = feedline.Mix([(image_folder, 0.5), (small_folder, 0.5, {"transform": "eval",
                                                                  "resize_size": 40})],
                       samples_per_epoch=120)
    loaders = [feedline.ImageLoader(mix, workers=w, **KW) for w in (1, 2)]
    (x1, i1), (x2, i2) = (_epoch(ld) for ld in loaders)
    assert torch.equal(i1, i2) and torch.equal(x1, x2)
    n_a = len(feedline.ImageLoader(image_folder, batch_size=1).samples)
    evals = feedline.ImageLoader(small_folder, transform="eval", resize_size=40, size=32,
                                 batch_size=1, shuffle=False)
    ref = torch.cat([x for x, _ in evals])
    from_b = (i1 >= n_a).nonzero().flatten()
    assert len(from_b) == 60
    for j in from_b.tolist():
        assert torch.equal(x1[j], ref[int(i1[j]) - n_a]), j
    # The next epoch: b's records look the same again, a's are drawn anew.
    x3, i3 = _epoch(loaders[0])
    for j in (i3 >= n_a).nonzero().flatten().tolist():
        assert torch.equal(x3[j], ref[int(i3[j]) - n_a])
    again_a = {int(i): x for i, x in zip(i3, x3) if int(i) < n_a}
    assert any(not torch.equal(x1[j], again_a[int(i1[j])]) for j in range(len(i1))
               if int(i1[j]) < n_a and int(i1[j]) in again_a)
    for bad, word in (({"size": 64}, "size"), ({"std": (0.5, 0.5, 0.5)}, "std")):
        with pytest.raises(ValueError, match=word):
            feedline.Mix([(small_folder, 1, bad)])
    with pytest.raises(ValueError, match="ImageLoader"):
        feedline.TokenLoader(feedline.Mix([(small_folder, 1, {"flip": False})]), seq_len=4)


@pytest.fixture(scope="module")
def text_sources(tmp_path_factory):
    import shutil
    import subprocess
    if shutil.which("spm_train") is None:
        pytest.skip("spm_train missing")
    d = tmp_path_factory.mktemp("mixtext")
    paths = []
    for k, (n, word) in enumerate([(300, "alpha"), (120, "beta"), (500, "gamma")]):
        p = d / f"s{k}.txt"
        p.write_text("".join(f"{word} {i} " + "words " * (1 + i % 9) + "\n" for i in range(n)))
        paths.append(str(p))
    both = d / "all.txt"
    both.write_text("".join(open(p).read() for p in paths))
    subprocess.run(["spm_train", f"--input={both}", f"--model_prefix={d / 'm'}",
                    "--vocab_size=60", "--hard_vocab_limit=false", "--minloglevel=2"],
                   check=True, capture_output=True)
    return paths, str(d / "m.model")


def test_three_text_sources_padded_and_packed(text_sources):
    paths, model = text_sources
    mix = feedline.Mix(list(zip(paths, [0.5, 0.2, 0.3])), samples_per_epoch=1000)
    kw = dict(tokenizer=model, batch_size=16, seed=3, return_index=True)

    def padded(workers):
        ld = feedline.TextLoader(mix, workers=workers, **kw)
        return ld, [(b["input_ids"].clone(), b["index"].clone()) for b in ld]

    one, e1 = padded(1)
    _, e2 = padded(2)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(e1, e2))
    index = torch.cat([i for _, i in e1])
    assert len(index) == 1000
    bounds = [0, 300, 420, 920]
    shares = [int(((index >= lo) & (index < hi)).sum()) / 1000
              for lo, hi in zip(bounds, bounds[1:])]
    assert all(abs(s - w) < 0.01 for s, w in zip(shares, [0.5, 0.2, 0.3])), shares
    st = one.stats()["mix"]["sources"]
    assert [s["per_epoch"] for s in st] == [500, 200, 300]
    assert [s["delivered"] for s in st] == [round(x * 1000) for x in shares]
    # Resumed mid-epoch (epoch 1, after 5 batches): the rest, bit for bit.
    whole = feedline.TextLoader(mix, workers=1, **kw)
    list(whole)
    e_next = [b["input_ids"].clone() for b in whole]
    first = feedline.TextLoader(mix, workers=2, **kw)
    list(first)
    it = iter(first)
    for _ in range(5):
        next(it)
    resumed = feedline.TextLoader(mix, workers=1, **kw)
    resumed.load_state_dict(first.state_dict())
    rest = [b["input_ids"].clone() for b in resumed]
    assert len(rest) == len(e_next) - 5
    assert all(torch.equal(a, b) for a, b in zip(rest, e_next[5:]))
    # Packed rows across the mixture: the same rows for 1 and 2 workers, and exact resume.
    pk = dict(tokenizer=model, pack="concat", seq_len=64, batch_size=4, seed=3)
    rows1 = [b["input_ids"].clone() for b in feedline.TextLoader(mix, workers=1, **pk)]
    rows2 = [b["input_ids"].clone() for b in feedline.TextLoader(mix, workers=2, **pk)]
    assert len(rows1) == len(rows2) > 10
    assert all(torch.equal(a, b) for a, b in zip(rows1, rows2))
    part = feedline.TextLoader(mix, workers=2, **pk)
    it = iter(part)
    for _ in range(4):
        next(it)
    again = feedline.TextLoader(mix, workers=1, **pk)
    again.load_state_dict(part.state_dict())
    tail = [b["input_ids"].clone() for b in again]
    assert all(torch.equal(a, b) for a, b in zip(tail, rows1[4:])) and len(tail) == len(rows1) - 4


@pytest.fixture(scope="module")
def token_sources(tmp_path_factory):
    """Three token files whose ids say which file and which token they are (file k's tokens are
    10000 k + their offset), with document indexes of 5-40 token documents."""
    import numpy as np
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(4)
    paths, indexes = [], []
    for k, n in enumerate((3000, 1700, 900)):
        path, index = d / f"s{k}.bin", d / f"s{k}.idx"
        (10000 * k + np.arange(n)).astype(np.uint16).tofile(path)
        ends = np.cumsum(rng.integers(5, 40, size=n))
        ends = np.concatenate([ends[ends < n], [n]])
        np.concatenate([[0], ends]).astype(np.uint64).tofile(index)
        paths.append(str(path))
        indexes.append(str(index))
    return paths, indexes


def test_token_files_mix_as_windows_and_as_packed_documents(token_sources):
    """TokenLoader(feedline.Mix(token files)): windows drawn in the set proportions, each one its
    own file's window at its own index, the same for any worker count, resumed exactly; packed
    documents across the files, each epoch's documents' tokens once."""
    import numpy as np
    paths, indexes = token_sources
    mix = feedline.Mix(list(zip(paths, [0.6, 0.3, 0.1])))
    kw = dict(seq_len=15, batch_size=8, seed=3, return_index=True)

    def windows(workers, loader=None):
        ld = loader or feedline.TokenLoader(mix, workers=workers, **kw)
        return ld, [(b["input_ids"].clone(), b["labels"].clone(), b["index"].clone()) for b in ld]

    one, e1 = windows(1)
    _, e2 = windows(2)
    assert len(e1) == len(e2) and all(
        torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) for a, b in zip(e1, e2))
    ids = torch.cat([x for x, _, _ in e1])
    src = ids[:, 0] // 10000
    shares = [float((src == k).float().mean()) for k in range(3)]
    assert all(abs(s - w) < 0.01 for s, w in zip(shares, [0.6, 0.3, 0.1])), shares
    # Each window is its file's window: tokens [w * 16, w * 16 + 15), labels shifted by one.
    offsets = [0, 3000 // 16, 3000 // 16 + 1700 // 16]
    for (x, y, index) in e1:
        for row, lab, i in zip(x, y, index.tolist()):
            k = max(j for j in range(3) if offsets[j] <= i)
            start = 10000 * k + (i - offsets[k]) * 16
            assert row.tolist() == list(range(start, start + 15))
            assert lab.tolist() == list(range(start + 1, start + 16))
    st = one.stats()["mix"]["sources"]
    assert [s["delivered"] for s in st] == [int((src == k).sum()) for k in range(3)]
    # Resumed after 3 batches of epoch 1: the rest bit for bit.
    _, nxt = windows(1, loader=one)
    part = feedline.TokenLoader(mix, workers=2, **kw)
    list(part)
    it = iter(part)
    for _ in range(3):
        next(it)
    again = feedline.TokenLoader(mix, workers=1, **kw)
    again.load_state_dict(part.state_dict())
    rest = [b["input_ids"] for b in again]
    assert len(rest) == len(nxt) - 3 and all(
        torch.equal(a, b[0]) for a, b in zip(rest, nxt[3:]))

    # Packed documents across the files: an epoch's documents (per source, per_epoch of them)
    # each packed once; the same rows for 1 and 2 workers.
    pk = dict(seq_len=32, batch_size=4, seed=3, pack="concat", index=indexes)
    rows = [feedline.TokenLoader(mix, workers=w, **pk) for w in (1, 2)]
    got = [[b["input_ids"][b["attention_mask"].bool()].clone() for b in ld] for ld in rows]
    assert all(torch.equal(a, b) for a, b in zip(*got)) and len(got[0]) == len(got[1])
    tokens = torch.cat(got[0])
    assert len(torch.unique(tokens)) == len(tokens)  # no token twice
    per_epoch = [s["per_epoch"] for s in rows[0].stats()["mix"]["sources"]]
    lengths = [np.diff(np.fromfile(p, dtype=np.uint64)) for p in indexes]
    # The first source is read whole (end="first_source"): all of its tokens.
    assert int((tokens // 10000 == 0).sum()) == 3000 and per_epoch[0] == len(lengths[0])
    with pytest.raises(ValueError, match="index"):
        feedline.TokenLoader(mix, seq_len=32, pack="concat", index=indexes[:2])
    with pytest.raises(TypeError, match="index"):
        feedline.TokenLoader(mix, seq_len=32, pack="concat", index=indexes[0])
