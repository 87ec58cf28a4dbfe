"""feedline.TextLoader: documents tokenized by SentencePiece in feedline's workers, against
Python `sentencepiece` with the same model (trained here with spm_train on a corpus the test
writes; nothing is downloaded): the same ids for every document, padded batches with the
model's pad id, attention masks and lengths, JSON Lines, clear errors, exact resume."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import feedline

sentencepiece = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.skipif(shutil.which("spm_train") is None, reason="spm_train missing")

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from "
         "at which but have an they you were her she there been one all we their has would "
         "loader batch tensor gradient über café naïve straße 東京 データ 🙂 ünïcödé").split()


def _documents(n, seed=0):
    """A long-tailed corpus: most documents short, a few long; Zipf-distributed words (common
    English, made-up words from syllables, some Unicode)."""
    rng = np.random.default_rng(seed)
    syllables = "ka lo mi ren sta qu ar on tel vi do ze pha gri ul".split()
    words = list(WORDS) + ["".join(rng.choice(syllables, size=int(rng.integers(1, 4))))
                           for _ in range(400)]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    docs = []
    for _ in range(n):
        k = int(min(2000, rng.lognormal(3.0, 1.0))) + 1
        docs.append(" ".join(rng.choice(words, size=k, p=p)))
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    docs = _documents(400)
    txt = d / "corpus.txt"
    txt.write_text("\n".join(docs) + "\n", encoding="utf-8")
    prefix = str(d / "m")
    subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={prefix}",
                    "--vocab_size=400", "--hard_vocab_limit=false", "--model_type=unigram", "--pad_id=3",
                    "--character_coverage=1.0", "--minloglevel=2"],
                   check=True, capture_output=True)
    return dict(dir=d, docs=docs, txt=str(txt), model=prefix + ".model",
                sp=sentencepiece.SentencePieceProcessor(model_file=prefix + ".model"))


def _collect(loader):
    out = {}
    for b in loader:
        x, mask, lengths, idx = b["input_ids"], b["attention_mask"], b["lengths"], b["index"]
        assert x.dtype == torch.int64 and x.shape == mask.shape
        assert x.shape[1] == int(lengths.max())  # padded to the batch's longest
        for row, m, n, i in zip(x.tolist(), mask.tolist(), lengths.tolist(), idx.tolist()):
            assert m == [1] * n + [0] * (len(row) - n)
            assert all(t == 3 for t in row[n:])  # the model's pad id
            out[i] = row[:n]
    return out


@pytest.mark.parametrize("add_bos,add_eos,max_length", [(False, False, 4096), (True, True, 64)])
def test_ids_equal_python_sentencepiece(corpus, add_bos, add_eos, max_length):
    loader = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], batch_size=16,
                                 max_length=max_length, add_bos=add_bos, add_eos=add_eos,
                                 seed=1, return_index=True)
    got = _collect(loader)
    assert sorted(got) == list(range(len(corpus["docs"])))
    sp = corpus["sp"]
    for i, doc in enumerate(corpus["docs"]):
        want = ([sp.bos_id()] if add_bos else []) + sp.encode(doc) + \
            ([sp.eos_id()] if add_eos else [])
        assert got[i] == want[:max_length], i


def test_ids_stay_exact_around_a_huge_document(corpus, tmp_path):
    """Each worker thread reuses one SentencePiece message from one document to the next, and
    drops it after a document of more than 65,536 pieces: nothing carries over, in either
    order, on one thread (every document after the other) or two."""
    sp, docs = corpus["sp"], corpus["docs"]
    huge = " ".join(docs[:400] * 5)
    assert len(sp.encode(huge)) > 65536
    mixed = docs[:30] + [huge] + docs[30:60] + [huge[: len(huge) // 3]] + docs[60:90]
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(mixed) + "\n", encoding="utf-8")
    for workers in (1, 2):
        loader = feedline.TextLoader(str(path), tokenizer=corpus["model"], batch_size=4,
                                     max_length=1 << 18, shuffle=False, workers=workers,
                                     return_index=True)
        got = _collect(loader)
        assert sorted(got) == list(range(len(mixed)))
        for i, doc in enumerate(mixed):
            assert got[i] == sp.encode(doc), (workers, i)


def test_word_cache_gives_python_sentencepiece_ids_over_epochs(corpus, tmp_path):
    """The word cache (on by default) against Python sentencepiece, over three epochs (the
    later ones mostly from the cache) on two workers: prose with punctuation, capitals and
    numbers, words whose segmentations tie ("7666": "6" "66" or "66" "6", decided by the
    document's float sums) early and after thousands of words, odd whitespace, Unicode."""
    rng = np.random.default_rng(5)
    ties = "1000 7666 2222 66666 abab kakaka ... !!! aaaa 10000 9999".split()
    docs = []
    for d in corpus["docs"][:300]:
        words = d.split(" ")
        for _ in range(len(words) // 8):
            k = int(rng.integers(0, len(words)))
            words[k] = str(rng.choice(ties)) if rng.random() < 0.5 else words[k].capitalize() + ","
        docs.append(" ".join(words))
    docs += [" ".join(corpus["docs"][:200]) + " 7666 1000", "a  b\tc\u00a0d e \u0301f",
             "x, y. Z! (the) \"cat\" 1,000.5", " the cat ", "7666"]
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(docs) + "\n", encoding="utf-8")
    sp = corpus["sp"]
    want = [sp.encode(d) for d in docs]
    for word_cache in (True, False):
        loader = feedline.TextLoader(str(path), tokenizer=corpus["model"], batch_size=8,
                                     max_length=1 << 16, workers=2, return_index=True,
                                     word_cache=word_cache)
        for epoch in range(3):
            got = _collect(loader)
            assert sorted(got) == list(range(len(docs)))
            for i in range(len(docs)):
                assert got[i] == want[i], (word_cache, epoch, i)
        t = loader.stats()["tokenizer"]
        assert t["word_cache"] == word_cache
        if word_cache:
            assert t["documents"] == 3 * len(docs)
            # Epochs 2 and 3 from the cache, but for the documents with a tie (encoded whole).
            assert t["cached_words"] > t["words"] // 4
        else:
            assert t["words"] == t["cached_words"] == 0


def test_json_lines_and_bad_lines(corpus, tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"id": i, "text": d}, ensure_ascii=i % 2 == 0)
             for i, d in enumerate(corpus["docs"][:20])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loader = feedline.TextLoader(str(path), tokenizer=corpus["model"], field="text",
                                 batch_size=8, shuffle=False, return_index=True)
    got = _collect(loader)
    assert [got[i] for i in range(20)] == [corpus["sp"].encode(d) for d in corpus["docs"][:20]]
    # Each kind of bad line: a DataError naming file:line and the cause.
    bad = {"no field": '{"body": "x"}', "not JSON": "{oops", "empty": '{"text": ""}',
           "not a string": '{"text": 5}'}
    for what, line in bad.items():
        p = tmp_path / "bad.jsonl"
        p.write_bytes((lines[0] + "\n" + line + "\n").encode())
        ld = feedline.TextLoader(str(p), tokenizer=corpus["model"], field="text",
                                 batch_size=2, shuffle=False)
        with pytest.raises(feedline.DataError, match=r"bad.jsonl:2"):
            list(ld)
    p = tmp_path / "utf8.txt"
    p.write_bytes(b"fine words\nbroken \xff\xfe bytes\n")
    with pytest.raises(feedline.DataError, match=r"utf8.txt:2.*invalid UTF-8"):
        list(feedline.TextLoader(str(p), tokenizer=corpus["model"], shuffle=False))
    skip = feedline.TextLoader(str(p), tokenizer=corpus["model"], shuffle=False,
                               on_error="skip", return_index=True)
    assert [i for b in skip for i in b["index"].tolist()] == [0, 0]  # replaced, counted
    assert skip.stats()["error_count"] == 1


