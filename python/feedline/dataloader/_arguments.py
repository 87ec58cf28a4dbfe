"""feedline.DataLoader's arguments: checked as torch's DataLoader checks them (the same errors,
the same words), and the sampling torch's arguments describe (sampler and batch sampler)."""

import inspect

import torch
import torch.utils.data as tud

# torch's own default: 2 up to torch 1.13 (which accepts prefetch_factor=2 with num_workers=0),
# None from torch 2.0 (which refuses any prefetch_factor there).
_TORCH_PREFETCH_DEFAULT = inspect.signature(tud.DataLoader.__init__).parameters[
    "prefetch_factor"].default


def check_arguments(num_workers, timeout, executor, on_error, pad, pad_value, collate_fn,
                    multiprocessing_context, prefetch_factor):
    """Raises as torch's DataLoader for its arguments, and names feedline's own; returns the
    multiprocessing context (a start method's name resolved to its context)."""
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, int)):
        raise TypeError(f"num_workers: expected an int, got {type(num_workers).__name__}")
    if num_workers is not None and num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if executor not in ("auto", "thread", "process"):
        raise ValueError(f"executor: expected 'auto', 'thread' or 'process', got {executor!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error: expected 'raise' or 'skip', got {on_error!r}")
    if not (pad is None or isinstance(pad, (bool, dict))):
        raise TypeError(f"pad: expected True, False or a dict {{name: bound}}, got "
                        f"{type(pad).__name__}")
    if isinstance(pad, dict):
        for k, v in pad.items():
            ok = v is True or v is False or (isinstance(v, int) and v > 0) or (
                isinstance(v, (tuple, list)) and all(
                    m is None or (isinstance(m, int) and not isinstance(m, bool) and m > 0)
                    for m in v))
            if not ok:
                raise ValueError(f"pad[{k!r}]: expected True, a positive int or a tuple of "
                                 f"bounds (None: fixed), got {v!r}")
    if pad and collate_fn is not None:
        raise ValueError("pad: your collate_fn collates the batch; pad= applies to feedline's "
                         "own collation (leave collate_fn=None)")
    if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
        raise TypeError(f"pad_value: expected a number, got {type(pad_value).__name__}")
    if multiprocessing_context is not None:
        import multiprocessing as _mp
        if num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process "
                             f"loading (num_workers > 0), but got num_workers={num_workers}")
        if isinstance(multiprocessing_context, str):
            valid = _mp.get_all_start_methods()
            if multiprocessing_context not in valid:
                raise ValueError("multiprocessing_context option should specify a valid start "
                                 f"method in {valid!r}, but got multiprocessing_context="
                                 f"{multiprocessing_context!r}")
            multiprocessing_context = _mp.get_context(multiprocessing_context)
        elif not isinstance(multiprocessing_context, _mp.context.BaseContext):
            raise TypeError("multiprocessing_context option should be a valid context object "
                            "or a string specifying the start method, but got "
                            f"multiprocessing_context={multiprocessing_context}")
    if prefetch_factor not in (None, _TORCH_PREFETCH_DEFAULT) and num_workers == 0:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                         "let num_workers > 0 to enable multiprocessing.")
    return multiprocessing_context


def sampling(dataset, is_iterable, batch_size, shuffle, sampler, batch_sampler, drop_last,
             generator, seed):
    """(dataset, batch_size, drop_last, sampler, batch_sampler, generator) as torch's DataLoader
    makes them from its arguments: a DataPipe's shufflers set by `shuffle`, a generator seeded
    from `seed` when none is given, the default samplers."""
    if is_iterable:
        if isinstance(dataset, tud.IterDataPipe):
            # As torch: shuffle= turns the pipe's Shuffler stages on or off.
            if shuffle is not None:
                dataset = torch.utils.data.graph_settings.apply_shuffle_settings(
                    dataset, shuffle=shuffle)
        elif shuffle not in (None, False):
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle}")
        if sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                             f"option, but got sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified "
                             f"batch_sampler option, but got batch_sampler={batch_sampler}")
    else:
        shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        batch_size = None
        drop_last = False
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
    if generator is None and seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    if sampler is None:
        if is_iterable:
            sampler = tud.dataloader._InfiniteConstantSampler()
        elif shuffle:
            sampler = tud.RandomSampler(dataset, generator=generator)
        else:
            sampler = tud.SequentialSampler(dataset)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
    return dataset, batch_size, drop_last, sampler, batch_sampler, generator
