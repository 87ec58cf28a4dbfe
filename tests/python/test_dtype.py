"""Float output on the CPU: normalised with mean/std, in float32 / float16 / bfloat16, agreeing
with the same conversion done by torch on the uint8 batch (the CUDA kernel computes the same)."""

import pytest
import torch

import feedline

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _reference(u8, layout, mean=MEAN, std=STD):
    shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    m = torch.tensor(mean).view(shape)
    s = torch.tensor(std).view(shape)
    return (u8.float() / 255 - m) / s


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", torch.float16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float_batches_are_normalised_uint8_batches(small_folder, dtype, layout):
    kw = dict(batch_size=5, size=40, resize_size=48, layout=layout, seed=2)
    u8 = [x for x, _ in feedline.ImageLoader(small_folder, **kw)]
    fl = [x for x, _ in feedline.ImageLoader(small_folder, dtype=dtype, **kw)]
    want = getattr(torch, str(dtype).replace("torch.", ""))
    assert len(u8) == len(fl)
    for a, b in zip(u8, fl):
        assert b.dtype == want and b.shape == a.shape
        ref = _reference(a, layout)
        # float32: the same arithmetic; 16-bit types: torch's own rounding of that value
        assert torch.equal(b, ref.to(want)) or (b.float() - ref).abs().max() < 1e-6


def test_custom_mean_std(small_folder):
    kw = dict(batch_size=4, size=32, seed=1, shuffle=False)
    a = next(iter(feedline.ImageLoader(small_folder, **kw)))[0]
    b = next(iter(feedline.ImageLoader(small_folder, dtype="float32", mean=(0.5, 0.5, 0.5),
                                       std=(0.5, 0.5, 0.5), **kw)))[0]
    assert torch.allclose(b, a.float() / 127.5 - 1, atol=1e-6)
    assert b.min() >= -1 and b.max() <= 1


def test_bad_dtype_mean_std(small_folder):
    with pytest.raises(ValueError, match="dtype"):
        feedline.ImageLoader(small_folder, dtype="int16")
    with pytest.raises(ValueError, match="std"):
        feedline.ImageLoader(small_folder, dtype="float32", std=(0.2, 0.0, 0.2))
    with pytest.raises(TypeError, match="mean"):
        feedline.ImageLoader(small_folder, mean=(0.5, 0.5))