def test_resume_is_exact_across_worker_counts(corpus):
    kw = dict(tokenizer=corpus["model"], batch_size=8, seed=4, return_index=True)
    full = [b["index"].tolist() for b in feedline.TextLoader(corpus["txt"], workers=2, **kw)]
    first = feedline.TextLoader(corpus["txt"], workers=2, **kw)
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(7)]
    state = first.state_dict()
    del it
    again = feedline.TextLoader(corpus["txt"], workers=1, **kw)
    again.load_state_dict(state)
    assert head + [b["index"].tolist() for b in again] == full


def _segments(b):
    """Each row's segments (start, end) from cu_seqlens; padding segments left out."""
    L = b["input_ids"].shape[1]
    cu = b["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == b["input_ids"].numel()
    out = [[] for _ in range(b["input_ids"].shape[0])]
    for a, e in zip(cu, cu[1:]):
        r = a // L
        assert (e - 1) // L == r  # a segment never crosses rows
        if b["attention_mask"][r, a - r * L]:
            out[r].append((a - r * L, e - r * L))
    return out


def _check_packed(b, seq_len, mask_ends=True):
    x, labels, pos, mask = b["input_ids"], b["labels"], b["position_ids"], b["attention_mask"]
    for t in (x, labels, pos, mask):
        assert t.dtype == torch.int64 and t.shape[1] == seq_len
    assert b["cu_seqlens"].dtype == torch.int32
    assert bool((labels[mask == 0] == -100).all())
    for r, segs in enumerate(_segments(b)):
        real = int(mask[r].sum())
        assert bool(mask[r, :real].all()) and not bool(mask[r, real:].any())
        for a, e in segs:
            assert pos[r, a:e].tolist() == list(range(e - a))
            assert labels[r, a:e - 1].tolist() == x[r, a + 1:e].tolist()
            if mask_ends and int(x[r, e - 1]) == 2:  # the model's EOS
                assert int(labels[r, e - 1]) == -100


def test_concat_rows_are_the_reference_concatenation(corpus):
    sp = corpus["sp"]
    assert sp.eos_id() == 2
    want = []
    for d in corpus["docs"]:
        want += sp.encode(d) + [sp.eos_id()]
    for mask in (True, False):
        ld = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], pack="concat",
                                 seq_len=256, batch_size=4, add_eos=True, shuffle=False,
                                 mask_boundaries=mask)
        got, labels, rows = [], [], 0
        for b in ld:
            _check_packed(b, 256, mask)
            got += b["input_ids"][b["attention_mask"] == 1].tolist()
            labels += b["labels"][b["attention_mask"] == 1].tolist()
            rows += b["input_ids"].shape[0]
        assert got == want
        assert rows == -(-len(want) // 256)  # full rows, only the last one padded
        ref = [(-100 if (mask and t == sp.eos_id()) else n) for t, n in zip(want, want[1:])]
        assert labels == ref + [-100]
        st = ld.stats()["packing"]
        assert st["tokens"] == len(want) and st["rows"] == rows
        assert st["cut_documents"] == 0 and st["cut_tokens"] == 0
        assert st["efficiency"] == len(want) / (rows * 256)
    # Documents longer than max_length are cut to it before packing: counted, and warned once.
    ids = [sp.encode(d) + [sp.eos_id()] for d in corpus["docs"]]
    cap = sorted(len(x) for x in ids)[len(ids) * 9 // 10]
    ld = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], pack="concat",
                             seq_len=256, batch_size=4, add_eos=True, shuffle=False,
                             max_length=cap)
    with pytest.warns(RuntimeWarning, match=f"max_length={cap} tokens were cut"):
        got = [t for b in ld for t in b["input_ids"][b["attention_mask"] == 1].tolist()]
    assert got == [t for x in ids for t in x[:cap]]
    st = ld.stats()["packing"]
    assert st["cut_documents"] == sum(len(x) > cap for x in ids)
    assert st["cut_tokens"] == sum(max(len(x) - cap, 0) for x in ids)


