"""Elastic resume: a state saved at world size W, resumed at W' (more ranks or fewer, another
worker count) with resplit=True. The samples of the epoch no rank had delivered come exactly
once over the W' ranks, none that was delivered comes again, and the next epoch is what a fresh
run at W' gives. Images, token windows, padded text, and packed rows (text and tokens, from the
states of every saved rank: each token once)."""

import collections
import shutil
import subprocess

import numpy as np
import pytest

import feedline


def _index(batch):
    return (batch[2] if isinstance(batch, tuple) else batch["index"]).tolist()


def _epoch_indices(loader):
    return [i for b in loader for i in _index(b)]


def _elastic(make, world, new_world, batches, exact):
    """Runs `world` ranks for `batches` batches, saves rank 0's state, resumes on `new_world`
    ranks; checks the epoch is delivered once over both, then the next epoch."""
    before = []
    olds = [make(r, world, workers=1 + r % 2) for r in range(world)]
    for ld in olds:
        it = iter(ld)
        for _ in range(batches):
            before += _index(next(it))
    states = [ld.state_dict() for ld in olds]
    assert all(s == dict(states[0], rank=s["rank"]) for s in states)  # every rank: one position
    state = states[world - 1]  # any rank's serves
    news = [make(r, new_world, workers=1 + (r + 1) % 2) for r in range(new_world)]
    after = []
    lengths = set()
    for ld in news:
        ld.load_state_dict(state, resplit=True)
        got = _epoch_indices(ld)
        lengths.add(len(got))
        after += got
    # even_shards: every new rank the same number of samples (hence of batches); without it
    # (distributed evaluation) they differ by one at most.
    assert max(lengths) - min(lengths) <= (1 if exact else 0)
    assert not set(before) & set(after), "a delivered sample came again"
    whole = _epoch_indices(make(0, 1))
    assert set(before) | set(after) == set(whole)
    if exact:  # even_shards=False: nothing padded, so each sample exactly once
        assert sorted(before + after) == sorted(whole)
    else:  # DistributedSampler's padding: fewer than new_world repeats, of the rest only
        repeats = len(after) - len(set(after))
        assert 0 <= repeats < new_world
    # The next epoch: as a fresh run at new_world gives it.
    for r, ld in enumerate(news):
        fresh = make(r, new_world)
        fresh.set_epoch(1)
        assert _epoch_indices(ld) == _epoch_indices(fresh)


@pytest.mark.parametrize("world,new_world", [(4, 2), (4, 3), (2, 4), (1, 3)])
@pytest.mark.parametrize("even", [False, True])
def test_images_resume_exactly_on_another_world_size(small_folder, world, new_world, even):
    def make(rank, w, workers=1):
        return feedline.ImageLoader(small_folder, batch_size=2, size=32, seed=5, rank=rank,
                                    world_size=w, return_index=True, even_shards=even,
                                    workers=workers, epoch_head_start=False)
    _elastic(make, world, new_world, batches=2, exact=not even)


def test_a_resplit_state_resumes_again_on_a_third_layout(small_folder):
    """4 ranks -> 3 -> 2, a few batches at each: the epoch still comes whole, once."""
    def make(rank, w):
        return feedline.ImageLoader(small_folder, batch_size=2, size=32, seed=8, rank=rank,
                                    world_size=w, return_index=True, even_shards=False,
                                    workers=1)
    seen = []
    state = None
    for world in (4, 3, 2):
        ranks = [make(r, world) for r in range(world)]
        for ld in ranks:
            if state is not None:
                ld.load_state_dict(state, resplit=True)
            it = iter(ld)
            seen += _index(next(it))
        state = ranks[0].state_dict()
        assert state["skipped"] > 0 or world == 4
    for r in range(2):
        ld = make(r, 2)
        ld.load_state_dict(state, resplit=True)
        seen += _epoch_indices(ld)
    assert collections.Counter(seen) == collections.Counter(range(26))


