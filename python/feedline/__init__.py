"""feedline: a high-throughput data loader that replaces torch's DataLoader.

    import feedline
    loader = feedline.ImageLoader("data/train", batch_size=256)
    for epoch in range(90):
        for images, labels in loader:      # uint8 [B, 3, 224, 224], int64 [B]
            ...

The work happens in C++ threads (read -> decode -> batch slot); batches reach Python as torch
tensors through DLPack without a copy. Each ``iter(loader)`` starts the next epoch.

One module per face: image.py (ImageLoader), text.py (TextLoader), tokens.py (TokenLoader),
video.py (VideoLoader), dataloader/ (DataLoader, imported when first asked for: it imports
torch).
"""

from . import _feedline
from ._feedline import DataError, DeviceError
from .image import ImageLoader
from .mix import Mix
from .text import TextLoader
from .tokens import TokenLoader
from .video import VideoLoader

__all__ = ["DataLoader", "ImageLoader", "Mix", "TextLoader", "TokenLoader", "VideoLoader", "DataError",
           "DeviceError", "build_info", "__version__"]

__version__ = _feedline.build_info()["version"]


def __getattr__(name):
    if name == "DataLoader":  # imports torch: only when asked for
        from .dataloader import DataLoader
        return DataLoader
    raise AttributeError(f"module 'feedline' has no attribute {name!r}")


def build_info():
    """Version and compiled features: a dict."""
    return _feedline.build_info()