def test_padded_truncation_is_counted_and_warned_once(corpus):
    """Padded batches cut documents to max_length, as asked; the tokens past it are counted in
    stats()["truncation"] and warned about once per loader, never dropped unseen."""
    import warnings
    sp = corpus["sp"]
    ids = [sp.encode(d) for d in corpus["docs"]]
    cap = sorted(len(x) for x in ids)[len(ids) * 9 // 10]
    ld = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], batch_size=16,
                             shuffle=False, max_length=cap)
    with pytest.warns(RuntimeWarning, match=f"max_length={cap} tokens were cut") as caught:
        for _ in range(2):  # two epochs: one warning
            got = [b["input_ids"][i, :int(n)].tolist() for b in ld
                   for i, n in enumerate(b["lengths"])]
    assert sum("were cut" in str(w.message) for w in caught) == 1
    assert got == [x[:cap] for x in ids]
    st = ld.stats()["truncation"]
    assert st["max_length"] == cap
    assert st["documents"] == 2 * sum(len(x) > cap for x in ids)  # counted per epoch read
    assert st["tokens"] == 2 * sum(max(len(x) - cap, 0) for x in ids)
    # Nothing cut: no warning, zero counts.
    longest = max(len(x) for x in ids)
    ld = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], batch_size=16,
                             max_length=longest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(b["input_ids"].shape[0] for b in ld) == len(ids)
    assert ld.stats()["truncation"] == {"max_length": longest, "documents": 0, "tokens": 0,
                                        "partly_tokenized": 0}