def test_tokens_resume_exactly_on_another_world_size(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(64 * 17, dtype=np.uint16).tofile(path)  # 64 windows of 16 + 1

    def make(rank, w, workers=1):
        return feedline.TokenLoader(str(path), seq_len=16, batch_size=3, seed=2, rank=rank,
                                    world_size=w, return_index=True, workers=workers)
    _elastic(make, 4, 3, batches=2, exact=False)
    _elastic(make, 2, 4, batches=3, exact=False)


@pytest.mark.skipif(shutil.which("spm_train") is None, reason="spm_train missing")
def test_padded_text_resumes_exactly_on_another_world_size(tmp_path):
    docs = [" ".join(["word"] * (1 + i % 7) + [f"n{i}"]) for i in range(50)]
    txt = tmp_path / "docs.txt"
    txt.write_text("\n".join(docs) + "\n")
    subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={tmp_path / 'm'}",
                    "--vocab_size=40", "--hard_vocab_limit=false", "--minloglevel=2"],
                   check=True, capture_output=True)

    def make(rank, w, workers=1):
        return feedline.TextLoader(str(txt), tokenizer=str(tmp_path / "m.model"), batch_size=4,
                                   seed=3, rank=rank, world_size=w, return_index=True,
                                   workers=workers)
    _elastic(make, 4, 2, batches=2, exact=False)
    _elastic(make, 3, 4, batches=1, exact=False)


def _tokens(batch):
    """The real tokens of a packed batch (attention_mask 1), in order."""
    return batch["input_ids"][batch["attention_mask"].bool()].tolist()


