"""feedline.DataLoader across epochs: the next epoch's first batches are made before iter()
asks for them when its order can be foreseen, and never change what an epoch gives."""

import collections
import os
import time

import pytest
import torch
import torch.utils.data as tud
import torch.utils.data.distributed as tudd

import feedline


class Logged(tud.Dataset):
    """Each sample says when it was made (a line per sample in its worker's file) and carries
    a draw from torch's RNG (seeded per sample in feedline's worker processes)."""

    def __init__(self, directory, n=32):
        self.directory, self.n = directory, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        draw = torch.rand(2)
        with open(os.path.join(self.directory, f"made.{os.getpid()}"), "a") as f:
            f.write(f"{i} {time.monotonic()} {draw[0].item()!r}\n")
        return torch.full((3,), float(i)), draw


def _made(directory, draws=False):
    """(key, time) of every sample made, in no order; (key, time, its first draw) with
    `draws`."""
    out = []
    for name in os.listdir(directory):
        if name.startswith("made."):
            with open(os.path.join(directory, name)) as f:
                for k, t, d in (line.split() for line in f):
                    out.append((int(k), float(t), float(d)) if draws else (int(k), float(t)))
    return out


def _epochs(loader, epochs, between=None):
    """Each epoch's batches (keys, draws), and the RNG state after each iter()."""
    out, states = [], []
    for e in range(epochs):
        if between is not None:
            between(e)
        it = iter(loader)
        states.append(torch.get_rng_state())
        out.append([(b[0][:, 0].long().tolist(), b[1]) for b in it])
    return out, states


def _same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert [k for k, _ in ea] == [k for k, _ in eb]
        for (_, x), (_, y) in zip(ea, eb):
            assert torch.equal(x, y)


def _own_collate(samples):
    """A collate_fn of the user's: worker processes make whole batches with it (no layout)."""
    return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])


COLLATES = [pytest.param({}, id="in-place"),
            pytest.param({"collate_fn": _own_collate}, id="own-collate_fn")]


def _loader(ds, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    return feedline.DataLoader(ds, num_workers=2, **kw)


def _run(tmp_path, name, monkeypatch, head_start, epochs=4, between=None, **kw):
    d = tmp_path / name
    d.mkdir()
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "1" if head_start else "0")
    torch.manual_seed(7)
    loader = _loader(Logged(str(d)), **kw)
    got = _epochs(loader, epochs, between)
    loader.close()
    return got


@pytest.mark.parametrize("collate", COLLATES)
def test_the_next_epochs_first_batches_are_made_before_iter_asks(tmp_path, collate):
    d = str(tmp_path)
    torch.manual_seed(0)
    loader = _loader(Logged(d), **collate)
    for _ in range(2):  # (in place: the first epoch learns the layout first)
        for _ in loader:
            pass
    time.sleep(1.0)  # the trainer's last step, a validation pass: the workers are free
    made = _made(d)  # (each sample is made once an epoch)
    first = next(iter(loader))
    keys = set(first[0][:, 0].long().tolist())
    times = {k: sum(1 for j, _ in made if j == k) for k in keys}
    assert times == {k: 3 for k in keys}  # epochs 0 and 1, and epoch 2's head start
    loader.close()


def _alternate(tmp_path, name, monkeypatch, head_start, rounds=3):
    """A training loader (shuffled) and a validation loader (in order) alternating for
    `rounds` epochs each, the training steps taking their time: each pass's batches (keys,
    draws), and for each pass whether a sample of its first batch (its key and its draw: the
    next pass's head start makes the same keys with other draws) was made after its iter()."""
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "1" if head_start else "0")
    for part in ("train", "val"):
        (tmp_path / name / part).mkdir(parents=True)
    torch.manual_seed(0)
    loaders = {"train": _loader(Logged(str(tmp_path / name / "train"))),
               "val": _loader(Logged(str(tmp_path / name / "val"), n=16), shuffle=False)}
    passes, made_after = [], []
    for _ in range(rounds):
        for part, loader in loaders.items():
            t = time.monotonic()
            it = iter(loader)
            batches = []
            for b in it:
                batches.append((b[0][:, 0].long().tolist(), b[1]))
                if part == "train":
                    time.sleep(0.05)
            passes.append(batches)
            made_after.append(_first_made_after(str(tmp_path / name / part), batches, t))
            time.sleep(0.25)  # the trainer between the passes (logging, a checkpoint)
    for loader in loaders.values():
        loader.close()
    return passes, made_after


