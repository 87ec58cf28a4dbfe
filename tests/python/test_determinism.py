"""Everything random comes from (seed, epoch, sample index), never from thread timing."""

import numpy as np
import pytest

import feedline
import util


def _run(folder, epochs=1, **kw):
    args = dict(batch_size=8, seed=5, return_index=True)
    args.update(kw)
    loader = feedline.ImageLoader(folder, **args)
    out = []
    for _ in range(epochs):
        out.append(util.collect_epoch(loader))
    return out


def _same(a, b):
    for ea, eb in zip(a, b):
        if len(ea[0]) != len(eb[0]):
            return False
        for part in range(3):
            if not all(np.array_equal(u, v) for u, v in zip(ea[part], eb[part])):
                return False
    return len(a) == len(b)


def test_same_seed_same_bytes_whatever_the_resources(image_folder):
    ref = _run(image_folder, epochs=2, workers=1, prefetch=1)
    for kw in (dict(workers=4, prefetch=8), dict(workers=2, prefetch=2, io_depth=4),
               dict(workers=3, prefetch=1, io_depth=1)):
        assert _same(ref, _run(image_folder, epochs=2, **kw)), kw


def test_different_seeds_differ(image_folder):
    a = _run(image_folder, seed=1)[0]
    b = _run(image_folder, seed=2)[0]
    assert not np.array_equal(np.concatenate(a[2]), np.concatenate(b[2]))  # order
    # without shuffling the order is the same, but crops and flips differ
    a = _run(image_folder, seed=1, shuffle=False)[0]
    b = _run(image_folder, seed=2, shuffle=False)[0]
    assert np.array_equal(np.concatenate(a[2]), np.concatenate(b[2]))
    differing = sum(not np.array_equal(u, v)
                    for u, v in zip(np.concatenate(a[0]), np.concatenate(b[0])))
    assert differing > 0.8 * len(np.concatenate(a[0]))


def test_augmentation_depends_on_sample_not_on_batching(small_folder):
    """A sample's crop is a function of (seed, epoch, sample index): the batch size, and so the
    sample's position in a batch, does not change it."""
    per_index = []
    for bs in (4, 7):
        ep = _run(small_folder, batch_size=bs, size=48)[0]
        images = np.concatenate(ep[0])
        idx = np.concatenate(ep[2])
        per_index.append({int(i): img for i, img in zip(idx, images)})
    assert per_index[0].keys() == per_index[1].keys()
    for i in per_index[0]:
        assert np.array_equal(per_index[0][i], per_index[1][i]), i


@pytest.mark.parametrize("on_layout", ["NHWC"])
def test_determinism_across_runs_and_layouts(small_folder, on_layout):
    a = _run(small_folder, size=40, layout=on_layout, workers=1)
    b = _run(small_folder, size=40, layout=on_layout, workers=4, prefetch=6)
    assert _same(a, b)
