"""Which CPUs a job's trainers run on, when one machine runs several (Linux CPU affinity).

A trainer and its loader process hand a chunk of examples over a socket and then work on it
in turn; left to the scheduler on a 2-core machine running ten processes of a job, both
trainers migrate between the cores all run long, and their caches with them. Each trainer
(and so its loader, which inherits the mask) gets its own share of the CPUs instead: in eight
paired end-to-end runs the job was faster pinned in six, by 11% on the geometric mean of the
pairs (bench/RESULTS.md, session 42). Shards, the master and the services are left to the
scheduler, to fill whatever the trainers leave idle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from streamtrain.infra.errors import InfraError


def available() -> tuple[int, ...]:
    """The CPUs this process may run on; empty where the platform cannot tell (not Linux)."""
    getter = getattr(os, "sched_getaffinity", None)
    return tuple(sorted(getter(0))) if getter is not None else ()


def share(index: int, count: int, cpus: Sequence[int]) -> tuple[int, ...]:
    """The CPUs of trainer `index` of `count` on a machine with `cpus`: the CPUs cut into
    `count` contiguous runs, as even as they go (the first ones a CPU longer), or, with more
    trainers than CPUs, the CPUs dealt round-robin. Every CPU when there is one trainer or no
    CPU to choose from: nothing to share.

    Raises:
        ValueError: `index` is not in range(count).
    """
    if not 0 <= index < count:
        raise ValueError(f"trainer index {index} of {count}")
    cpus = tuple(cpus)
    if count == 1 or len(cpus) <= 1:
        return cpus
    if count >= len(cpus):
        return (cpus[index % len(cpus)],)
    size, extra = divmod(len(cpus), count)
    start = index * size + min(index, extra)
    return cpus[start:start + size + (index < extra)]


def parse(text: str) -> tuple[int, ...]:
    """A `--cpus` value: CPU numbers separated by commas ("0,2"), ranges allowed ("0-3").

    Raises:
        ValueError: naming the part that is not a CPU number or range.
    """
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"--cpus: {part!r} is not a CPU number or range (e.g. 0,2-3)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"--cpus: {part!r} is an empty range")
        out.extend(range(first, last + 1))
    return tuple(sorted(set(out)))


def pin(cpus: Sequence[int]) -> None:
    """Run every thread of this process, and whatever it starts from now on, on `cpus` only.
    Linux sets the mask a thread at a time and new threads and child processes inherit their
    creator's, so each thread already running is set too.

    Raises:
        InfraError: the platform has no CPU affinity, or a CPU is not one this process may use.
    """
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None:
        raise InfraError("--cpus: this platform has no CPU affinity (Linux only)")
    allowed = set(available())
    wrong = sorted(set(cpus) - allowed)
    if not cpus or wrong:
        raise InfraError(f"--cpus: {', '.join(map(str, wrong)) or 'none given'}: this process may run on "
                         f"CPUs {', '.join(map(str, sorted(allowed)))}")
    for task in os.listdir("/proc/self/task"):
        try:
            setter(int(task), set(cpus))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
