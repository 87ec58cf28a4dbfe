"""Caching within a budget: file bytes and decoded images; hits and misses in stats()."""

import pytest
import torch

import feedline


def _epoch(loader):
    return [(x.clone(), i.clone()) for x, _, i in loader]


def test_bytes_cache_serves_later_epochs_with_the_same_pixels(small_folder, monkeypatch):
    # Hits and misses counted per epoch: no head start of the next epoch (it would count its own).
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    kw = dict(batch_size=4, size=32, seed=3, return_index=True)
    plain = feedline.ImageLoader(small_folder, **kw)
    cached = feedline.ImageLoader(small_folder, cache="bytes", **kw)
    for epoch in range(2):
        a, b = _epoch(plain), _epoch(cached)
        for (xa, ia), (xb, ib) in zip(a, b):
            assert torch.equal(ia, ib) and torch.equal(xa, xb)
        c = cached.stats()["cache"]
        assert c["kind"] == "bytes"
        assert c["misses"] == 26 and c["hits"] == 26 * epoch
    assert 0 < c["bytes"] <= c["budget"]
    assert cached.stats()["bytes_in_use"] >= c["bytes"]


def test_decoded_cache_skips_decode_and_is_consistent_across_epochs(small_folder, monkeypatch):
    # Hits and misses counted per epoch: no head start of the next epoch (it would count its own).
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    kw = dict(batch_size=4, size=32, seed=3, return_index=True, transform="eval", shuffle=False)
    cached = feedline.ImageLoader(small_folder, cache="decoded", **kw)
    first = _epoch(cached)
    second = _epoch(cached)
    for (xa, ia), (xb, ib) in zip(first, second):  # eval: the same pixels from the cache
        assert torch.equal(ia, ib) and torch.equal(xa, xb)
    s = cached.stats()
    assert s["cache"]["hits"] == 26 and s["cache"]["misses"] == 26
    assert s["stages"]["read"]["items"] == 26  # the second epoch read nothing
    # Close to the uncached pipeline (crops come from a bounded-resolution image).
    plain = _epoch(feedline.ImageLoader(small_folder, **kw))
    for (xa, _), (xb, _) in zip(first, plain):
        assert (xa.float() - xb.float()).abs().mean() < 3.0


def test_a_small_budget_caches_part_and_stays_within_it(small_folder):
    loader = feedline.ImageLoader(small_folder, batch_size=4, size=32, cache="bytes",
                                  cache_budget=60_000)
    for _ in range(2):
        for _ in loader:
            pass
    c = loader.stats()["cache"]
    assert c["bytes"] <= 60_000
    assert 0 < c["hits"] < 26  # some samples fit, not all


def test_cache_arguments_are_checked(small_folder):
    with pytest.raises(ValueError, match="cache"):
        feedline.ImageLoader(small_folder, cache="disk")
    with pytest.raises(ValueError, match="cache_budget"):
        feedline.ImageLoader(small_folder, batch_size=4, size=32, cache="bytes",
                             memory_budget="64MiB", cache_budget="1GiB")
