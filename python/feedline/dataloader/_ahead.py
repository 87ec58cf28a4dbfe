"""The next epoch's first batches before iter() asks for them (feedline.DataLoader).

torch's samplers draw an epoch's order at iter(), from torch's RNG (and the loader's and the
sampler's generators): the order is known only then, and the workers start on the epoch's
first batch only then, while the trainer waits a whole batch's time. When the sampler is one
of torch's own, which draw nothing but those RNGs and change nothing else, the order iter()
will draw can be drawn before it on a copy: the RNG states are saved, the draws made as
iter() makes them, and the states put back, so the trainer's RNG streams are untouched. The
engine then starts the next epoch's first batches with that order once this epoch's are all
made (its head start), and iter() keeps them only if its own draws give the same order and
base seed; anything that changed the RNGs or the sampler in between (a draw in the training
step, set_epoch on a DistributedSampler, a new batch size) gives another order, and the head
start is dropped. At an epoch's end (after the last training step) the order is drawn again
if the RNG moved since, and the head start made again with it: a training step that draws from
torch's RNG at every step keeps the head start. A training and a validation loader that
alternate draw from the same RNG (each one's iter() moves what the other's next order is drawn
from): when one's iter() draws, the others between their epochs draw their next order again,
and their head starts are made again with it (the work done with the old order is lost, but
not the next epoch's start). Worker processes with persistent_workers only: they see the data
set as it was when they started, whenever the sample is made; a data set changed between
epochs is seen by torch's new workers of a non-persistent loader, and by feedline's then too,
so those load nothing ahead.
"""

import os
import threading
import weakref

import torch
import torch.utils.data as tud
import torch.utils.data.distributed as tudd

# torch's samplers: their order is a function of the RNG states and their own arguments.
_PURE_SAMPLERS = (tud.SequentialSampler, tud.RandomSampler, tud.SubsetRandomSampler,
                  tud.WeightedRandomSampler, tudd.DistributedSampler)
# The window of an epoch's last batches in which the next order is foreseen: the engine starts
# the next epoch once every batch of this one is made, a few batches before its end.
WINDOW = 8
# Foreseen orders that iter() would not draw (the RNG moved since) before giving up for the
# epoch: a training step that draws from torch's RNG moves it at every batch.
TRIES = 2
# The loaders that foresaw an order: when one's iter() draws from torch's RNG, the others
# between their epochs draw theirs again (moved).
FORESEEN = weakref.WeakSet()


class Foresight:
    """An order foreseen: the RNG states it was drawn from, the base seed and the batches."""

    def __init__(self, states, base_seed, batches):
        self.states, self.base_seed, self.batches = states, base_seed, batches
        self.tries = 1
        self.usable = True  # False: not an order the engine's next run can be started with


def eligible(loader):
    """Whether the loader's next orders may be drawn ahead (see the module's docstring)."""
    if loader._is_iterable or not loader.persistent_workers or loader._executor != "process":
        return False
    if os.environ.get("FEEDLINE_EPOCH_HEAD_START") == "0" or loader._resume is not None:
        return False
    sampler = _sampler(loader)
    return sampler is not None and type(sampler) in _PURE_SAMPLERS


def _sampler(loader):
    """The sampler iter() draws from (a batch_sampler's own, when one was given), or None when
    batches come from anything but torch's BatchSampler."""
    if not loader._auto_collation:
        return loader.sampler
    if type(loader.batch_sampler) is not tud.BatchSampler:
        return None
    return loader.batch_sampler.sampler


def _generators(loader):
    gens = []
    for g in (loader.generator, getattr(_sampler(loader), "generator", None)):
        if isinstance(g, torch.Generator) and all(g is not h for h in gens):
            gens.append(g)
    return gens


def states(loader):
    """The RNG states the next iter()'s draws depend on."""
    return [torch.get_rng_state()] + [g.get_state() for g in _generators(loader)]


def same_states(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def draw(loader):
    """iter()'s draws, in its order: the workers' base seed, then the sampler's batches."""
    base_seed, _ = loader._next_base_seed()
    batches = [list(b) if loader._auto_collation else [b] for b in loader._index_sampler]
    return base_seed, batches


def foresee(loader, current):
    """The next iter()'s (base seed, batches), drawn on the RNG states `current` and put back
    as they were: a Foresight."""
    gens = _generators(loader)
    try:
        base_seed, batches = draw(loader)
    finally:
        torch.set_rng_state(current[0])
        for g, s in zip(gens, current[1:]):
            g.set_state(s)
    return Foresight(current, base_seed, batches)


def moved(drawer):
    """`drawer`'s iter() has drawn from torch's RNG: the orders the other loaders foresaw on
    its earlier state are drawn again (a training loader's iter() moves the RNG a validation
    loader's next order is drawn from, and the other way round). Only those iterated on this
    thread: a loader is one thread's at a time, and another thread may be at its iter()."""
    me = threading.get_ident()
    for loader in list(FORESEEN):
        if loader is not drawer and loader._iter_thread == me:
            loader._foresee_again()
