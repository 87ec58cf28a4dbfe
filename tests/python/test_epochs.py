"""Sampling: every sample exactly once per epoch, epochs, set_epoch, drop_last, shards."""

import math

import numpy as np
import pytest

import feedline
import util


def _epoch_indices(loader):
    out, labels, sizes = [], [], []
    for images, y, idx in loader:
        assert images.shape[0] == y.shape[0] == idx.shape[0]
        sizes.append(int(images.shape[0]))
        out += idx.tolist()
        labels += y.tolist()
    return out, labels, sizes


@pytest.mark.parametrize("batch_size", [8, 7, 61, 100])
def test_each_sample_exactly_once(image_folder, batch_size):
    loader = feedline.ImageLoader(image_folder, batch_size=batch_size, size=32,
                                  return_index=True, seed=3)
    n = len(loader.samples)
    assert n == 61
    assert len(loader) == math.ceil(n / batch_size)
    idx, labels, sizes = _epoch_indices(loader)
    assert sorted(idx) == list(range(n))
    assert labels == [loader.samples[i][1] for i in idx]
    assert len(sizes) == len(loader)
    assert all(s == batch_size for s in sizes[:-1])
    assert sizes[-1] == n - batch_size * (len(sizes) - 1)


def test_drop_last(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=8, size=32, drop_last=True,
                                  return_index=True)
    n = len(loader.samples)
    assert len(loader) == n // 8
    idx, labels, sizes = _epoch_indices(loader)
    assert sizes == [8] * (n // 8)
    assert len(set(idx)) == len(idx) == 8 * (n // 8)
    assert labels == [loader.samples[i][1] for i in idx]


def test_shuffle_false_is_dataset_order(image_folder):
    loader = feedline.ImageLoader(image_folder, batch_size=8, size=32, shuffle=False,
                                  return_index=True)
    for _ in range(2):  # every epoch
        idx, labels, _ = _epoch_indices(loader)
        assert idx == list(range(len(loader.samples)))
        assert labels == loader.targets


def test_epochs_differ_and_set_epoch_reproduces(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32, seed=9,
                                  return_index=True)
    epochs = [util.collect_epoch(loader) for _ in range(3)]
    orders = [np.concatenate(e[2]).tolist() for e in epochs]
    n = len(loader.samples)
    for order in orders:
        assert sorted(order) == list(range(n))
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]

    loader.set_epoch(1)
    again = util.collect_epoch(loader)
    assert np.concatenate(again[2]).tolist() == orders[1]
    for a, b in zip(again[0], epochs[1][0]):  # the same crops and flips
        assert np.array_equal(a, b)
    # and the following iteration is epoch 2
    after = util.collect_epoch(loader)
    assert np.concatenate(after[2]).tolist() == orders[2]

    # a new loader with the same seed, set to epoch 2, gives epoch 2
    other = feedline.ImageLoader(small_folder, batch_size=4, size=32, seed=9,
                                 return_index=True)
    other.set_epoch(2)
    third = util.collect_epoch(other)
    assert np.concatenate(third[2]).tolist() == orders[2]
    for a, b in zip(third[0], epochs[2][0]):
        assert np.array_equal(a, b)


def test_unfinished_epoch_still_advances(small_folder):
    """Each iter() starts the next epoch even when the previous one was abandoned."""
    kw = dict(batch_size=4, size=32, seed=4, return_index=True)
    full = feedline.ImageLoader(small_folder, **kw)
    e0 = np.concatenate(util.collect_epoch(full)[2]).tolist()
    e1 = np.concatenate(util.collect_epoch(full)[2]).tolist()
    part = feedline.ImageLoader(small_folder, **kw)
    for _, _, idx in part:
        assert idx.tolist() == e0[:4]
        break
    assert np.concatenate(util.collect_epoch(part)[2]).tolist() == e1


def test_set_epoch_rejects_bad_values(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4)
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch"):
        loader.set_epoch("1")


@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_partition_the_epoch(image_folder, drop_last):
    n = 61
    world = 3
    per_rank, lens = [], set()
    for rank in range(world):
        loader = feedline.ImageLoader(image_folder, batch_size=4, size=32, seed=5,
                                      rank=rank, world_size=world, drop_last=drop_last,
                                      return_index=True)
        idx, labels, _ = _epoch_indices(loader)
        assert len(idx) == loader.num_samples
        assert len(set(idx)) == len(idx)
        assert labels == [loader.samples[i][1] for i in idx]
        lens.add((len(loader), loader.num_samples))
        per_rank.append(idx)
    assert len(lens) == 1, f"ranks disagree on the epoch length: {lens}"
    everything = sum(per_rank, [])
    if drop_last:
        assert len(set(everything)) == len(everything)  # disjoint
    else:
        assert set(everything) == set(range(n))        # complete; padding repeats a few
        assert len(everything) == world * math.ceil(n / world)