def test_bestfit_rows_hold_whole_documents_densely(corpus):
    sp = corpus["sp"]
    docs = {}
    for d in corpus["docs"]:
        ids = tuple(sp.encode(d) + [sp.eos_id()])
        docs[ids] = docs.get(ids, 0) + 1
    ld = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], pack="bestfit",
                             seq_len=512, batch_size=4, add_eos=True, seed=2)
    got = {}
    for b in ld:
        _check_packed(b, 512)
        for r, segs in enumerate(_segments(b)):
            for a, e in segs:
                ids = tuple(b["input_ids"][r, a:e].tolist())
                got[ids] = got.get(ids, 0) + 1
    assert got == docs  # every document once, whole (none here is longer than a row)
    st = ld.stats()["packing"]
    # One window here: best fit needs no row more than the tokens fill (no row is wasted).
    assert st["rows"] == -(-st["tokens"] // 512)
    packed = st["efficiency"]
    # Beside it, what padding each batch to its longest wastes on the same corpus.
    padded = feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], batch_size=32,
                                 add_eos=True, max_length=4096, seed=2)
    real = slots = 0
    for b in padded:
        real += int(b["lengths"].sum())
        slots += b["input_ids"].numel()
    assert packed >= 0.97 and real / slots < 0.9 * packed


@pytest.mark.parametrize("pack", ["concat", "bestfit"])
def test_packed_resume_is_exact_across_worker_counts(corpus, pack):
    kw = dict(tokenizer=corpus["model"], pack=pack, seq_len=128, batch_size=2, window_rows=6,
              add_eos=True, seed=9)
    full = [b["input_ids"] for b in feedline.TextLoader(corpus["txt"], workers=2, **kw)]
    first = feedline.TextLoader(corpus["txt"], workers=1, **kw)
    it = iter(first)
    cut = len(full) // 3
    head = [next(it)["input_ids"] for _ in range(cut)]
    state = first.state_dict()
    del it
    assert len(json.dumps(state)) < 64 * 1024
    again = feedline.TextLoader(corpus["txt"], workers=2, **kw)
    again.load_state_dict(json.loads(json.dumps(state)))
    rest = [b["input_ids"] for b in again]
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full):
        assert torch.equal(a, b)
    other = feedline.TextLoader(corpus["txt"], **dict(kw, seq_len=64))
    with pytest.raises(ValueError, match="packing"):
        other.load_state_dict(state)