def test_a_validation_loader_has_its_first_batch_made_while_training_runs(tmp_path, monkeypatch):
    """Training and validation alternate, and each one's iter() draws from torch's RNG what the
    other's next pass depends on (its workers' base seed): each loader's next order is drawn
    again when the other's iter() has drawn, and its head start made with it, so the first
    batch of every pass but the first round's is made before iter() is called, with the keys
    and draws the loaders give with the head start off."""
    on, made_after = _alternate(tmp_path, "on", monkeypatch, True)
    off, made_after_off = _alternate(tmp_path, "off", monkeypatch, False)
    _same(on, off)
    # Round 0 learns the layout (train, val); from then on, nothing of a first batch is made
    # after its iter().
    assert made_after[2:] == [False] * 4, made_after
    assert made_after_off == [True] * 6  # (the test fails with the head start off)


def _first_made_after(directory, batches, t):
    """Whether a sample of the first of `batches` (its key and its draw: a next pass's head
    start makes the same keys with other draws) was made after the time `t`."""
    first = {(k, float(d[0])) for k, d in zip(batches[0][0], batches[0][1])}
    return any((k, d) in first and when > t for k, when, d in _made(directory, True))


def test_training_steps_that_draw_from_torchs_rng_keep_the_head_start(tmp_path, monkeypatch):
    """Each training step draws from torch's RNG (an augmentation in the loop, on the CPU):
    the order foreseen near the epoch's end is stale by its last step, so it is drawn again at
    the epoch's end and the head start made again with it. Every epoch's first batch after the
    first two is made before its iter(), and the batches and RNG states are those of the head
    start off."""
    def run(name, head_start):
        monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "1" if head_start else "0")
        (tmp_path / name).mkdir()
        torch.manual_seed(3)
        loader = _loader(Logged(str(tmp_path / name)))
        epochs, made_after, states = [], [], []
        for _ in range(4):
            t = time.monotonic()
            batches = []
            for b in loader:
                batches.append((b[0][:, 0].long().tolist(), b[1]))
                torch.rand(3)  # the step's own draw
                time.sleep(0.03)
            states.append(torch.get_rng_state())
            epochs.append(batches)
            made_after.append(_first_made_after(str(tmp_path / name), batches, t))
            time.sleep(0.25)  # the trainer between epochs (logging, a checkpoint)
        loader.close()
        return epochs, made_after, states

    on, made_after, on_states = run("on", True)
    off, made_after_off, off_states = run("off", False)
    _same(on, off)
    assert all(torch.equal(a, b) for a, b in zip(on_states, off_states))
    assert made_after[1:] == [False] * 3, made_after
    assert made_after_off == [True] * 4


@pytest.mark.parametrize("collate", COLLATES)
def test_a_head_start_changes_no_batch_and_no_rng_state(tmp_path, monkeypatch, collate):
    on = _run(tmp_path, "on", monkeypatch, True, **collate)
    off = _run(tmp_path, "off", monkeypatch, False, **collate)
    _same(on[0], off[0])
    assert all(torch.equal(a, b) for a, b in zip(on[1], off[1]))
    # Each sample made once an epoch, and at most once more: the fifth epoch's head start.
    made = collections.Counter(k for k, _ in _made(str(tmp_path / "on")))
    assert set(made) == set(range(32)) and set(made.values()) <= {4, 5}
    assert sum(made.values()) - 4 * 32 <= 32
    # The order is torch's DataLoader's for the same seed (whose iter() draws a base seed and
    # then the sampler's order at every epoch, as feedline's does).
    torch.manual_seed(7)
    ref = tud.DataLoader(Logged(str(tmp_path / "off")), batch_size=4, shuffle=True,
                         num_workers=2)
    assert [k for k, _ in on[0][2]] == [k for k, _ in _epochs(ref, 3)[0][2]]


def test_a_draw_between_epochs_gives_the_order_iter_draws(tmp_path, monkeypatch):
    def draw(e):  # the training loop draws from torch's RNG between epochs
        if e:
            torch.rand(5)

    on = _run(tmp_path, "on", monkeypatch, True, between=draw)
    off = _run(tmp_path, "off", monkeypatch, False, between=draw)
    _same(on[0], off[0])
    assert all(torch.equal(a, b) for a, b in zip(on[1], off[1]))


