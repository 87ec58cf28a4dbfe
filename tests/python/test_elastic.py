"""Elastic resume: a state saved at world size W, resumed at W' (more ranks or fewer, another
worker count) with resplit=True. The samples of the epoch no rank had delivered come exactly
once over the W' ranks, none that was delivered comes again, and the next epoch is what a fresh
run at W' gives. Images, token windows and padded text."""

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


def test_packed_rows_refuse_a_resplit_clearly(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(200, dtype=np.uint16).tofile(path)
    np.array([0, 50, 120, 200], dtype=np.uint64).tofile(tmp_path / "t.idx")
    ld = feedline.TokenLoader(str(path), index=str(tmp_path / "t.idx"), pack="concat",
                              seq_len=16, batch_size=2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="resplit"):
        ld.load_state_dict(ld.state_dict(), resplit=True)