def test_bucketed_batches_hold_similar_lengths(corpus):
    sp = corpus["sp"]
    kw = dict(tokenizer=corpus["model"], batch_size=8, max_length=4096, seed=6,
              return_index=True)
    ld = feedline.TextLoader(corpus["txt"], bucket=True, window_rows=10, **kw)
    seen, real, slots, batches = [], 0, 0, 0
    for b in ld:
        batches += 1
        for row, n, i in zip(b["input_ids"], b["lengths"], b["index"]):
            assert row[:n].tolist() == sp.encode(corpus["docs"][int(i)])
            assert bool((row[n:] == sp.pad_id()).all())
        assert b["attention_mask"].sum() == b["lengths"].sum()
        seen += b["index"].tolist()
        real += int(b["lengths"].sum())
        slots += b["input_ids"].numel()
    assert sorted(seen) == list(range(len(corpus["docs"])))
    assert batches == len(ld) == -(-len(corpus["docs"]) // 8)
    plain = feedline.TextLoader(corpus["txt"], **kw)
    p_real = p_slots = 0
    for b in plain:
        p_real += int(b["lengths"].sum())
        p_slots += b["input_ids"].numel()
    assert real / slots > 1.5 * p_real / p_slots
    assert ld.stats()["packing"]["efficiency"] == real / slots
    # Resume, as for the other shapes.
    first = feedline.TextLoader(corpus["txt"], bucket=True, window_rows=10, **kw)
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(5)]
    state = first.state_dict()
    del it
    again = feedline.TextLoader(corpus["txt"], bucket=True, window_rows=10, workers=1, **kw)
    again.load_state_dict(state)
    full = [b["index"].tolist() for b in
            feedline.TextLoader(corpus["txt"], bucket=True, window_rows=10, **kw)]
    assert head + [b["index"].tolist() for b in again] == full
    with pytest.raises(ValueError, match="bucket"):
        feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], bucket=True,
                            pack="concat", seq_len=64)


def test_packing_arguments(corpus):
    kw = dict(tokenizer=corpus["model"])
    with pytest.raises(ValueError, match="pack"):
        feedline.TextLoader(corpus["txt"], pack="greedy", seq_len=8, **kw)
    with pytest.raises(TypeError, match="seq_len"):
        feedline.TextLoader(corpus["txt"], pack="concat", **kw)
    with pytest.raises(ValueError, match="seq_len"):
        feedline.TextLoader(corpus["txt"], seq_len=8, **kw)
    ld = feedline.TextLoader(corpus["txt"], pack="bestfit", seq_len=64, **kw)
    with pytest.raises(TypeError, match="known only"):
        len(ld)
    assert "pack='bestfit'" in repr(ld)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        feedline.TextLoader(corpus["txt"], tokenizer=str(corpus["dir"] / "none.model"))


