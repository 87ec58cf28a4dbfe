"""feedline.DataLoader: torch's DataLoader, on feedline's engine.

    loader = feedline.DataLoader(dataset, batch_size=64, shuffle=True)  # num_workers: feedline's

takes every argument torch's DataLoader takes and gives the same batches. What changes is how
the work is done: map-style datasets run on feedline's engine (python/py_dataset.h) — positions
of the epoch's order claimed by C++ worker threads, each sample made by a persistent forked
worker process (as torch's workers: the training process keeps its GIL, its RNGs and its life
when a sample crashes) and written in place into the batch slot (torch's default_collate
semantics, see _collate.py); or, with ``executor="thread"`` or keys that are not ints, each
batch made whole by an engine thread under the GIL. ``num_workers=N`` makes N worker processes,
as torch's (batch k made by worker k mod N); how many work at once is tuned by the engine. Left
out, one per core (``workers=N`` fixes it). ``num_workers=0`` loads in the calling thread.

With workers, the training process never calls the dataset. In place needs the batch layout,
which the worker processes learn from their first batch: the first batch of each worker is
made whole by torch's collation, as torch's workers make it, every later one in place. In
worker processes every sample's RNGs are seeded from (the epoch's base seed, the sample's index
in the epoch): the same seed gives the same augmentations for any worker count and after a
resume.

Iterable datasets run one replica per worker (``get_worker_info()`` set), batches taken round
robin as torch takes them.

Modules: loader.py (the class: arguments, attributes, epochs, stats), _arguments.py (torch's
argument checks, samplers), _executor.py (executor choice, worker processes, the engine run),
_iterators.py (a map-style epoch's batches), _iterable.py (IterableDatasets), _resume.py
(checkpoints), _runtime.py (per-process state: exit, get_worker_info in threads, errors).
"""

from .loader import DataLoader

__all__ = ["DataLoader"]
