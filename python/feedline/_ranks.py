"""Every rank the same number of steps: the ranks of a packed loader agree on each step.

Packed rows (TextLoader and TokenLoader with pack=) put each document on one rank, so a rank's
rows per epoch depend on its documents' lengths and are known only once they are tokenized. A
rank that stopped early would leave the others waiting in their next collective (DDP's gradient
all-reduce, FSDP's all-gather) until the job times out. So, each step, the ranks agree through
the job's own torch.distributed process group whether any of them still has rows: while one
has, a rank that has none takes a batch of padding rows (labels -100, attention_mask 0: no loss,
no gradient; counted in stats()["packing"]["padding_rows"]); when none has, every rank's epoch
ends at the same step.

The agreement is one all-reduce of one int per step over gloo (CPU tensors, no device sync): the
default group when it is gloo, else a gloo group of the same ranks made once per loader (an NCCL
all-reduce would need a device tensor and a host sync per step).
"""

import warnings


def _agreement(owner):
    """The step agreement for an epoch of `owner` (a packed loader), or None: one rank, or no
    torch.distributed (warned once: the ranks then take steps as their rows come)."""
    if getattr(owner, "pack", None) is None or owner.world_size <= 1:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        if not getattr(owner, "_ranks_warned", False):
            owner._ranks_warned = True
            warnings.warn(
                f"feedline.{type(owner).__name__}: world_size={owner.world_size} without "
                "torch.distributed initialized: packed rows may give the ranks different numbers "
                "of steps this epoch; call torch.distributed.init_process_group before iter() "
                "and the ranks agree on every step", RuntimeWarning, stacklevel=4)
        return None
    group = getattr(owner, "process_group", None)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if (world, rank) != (owner.world_size, owner.rank):
        raise ValueError(
            f"process_group: rank {rank} of {world}, but the loader is rank {owner.rank} of "
            f"world_size {owner.world_size}: pass the group of the ranks that split the data "
            "(process_group=) or leave rank and world_size unset")
    if dist.get_backend(group) != "gloo":
        if group is not None:
            raise ValueError("process_group: the step agreement needs a gloo group (this one is "
                             f"{dist.get_backend(group)}): make one with "
                             "torch.distributed.new_group(ranks, backend='gloo')")
        if getattr(owner, "_gloo_group", None) is None:
            # Every rank makes it at its loader's first epoch, in the same order (a collective).
            owner._gloo_group = dist.new_group(backend="gloo")
        group = owner._gloo_group
    return _StepAgreement(group)


class _StepAgreement:
    """Each step: does any rank still have rows? One gloo all-reduce (MAX) of one int."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self._dist = dist
        self._group = group
        self._flag = torch.zeros(1, dtype=torch.int32)

    def any_left(self, mine):
        self._flag.fill_(1 if mine else 0)
        self._dist.all_reduce(self._flag, op=self._dist.ReduceOp.MAX, group=self._group)
        return bool(self._flag.item())