def test_webdataset_shards_txt_and_json_members(corpus, tmp_path):
    """Documents as WebDataset keys: the .txt member, or the .json member's field."""
    import io
    import tarfile
    docs = corpus["docs"][:30]
    for k in range(2):
        with tarfile.open(tmp_path / f"docs-{k:03d}.tar", "w") as tar:
            for i in range(k * 15, (k + 1) * 15):
                for ext, data in (("txt", docs[i].encode()),
                                  ("json", json.dumps({"text": docs[i]}).encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    pattern = str(tmp_path / "docs-{000..001}.tar")
    want = [corpus["sp"].encode(d) for d in docs]
    for field in (None, "text"):
        loader = feedline.TextLoader(pattern, tokenizer=corpus["model"], field=field,
                                     batch_size=4, shuffle=False, return_index=True)
        got = _collect(loader)
        assert [got[i] for i in range(30)] == want


def test_text_tokenizer_and_token_files_by_url(corpus, tmp_path, monkeypatch):
    """The text file, the SentencePiece model and token files (+ document index) served by
    nginx on loopback: downloaded once into the cache, the same ids as the local files; errors
    name the URL."""
    import nginx  # tests/servers/nginx.py (on the path by conftest.py)
    if nginx.NGINX is None:
        pytest.skip("nginx missing (cmake/install-deps.sh)")
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(corpus["txt"], www / "corpus.txt")
    shutil.copy(corpus["model"], www / "m.model")
    (www / "bad.txt").write_bytes(b"fine words\n\xff\xfe not utf-8\n")
    ids = np.arange(5000, dtype=np.uint16) % 400
    ids.tofile(www / "train.bin")
    np.array([0, 1000, 2500, 5000], np.uint64).tofile(www / "train.idx")
    kw = dict(batch_size=16, shuffle=False, return_index=True)
    with nginx.serve(www, tmp_path / "nginx") as (base, _):
        local = _collect(feedline.TextLoader(corpus["txt"], tokenizer=corpus["model"], **kw))
        remote = _collect(feedline.TextLoader(base + "/corpus.txt", tokenizer=base + "/m.model",
                                              **kw))
        assert remote == local
        with pytest.raises(feedline.DataError, match=rf"{base}/bad\.txt:2"):
            list(feedline.TextLoader(base + "/bad.txt", tokenizer=corpus["model"], **kw))
        with pytest.raises(FileNotFoundError, match=rf"{base}/nope\.txt: HTTP 404"):
            feedline.TextLoader(base + "/nope.txt", tokenizer=corpus["model"], **kw)
        windows = feedline.TokenLoader(base + "/train.bin", seq_len=99, batch_size=10,
                                       shuffle=False)
        got = torch.cat([b["input_ids"] for b in windows])
        assert torch.equal(got, torch.from_numpy(ids[:5000].astype(np.int64)).view(50, 100)[:, :99])
        with pytest.raises(feedline.DataError, match=rf"{base}/train\.bin: window \d+ "
                                                       r"\(tokens \d+\.\.\d+\): token"):
            list(feedline.TokenLoader(base + "/train.bin", seq_len=99, batch_size=10,
                                      vocab_size=100, shuffle=False))
        # A cache budget of 0 still keeps the two files opened together (token file + index).
        monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache0"))
        monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", "0")
        packed = feedline.TokenLoader(base + "/train.bin", seq_len=128, batch_size=4,
                                      index=base + "/train.idx", pack="concat", shuffle=False)
        rows = torch.cat([b["input_ids"] for b in packed])
        assert rows.flatten()[:5000].tolist() == ids.astype(np.int64).tolist()


def test_url_copy_follows_the_server_and_opens_offline(corpus, tmp_path, monkeypatch):
    """A file read by URL is copied once; when the server's copy changes (another ETag) the
    next open fetches it again, and with the server gone the copy still opens."""
    import nginx
    if nginx.NGINX is None:
        pytest.skip("nginx missing (cmake/install-deps.sh)")
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    www = tmp_path / "www"
    www.mkdir()
    first = ["the first version of the corpus", "two lines of it"]
    second = ["a second version, rewritten on the server", "with", "three lines"]
    (www / "c.txt").write_text("\n".join(first) + "\n")
    kw = dict(tokenizer=corpus["model"], batch_size=4, shuffle=False, return_index=True)
    sp = corpus["sp"]
    with nginx.serve(www, tmp_path / "nginx") as (base, _):
        got = _collect(feedline.TextLoader(base + "/c.txt", **kw))
        assert [got[i] for i in range(2)] == [sp.encode(d) for d in first]
        (www / "c.txt").write_text("\n".join(second) + "\n")
        got = _collect(feedline.TextLoader(base + "/c.txt", **kw))
        assert [got[i] for i in range(3)] == [sp.encode(d) for d in second]
    # The server is gone: the copy of the second version opens as it is.
    got = _collect(feedline.TextLoader(base + "/c.txt", **kw))
    assert [got[i] for i in range(3)] == [sp.encode(d) for d in second]


# Lines that the line splitter keeps (not ASCII whitespace) but SentencePiece tokenizes to
# nothing: a no-break space, an ideographic space, a zero-width space, a BOM, a control character.
_NO_TOKENS = ["\u00a0", "\u3000", "\u200b", "\ufeff", "\x01", "\u00a0\u3000 \u00a0"]


@pytest.mark.parametrize("pack", ["concat", "bestfit"])
def test_documents_without_tokens_are_skipped_and_counted_when_packing(corpus, tmp_path, pack):
    sp = corpus["sp"]
    empty = [t for t in _NO_TOKENS if not sp.encode(t)]
    assert len(empty) >= 4, [sp.encode(t) for t in _NO_TOKENS]
    docs = list(corpus["docs"][:120])
    for k, i in enumerate(range(0, len(docs) + 30, 5)):
        docs.insert(i, empty[k % len(empty)])
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(docs) + "\n", encoding="utf-8")
    n_empty = sum(1 for d in docs if not sp.encode(d))
    for add_eos in (False, True):
        for seed in (0, 1):
            ld = feedline.TextLoader(str(path), tokenizer=corpus["model"], pack=pack, seq_len=64,
                                     batch_size=4, add_eos=add_eos, seed=seed, workers=2)
            got = []
            for b in ld:
                _check_packed(b, 64, True)
                got += b["input_ids"][b["attention_mask"] == 1].tolist()
            st = ld.stats()["packing"]
            assert st["empty"] == n_empty
            assert st["documents"] == len(docs) - n_empty
            want = sum(len(sp.encode(d)) + (1 if add_eos else 0) for d in docs if sp.encode(d))
            assert len(got) == want


def test_padded_document_without_tokens_is_a_data_error_naming_the_line(corpus, tmp_path):
    path = tmp_path / "nbsp.txt"
    path.write_text("first words\n\u00a0\nlast words\n", encoding="utf-8")
    ld = feedline.TextLoader(str(path), tokenizer=corpus["model"], batch_size=1, shuffle=False)
    it = iter(ld)
    next(it)
    with pytest.raises(feedline.DataError, match=r"nbsp\.txt:2: empty document \(the text has no tokens\)"):
        next(it)
    assert next(it)["input_ids"].shape[0] == 1
    skip = feedline.TextLoader(str(path), tokenizer=corpus["model"], batch_size=1, shuffle=False,
                               on_error="skip")
    assert len(list(skip)) == 3
    assert skip.stats()["error_count"] == 1


def _long_line(rng, chars, n):
    return "".join(rng.choice(list(chars), size=n))


@pytest.mark.parametrize("add_bos,add_eos", [(False, False), (True, True)])
def test_a_document_far_longer_than_max_length_gives_its_first_tokens_exactly(corpus, tmp_path,
                                                                             add_bos, add_eos):
    """A document is tokenized only as far as its kept tokens need: a run without spaces (CJK,
    base64) and a long text with spaces give python sentencepiece's first max_length ids of the
    whole document, padded and packed; the cut is counted."""
    sp = corpus["sp"]
    rng = np.random.default_rng(3)
    no_spaces = _long_line(rng, "東京データkalomi", 300_000)
    spaced = " ".join(corpus["docs"] * 30)
    short = corpus["docs"][0]
    path = tmp_path / "long.txt"
    path.write_text("\n".join([no_spaces, short, spaced]) + "\n", encoding="utf-8")
    for max_length in (1, 64, 3000):
        ld = feedline.TextLoader(str(path), tokenizer=corpus["model"], batch_size=1,
                                 max_length=max_length, shuffle=False, add_bos=add_bos,
                                 add_eos=add_eos, return_index=True)
        got = _collect(ld)
        for i, doc in enumerate([no_spaces, short, spaced]):
            want = ([sp.bos_id()] if add_bos else []) + sp.encode(doc) + (
                [sp.eos_id()] if add_eos else [])
            assert got[i] == want[:max_length], (max_length, i)
        cut = ld.stats()["truncation"]
        assert cut["partly_tokenized"] == 2 and cut["documents"] >= 2  # the two long ones
    # Packed: the same first tokens of each document, in rows.
    ld = feedline.TextLoader(str(path), tokenizer=corpus["model"], pack="concat", seq_len=128,
                             batch_size=2, max_length=200, shuffle=False)
    got = [t for b in ld for t in b["input_ids"][b["attention_mask"] == 1].tolist()]
    assert got == [t for d in (no_spaces, short, spaced) for t in sp.encode(d)[:200]]
    assert ld.stats()["packing"]["cut_partly"] == 2


def test_tokenizing_a_huge_line_without_spaces_is_bounded_by_max_length(corpus, tmp_path):
    """An 8 MB line without spaces, max_length=512: the loader's peak memory grows by far less
    than the line's SentencePiece lattice (before: ~250 MiB per MiB of text, 2 GB here, and
    ~16 s: every token made, then all but 512 dropped)."""
    rng = np.random.default_rng(4)
    path = tmp_path / "huge.txt"
    path.write_text(_long_line(rng, "東京データkalomi", 8 << 20) + "\nshort line\n",
                    encoding="utf-8")
    script = f"""
import resource, feedline
ld = feedline.TextLoader({str(path)!r}, tokenizer={corpus["model"]!r}, batch_size=1,
                         max_length=512, shuffle=False, workers=1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lengths = [int(b["lengths"][0]) for b in ld]
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(lengths, grew // 1024)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    lengths, grew_mb = out.stdout.split("]")
    assert lengths.strip("[ ").split(", ")[0] == "512"
    assert int(grew_mb) < 300, out.stdout