def _packed_elastic(make, world, new_world):
    """Packed rows (concat): every rank of `world` takes a different number of batches (so their
    cursors differ, some inside a document), each saves its state; `new_world` ranks each load
    the list of all of them. Every token of the epoch comes exactly once over before and after;
    a state saved after the resplit resumes that layout exactly; the next epoch is a fresh
    new_world run's."""
    whole = collections.Counter(t for b in make(0, 1) for t in _tokens(b))
    before, states = collections.Counter(), []
    for r in range(world):
        ld = make(r, world)
        it = iter(ld)
        for _ in range(1 + r % 3):
            before.update(_tokens(next(it)))
        states.append(ld.state_dict())
        del it
    assert len({(s["document"], s["offset"]) for s in states}) > 1 or world == 1
    after = collections.Counter()
    for r in range(new_world):
        ld = make(r, new_world)
        ld.load_state_dict(states[::-1], resplit=True)  # any order
        it = iter(ld)
        first = next(it, None)
        if first is None:
            continue
        after.update(_tokens(first))
        state = ld.state_dict()  # mid-epoch on the new layout: it carries the old cursors
        assert state["resplit_from"]["world_size"] == world
        rest = [_tokens(b) for b in it]
        again = make(r, new_world)
        again.load_state_dict(state)  # the same layout, no resplit
        assert [_tokens(b) for b in again] == rest
        for toks in rest:
            after.update(toks)
        # The next epoch: a fresh new_world run's.
        fresh = make(r, new_world)
        fresh.set_epoch(1)
        assert [_tokens(b) for b in ld] == [_tokens(b) for b in fresh]
    assert sum((before + after).values()) == sum(whole.values())
    assert before + after == whole, "a token lost or repeated"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Documents of 2 to ~60 tokens and their SentencePiece model."""
    tmp = tmp_path_factory.mktemp("corpus")
    docs = [" ".join(["alpha", "beta", "gamma", "delta"][i % 4:] * (1 + i % 9) + [f"n{i}"])
            for i in range(120)]
    txt = tmp / "docs.txt"
    txt.write_text("\n".join(docs) + "\n")
    if shutil.which("spm_train") is None:
        pytest.skip("spm_train missing")
    subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={tmp / 'm'}",
                    "--vocab_size=60", "--hard_vocab_limit=false", "--minloglevel=2"],
                   check=True, capture_output=True)
    return txt, tmp / "m.model"


@pytest.mark.parametrize("world,new_world", [(4, 2), (4, 3), (2, 4), (1, 3), (3, 3)])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # ranks without torch.distributed
def test_packed_text_resumes_exactly_on_another_world_size(corpus, world, new_world):
    txt, model = corpus

    def make(rank, w):
        return feedline.TextLoader(str(txt), tokenizer=str(model), pack="concat", seq_len=24,
                                   batch_size=2, seed=4, add_eos=True, rank=rank, world_size=w,
                                   workers=1 + rank % 2)
    _packed_elastic(make, world, new_world)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_packed_tokens_resume_exactly_on_another_world_size(tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, size=90)
    path = tmp_path / "t.bin"
    rng.integers(0, 1000, size=int(lengths.sum())).astype(np.uint16).tofile(path)
    np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64).tofile(tmp_path / "t.idx")

    def make(rank, w):
        return feedline.TokenLoader(str(path), index=str(tmp_path / "t.idx"), pack="concat",
                                    seq_len=16, batch_size=2, seed=6, rank=rank, world_size=w)
    _packed_elastic(make, 4, 3)
    _packed_elastic(make, 2, 3)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_packed_resplit_refusals_name_what_is_missing(tmp_path, corpus):
    path = tmp_path / "t.bin"
    np.arange(400, dtype=np.uint16).tofile(path)
    np.array([0, 50, 120, 200, 260, 400], dtype=np.uint64).tofile(tmp_path / "t.idx")

    def make(rank, w, pack="concat"):
        return feedline.TokenLoader(str(path), index=str(tmp_path / "t.idx"), pack=pack,
                                    seq_len=16, batch_size=2, rank=rank, world_size=w)
    states = []
    for r in range(2):
        ld = make(r, 2)
        next(iter(ld))
        states.append(ld.state_dict())
    with pytest.raises(ValueError, match="every rank"):
        make(0, 3).load_state_dict(states[:1], resplit=True)  # one rank of two
    with pytest.raises(ValueError, match="once"):
        make(0, 3).load_state_dict([states[0], states[0]], resplit=True)
    with pytest.raises(ValueError, match="every rank"):
        make(0, 3).load_state_dict(states[0], resplit=True)  # a dict: only for one rank
    with pytest.raises(TypeError, match="list"):
        make(0, 2).load_state_dict(states)  # a list without resplit
    later = make(1, 2)
    later.set_epoch(2)  # (epoch 1's start would be a rank that finished epoch 0: accepted)
    with pytest.raises(ValueError, match="epochs"):
        make(0, 3).load_state_dict([states[0], later.state_dict()], resplit=True)
    done = make(1, 2)
    done.set_epoch(1)
    make(0, 3).load_state_dict([states[0], done.state_dict()], resplit=True)
    # Resplit once an epoch: a state of a resplit epoch resumes only its own layout.
    mid = make(0, 3)
    mid.load_state_dict(states, resplit=True)
    again = [mid.state_dict()] + [make(r, 3) for r in (1, 2)]
    again[1:] = [ld.state_dict() for ld in again[1:]]
    with pytest.raises(ValueError, match="once an epoch"):
        make(0, 2).load_state_dict(again, resplit=True)
    # Best fit: a rank's state does not say which documents its window's rows held.
    fits = [make(r, 2, pack="bestfit").state_dict() for r in range(2)]
    with pytest.raises(ValueError, match="concat"):
        make(0, 3, pack="bestfit").load_state_dict(fits, resplit=True)
    # A planted cursor past a rank's documents.
    bad = [dict(s) for s in states]
    bad[1]["document"] = 99
    bad[1]["documents"] = dict(bad[1]["documents"], batches_done=99)
    with pytest.raises(ValueError, match="outside"):
        make(0, 3).load_state_dict(bad, resplit=True)
