"""Shared by feedline-bench's Python helpers (peer_torch.py, feedline_py.py).

The helpers run one contender for a number of epochs and report, per epoch, the images it
delivered, the wall time and the CPU time of its whole process tree (this process with all its
threads, plus every live descendant: torch's worker processes). They print one line per epoch on
stdout, in a form feedline-bench parses:

    epoch index=0 images=2000 seconds=3.117 cpu_seconds=5.904

and `info key=value ...` lines about the run. Anything else (progress, warnings) goes to stderr.
Peak memory is sampled from the outside by feedline-bench, which sees the whole process tree.
Linux only: the figures come from /proc.
"""

import os
import re
import sys
import time

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may contain spaces and parentheses, so
# the fields are split after the last ')'. Fields after it, 0-based: 1 = ppid, 11 = utime,
# 12 = stime, 13 = cutime, 14 = cstime (man 5 proc: fields 4, 14, 15, 16, 17).
_STAT_TAIL = re.compile(rb"\)\s(.*)$", re.S)


def _stat_fields(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # the process exited meanwhile
        return None
    m = _STAT_TAIL.search(data)
    return m.group(1).split() if m else None


def _descendants(root):
    """Pids of the live descendants of `root` (children, grandchildren, ...)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu_seconds():
    """CPU seconds (user + system) used so far by this process (all its threads), by its
    descendants that are alive, and by the children it has already reaped."""
    me = os.getpid()
    ticks = 0
    fields = _stat_fields(me)
    if fields is not None:
        ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    for pid in _descendants(me):
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _CLK_TCK


def report(kind, **fields):
    """One result line for feedline-bench: `kind key=value ...` (values without spaces)."""
    parts = [kind]
    for key, value in fields.items():
        text = f"{value:.9g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={text.replace(' ', '_')}")
    print(" ".join(parts), flush=True)


def run_epochs(loader, epochs, label):
    """Iterates `loader` for `epochs` epochs, consuming batches as fast as they come, and
    reports each epoch. The CPU figures are read outside the timed span."""
    for e in range(epochs):
        cpu0 = tree_cpu_seconds()
        t0 = time.perf_counter()
        images = 0
        for batch in loader:
            images += int(batch[0].shape[0])
        t1 = time.perf_counter()
        cpu1 = tree_cpu_seconds()
        report("epoch", index=e, images=images, seconds=t1 - t0, cpu_seconds=cpu1 - cpu0)
        print(f"{label}: epoch {e}: {images} images in {t1 - t0:.2f} s "
              f"({images / max(t1 - t0, 1e-9):.1f} images/s)", file=sys.stderr, flush=True)