@pytest.mark.parametrize("generator", [False, True])
def test_set_epoch_and_generators_give_the_order_iter_draws(tmp_path, monkeypatch, generator):
    def sampler_and_gen(name):
        ds = Logged(str(tmp_path / name))
        gen = torch.Generator().manual_seed(3) if generator else None
        return dict(sampler=tudd.DistributedSampler(ds, num_replicas=2, rank=1, seed=5)
                    if not generator else tud.RandomSampler(ds, generator=gen),
                    generator=gen, shuffle=None)

    results = []
    for head_start in (True, False):
        name = f"hs{int(head_start)}"
        (tmp_path / name).mkdir()
        monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "1" if head_start else "0")
        torch.manual_seed(7)
        kw = sampler_and_gen(name)
        loader = feedline.DataLoader(Logged(str(tmp_path / name)), batch_size=4, num_workers=2,
                                     **kw)

        def set_epoch(e, kw=kw):
            if hasattr(kw["sampler"], "set_epoch"):
                kw["sampler"].set_epoch(e)

        results.append(_epochs(loader, 4, set_epoch)[0])
        loader.close()
    _same(results[0], results[1])
    assert [k for k, _ in results[0][2]] != [k for k, _ in results[0][3]]


def test_a_broken_off_epoch_and_a_resume_drop_the_head_start(tmp_path, monkeypatch):
    def broken(head_start):
        d = tmp_path / f"b{int(head_start)}"
        d.mkdir()
        monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "1" if head_start else "0")
        torch.manual_seed(11)
        loader = _loader(Logged(str(d)))
        out = []
        for e in range(3):
            out.append([b[0][:, 0].long().tolist() for b in loader])
        state = None
        it = iter(loader)
        for i, b in enumerate(it):  # broken off mid-epoch, its state saved
            if i == 5:
                state = loader.state_dict()
            if i == 6:
                break
        rest = [b[0][:, 0].long().tolist() for b in loader]  # a new epoch
        loader.load_state_dict(state)
        resumed = [b[0][:, 0].long().tolist() for b in loader]
        loader.close()
        return out, rest, resumed

    assert broken(True) == broken(False)


@pytest.mark.parametrize("persistent", [None, True, False])
def test_the_rng_draws_are_torchs_for_its_persistent_workers_argument(tmp_path, persistent):
    """torch's iter() draws a base seed and the sampler's order at every epoch, except with
    persistent_workers=True after the first (its iterator is reset: the sampler's order only).
    Left out, feedline keeps its workers and draws as torch's default (False) does."""
    runs = []
    for name, make in (("torch", tud.DataLoader), ("feedline", feedline.DataLoader)):
        (tmp_path / name).mkdir()
        kw = {} if persistent is None else dict(persistent_workers=persistent)
        torch.manual_seed(5)
        loader = make(Logged(str(tmp_path / name)), batch_size=4, shuffle=True, num_workers=2,
                      **kw)
        batches, states = _epochs(loader, 3)
        runs.append(([[k for k, _ in e] for e in batches], states))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_a_resume_with_persistent_workers_true_continues_the_run(tmp_path):
    def loader(name):
        (tmp_path / name).mkdir()
        return feedline.DataLoader(Logged(str(tmp_path / name)), batch_size=4, shuffle=True,
                                   num_workers=2, persistent_workers=True)

    torch.manual_seed(9)
    a = loader("a")
    list(a)
    it = iter(a)  # the second epoch, which draws no base seed
    for _ in range(3):
        next(it)
    state = a.state_dict()
    assert state["base_seed"] is not None
    rest = [(b[0][:, 0].long().tolist(), b[1]) for b in it]
    after = _epochs(a, 1)[0]
    a.close()
    torch.manual_seed(1234)  # another process's RNG: the state brings the run's back
    b = loader("b")
    b.load_state_dict(state)
    _same([rest], [[(x[0][:, 0].long().tolist(), x[1]) for x in b]])
    _same(after, _epochs(b, 1)[0])
    b.close()


class CountsItsEpochs(tud.Sampler):
    """A sampler of the user's own: its order may depend on anything (here, how often it was
    iterated), so feedline never iterates it ahead of iter()."""

    def __init__(self, n):
        self.n, self.iterated = n, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        self.iterated += 1
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.iterated))
                    .tolist())


@pytest.mark.parametrize("as_batch_sampler", [False, True])
def test_a_sampler_of_the_users_own_is_iterated_only_by_iter(tmp_path, as_batch_sampler):
    sampler = CountsItsEpochs(32)
    kw = (dict(batch_sampler=tud.BatchSampler(sampler, 4, False)) if as_batch_sampler
          else dict(sampler=sampler, batch_size=4))
    loader = feedline.DataLoader(Logged(str(tmp_path)), num_workers=2, **kw)
    orders = [[k for k, _ in e] for e in _epochs(loader, 4)[0]]
    loader.close()
    assert sampler.iterated == 4
    for e, order in enumerate(orders):
        want = torch.randperm(32, generator=torch.Generator().manual_seed(e + 1)).tolist()
        assert [k for b in order for k in b] == want
