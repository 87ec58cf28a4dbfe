"""Checkpoints of feedline.DataLoader: state_dict() and load_state_dict(), every field checked."""

import hashlib


def _order_fingerprint(batches):
    h = hashlib.sha1()
    for b in batches:
        h.update(repr(list(b)).encode())
        h.update(b";")
    return h.hexdigest()



class _Resume:
    """DataLoader's checkpoint methods (a mixin: the loader's own attributes)."""

    def state_dict(self):
        """Where the loader is: resumes exactly mid-epoch (map-style; the epoch's order is
        re-drawn from the saved RNG states and checked)."""
        it = self._iterator
        if self._is_iterable:
            state = getattr(self.dataset, "state_dict", None)
            return {"version": 1, "iterable": True,
                    "dataset": state() if callable(state) else None}
        done = it._batches_done if it is not None and not it._finished else None
        st = {"version": 1, "epochs_started": self._epochs_started,
              "sampler_epoch": getattr(self.sampler, "epoch", None)}
        if done is not None and self._epoch_state is not None:
            st.update(self._epoch_state, batches_done=done)
        return st

    def load_state_dict(self, state):
        _check_state(state, self._is_iterable)
        if state.get("iterable"):
            load = getattr(self.dataset, "load_state_dict", None)
            if state.get("dataset") is not None and callable(load):
                load(state["dataset"])
            return
        if state.get("sampler_epoch") is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(state["sampler_epoch"])
        self._epochs_started = state.get("epochs_started", 0)
        self._resume = state if "batches_done" in state else None


def _check_state(state, iterable):
    """Every field of a DataLoader state checked before use (ValueError or TypeError naming
    it): a checkpoint is a file anyone who can write it hands in."""
    if not isinstance(state, dict):
        raise TypeError("load_state_dict: expected the dict from state_dict(), got "
                        f"{type(state).__name__}")
    if state.get("version") != 1:
        raise ValueError("load_state_dict: not a feedline.DataLoader state (no version 1)")
    if "dataset_fingerprint" in state or "documents" in state:
        raise ValueError("load_state_dict: this is the state of a feedline.ImageLoader, "
                         "TextLoader or TokenLoader, not of a feedline.DataLoader")
    if bool(state.get("iterable")) != iterable:
        raise ValueError("load_state_dict: made for " +
                         ("an IterableDataset" if state.get("iterable") else "a map-style dataset")
                         + ", but this loader's dataset is not one")
    if iterable:
        return

    def integer(key, low=0, high=None, required=False):
        if key not in state or state[key] is None:
            if required:
                raise ValueError(f"load_state_dict: the state has no '{key}'")
            return None
        v = state[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"load_state_dict: '{key}' must be an int, got {type(v).__name__}")
        if v < low or (high is not None and v > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"load_state_dict: '{key}' must be {bound} (got {v})")
        return v

    integer("epochs_started")
    integer("sampler_epoch")
    if "batches_done" in state:
        for key in ("rng_state", "order"):
            if not isinstance(state.get(key), (bytes, str)):
                raise ValueError(f"load_state_dict: a mid-epoch state needs '{key}' "
                                 "(bytes or str), as state_dict() gives it")
        g = state.get("generator_state")
        if g is not None and not isinstance(g, bytes):
            raise TypeError("load_state_dict: 'generator_state' must be bytes or None")
        integer("base_seed", 0, 2**63 - 1)
        batches = integer("batches", required=True)
        integer("batches_done", 0, batches, required=True)
