"""feedline.TokenLoader: token windows from a pre-tokenized token file, against numpy reading
the same file: every window exactly once per epoch, labels shifted by one, shuffled by seed,
sharded across ranks, resumable mid-epoch, and bad files refused with the file named."""

import numpy as np
import pytest
import torch

import feedline


def _token_file(path, n, dtype, seed=0, vocab=50257):
    ids = np.random.default_rng(seed).integers(0, vocab, n).astype(dtype)
    ids.tofile(path)
    return ids


def _windows(ids, seq_len):
    """The reference: window i = tokens [i (L + 1), (i + 1)(L + 1))."""
    w = seq_len + 1
    n = len(ids) // w
    rows = ids[:n * w].reshape(n, w).astype(np.int64)
    return rows[:, :-1], rows[:, 1:]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_every_window_once_with_shifted_labels(tmp_path, dtype):
    path = str(tmp_path / "train.bin")
    ids = _token_file(path, 100_003, dtype, vocab=50257 if dtype == "uint16" else 200_000)
    seq_len = 64
    ref_x, ref_y = _windows(ids, seq_len)
    loader = feedline.TokenLoader(path, seq_len=seq_len, batch_size=32, dtype=dtype, seed=3,
                                  return_index=True)
    assert len(loader) == -(-len(ref_x) // 32)
    seen = []
    for batch in loader:
        x, y, idx = batch["input_ids"], batch["labels"], batch["index"]
        assert x.dtype == torch.int64 and y.dtype == torch.int64
        assert x.shape[1:] == (seq_len,) and y.shape == x.shape
        i = idx.numpy()
        assert np.array_equal(x.numpy(), ref_x[i]) and np.array_equal(y.numpy(), ref_y[i])
        seen.extend(i.tolist())
    assert sorted(seen) == list(range(len(ref_x)))  # every window exactly once
    assert seen != sorted(seen)  # shuffled


def test_order_follows_the_seed_and_epoch(tmp_path):
    path = str(tmp_path / "t.bin")
    _token_file(path, 20_000, "uint16")

    def order(seed, epoch=None):
        loader = feedline.TokenLoader(path, seq_len=31, batch_size=16, seed=seed,
                                      return_index=True)
        if epoch is not None:
            loader.set_epoch(epoch)
        return [i for b in loader for i in b["index"].tolist()]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(1, epoch=0) != order(1, epoch=1)
    plain = feedline.TokenLoader(path, seq_len=31, batch_size=16, shuffle=False,
                                 return_index=True)
    assert [i for b in plain for i in b["index"].tolist()] == list(range(20_000 // 32))


def test_ranks_split_the_windows(tmp_path):
    path = str(tmp_path / "t.bin")
    _token_file(path, 30_000, "uint16")
    parts = []
    for rank in range(3):
        loader = feedline.TokenLoader(path, seq_len=63, batch_size=8, seed=5, rank=rank,
                                      world_size=3, return_index=True)
        parts.append([i for b in loader for i in b["index"].tolist()])
    assert len({len(p) for p in parts}) == 1  # every rank the same number of batches
    union = set().union(*parts)
    assert union == set(range(30_000 // 64))


def test_resume_mid_epoch_is_exact_with_another_worker_count(tmp_path):
    path = str(tmp_path / "t.bin")
    _token_file(path, 50_000, "uint16")
    kw = dict(seq_len=127, batch_size=8, seed=9)
    full = [b["input_ids"].clone() for b in feedline.TokenLoader(path, workers=2, **kw)]
    first = feedline.TokenLoader(path, workers=2, **kw)
    it = iter(first)
    head = [next(it)["input_ids"].clone() for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = feedline.TokenLoader(path, workers=1, **kw)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].clone() for b in resumed]
    got = head + rest
    assert len(got) == len(full) and all(torch.equal(a, b) for a, b in zip(got, full))
    assert len(repr(state)) < 64 * 1024


def test_bad_files_are_clear_errors(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")  # not a whole number of uint16 tokens
    with pytest.raises(feedline.DataError, match="odd.bin.*whole number"):
        feedline.TokenLoader(str(odd), seq_len=1)
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    with pytest.raises(feedline.DataError, match="short.bin.*fewer than one window"):
        feedline.TokenLoader(str(short), seq_len=10)
    with pytest.raises(FileNotFoundError):
        feedline.TokenLoader(str(tmp_path / "missing.bin"), seq_len=4)
    with pytest.raises(ValueError, match="dtype"):
        feedline.TokenLoader(str(short), seq_len=4, dtype="int8")


def test_token_beyond_the_vocabulary(tmp_path):
    path = tmp_path / "v.bin"
    ids = np.arange(1000, dtype=np.uint16) % 100
    ids[517] = 4000  # window 517 // 11 = 47 holds it
    ids.tofile(path)
    loader = feedline.TokenLoader(str(path), seq_len=10, batch_size=4, shuffle=False,
                                  vocab_size=100)
    with pytest.raises(feedline.DataError, match=r"v.bin.*token 4000 at token offset 517"):
        for _ in loader:
            pass
    skip = feedline.TokenLoader(str(path), seq_len=10, batch_size=4, shuffle=False,
                                vocab_size=100, on_error="skip", return_index=True)
    got = [i for b in skip for i in b["index"].tolist()]
    assert 47 not in got and len(got) == 1000 // 11  # replaced, not dropped
    st = skip.stats()
    assert st["error_count"] == 1 and st["errors"][0]["sample"] == 47, st["errors"]
    assert "token 4000" in st["errors"][0]["cause"] or "token 4000" in st["errors"][0]["path"]


def _documents_file(tmp_path, n_docs, dtype="uint16", seed=3):
    """A token file of n_docs documents of long-tailed lengths and its document index."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(4.0, 1.0, n_docs).astype(np.int64) + 1, 3000)
    docs = [rng.integers(5, 1000, int(k)).astype(dtype) for k in lengths]
    path, index = tmp_path / "docs.bin", tmp_path / "docs.idx"
    np.concatenate(docs).tofile(path)
    np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64).tofile(index)
    return path, index, [d.astype(np.int64).tolist() for d in docs]


@pytest.mark.parametrize("pack", ["concat", "bestfit"])
def test_documents_of_a_token_file_are_packed(tmp_path, pack):
    path, index, docs = _documents_file(tmp_path, 500)
    ld = feedline.TokenLoader(path, seq_len=256, batch_size=4, index=index, pack=pack,
                              eos_id=1, shuffle=False)
    rows = [b for b in ld]
    if pack == "concat":
        got = torch.cat([b["input_ids"][b["attention_mask"] == 1] for b in rows]).tolist()
        assert got == [t for d in docs for t in d + [1]]
    else:
        pieces = {}
        for d in docs:
            d = d + [1]
            for a in range(0, len(d), 256):
                key = tuple(d[a:a + 256])
                pieces[key] = pieces.get(key, 0) + 1
        got = {}
        for b in rows:
            L = b["input_ids"].shape[1]
            cu = b["cu_seqlens"].tolist()
            for a, e in zip(cu, cu[1:]):
                r = a // L
                if b["attention_mask"][r, a - r * L]:
                    key = tuple(b["input_ids"][r, a - r * L:e - r * L].tolist())
                    got[key] = got.get(key, 0) + 1
        assert got == pieces
        assert ld.stats()["packing"]["efficiency"] > 0.95
    with pytest.raises(TypeError):
        len(ld)


def test_documents_cut_to_max_length_are_counted_and_warned(tmp_path):
    """A document longer than max_length is cut to it before packing: the tokens past it are
    in no row, so stats()["packing"] counts them and the loader warns once."""
    path, index, docs = _documents_file(tmp_path, 200)
    max_length = 300
    longer = [d for d in docs if len(d) + 1 > max_length]
    assert longer  # the long tail reaches 3000 tokens
    ld = feedline.TokenLoader(path, seq_len=128, batch_size=4, index=index, pack="concat",
                              eos_id=1, shuffle=False, max_length=max_length)
    with pytest.warns(RuntimeWarning, match=rf"{len(longer)} document\(s\) longer than "
                                            rf"max_length={max_length}"):
        rows = list(ld)
    got = torch.cat([b["input_ids"][b["attention_mask"] == 1] for b in rows]).tolist()
    assert got == [t for d in docs for t in (d + [1])[:max_length]]
    p = ld.stats()["packing"]
    assert p["cut_documents"] == len(longer)
    assert p["cut_tokens"] == sum(len(d) + 1 - max_length for d in longer)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per loader
        list(ld)
    fits = feedline.TokenLoader(path, seq_len=128, batch_size=4, index=index, pack="concat",
                                eos_id=1, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(fits)
    assert fits.stats()["packing"]["cut_tokens"] == 0


def test_document_index_errors(tmp_path):
    path, index, docs = _documents_file(tmp_path, 20)
    with pytest.raises(ValueError, match="index and pack"):
        feedline.TokenLoader(path, seq_len=64, index=index)
    bad = tmp_path / "bad.idx"
    total = sum(len(d) for d in docs)
    np.array([0, 10, 5, total], np.uint64).tofile(bad)
    with pytest.raises(feedline.DataError, match="bad.idx.*below"):
        feedline.TokenLoader(path, seq_len=64, index=bad, pack="concat")
    np.array([0, 10], np.uint64).tofile(bad)
    with pytest.raises(feedline.DataError, match="last offset is 10"):
        feedline.TokenLoader(path, seq_len=64, index=bad, pack="concat")
    (tmp_path / "odd.idx").write_bytes(b"\0" * 12)
    with pytest.raises(feedline.DataError, match="multiple of 8"):
        feedline.TokenLoader(path, seq_len=64, index=tmp_path / "odd.idx", pack="bestfit")
    ld = feedline.TokenLoader(path, seq_len=64, index=index, pack="concat", vocab_size=100)
    with pytest.raises(feedline.DataError, match="docs.bin: document .*not below vocab_size 100"):
        list(ld)
    # uint32 ids past int32's range (packed rows hold int32 ids): an error naming the file, not
    # negative ids (found by tests/fuzz/fuzz_tokens.cc).
    wide = tmp_path / "wide.bin"
    np.array([1, 2, 3_000_000_000, 4], np.uint32).tofile(wide)
    np.array([0, 2, 4], np.uint64).tofile(tmp_path / "wide.idx")
    ld = feedline.TokenLoader(wide, seq_len=4, batch_size=1, dtype="uint32",
                              index=tmp_path / "wide.idx", pack="concat", shuffle=False)
    with pytest.raises(feedline.DataError, match="wide.bin: document 1 .*3000000000 .*int32"):
        list(ld)


_SHRINK = r"""
import os, sys
import numpy as np
import feedline
path = sys.argv[1]
np.arange(200_000, dtype=np.uint16).tofile(path)
loader = feedline.TokenLoader(path, seq_len=63, batch_size=8, dtype="uint16", workers=1,
                              prefetch=1, shuffle=False)
it = iter(loader)
next(it)
os.truncate(path, 2 * 1000)          # cut under the running loader
try:
    for b in it:
        pass
except feedline.DataError as e:
    print("DataError:", e)
"""


def test_a_token_file_cut_under_a_running_loader_is_a_data_error(tmp_path):
    """Reading a mapped file past its new end raised SIGBUS and killed the process."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", _SHRINK, str(tmp_path / "t.bin")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "DataError:" in p.stdout and "t.bin" in p.stdout and "was cut to 2000 bytes" in p.stdout
