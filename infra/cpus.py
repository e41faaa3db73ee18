"""Which CPUs a job's trainers run on, when one machine runs several (Linux CPU affinity).

A trainer and its loader process hand a chunk of examples over a socket and then work on it
in turn. Each trainer (and so its loader, which inherits the mask) gets its own share of the
CPUs rather than every process of the job floating over all of them: paired end-to-end runs
are faster pinned in most pairs, though a machine drifts as much between two runs
(bench/RESULTS.md, "where a step's CPU goes, process by process", "Each trainer on its own
core"). The cost: a trainer's loader competes with it for its share. Shards, the master and
the services are left to the scheduler, to fill whatever the trainers leave idle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from streamtrain.infra.errors import InfraError

_MAX_CPU = 1 << 16  # beyond any CPU number: bounds what a `--cpus` range may expand to


def available() -> tuple[int, ...]:
    """The CPUs this process may run on; empty where the platform cannot tell (not Linux)."""
    getter = getattr(os, "sched_getaffinity", None)
    return tuple(sorted(getter(0))) if getter is not None else ()


def share(index: int, count: int, cpus: Sequence[int]) -> tuple[int, ...]:
    """The CPUs of trainer `index` of `count` on a machine with `cpus`: the CPUs cut into
    `count` contiguous runs, as even as they go (the first ones a CPU longer); with a multiple
    of the CPUs' number of trainers, the CPUs dealt round-robin. Every CPU when no even share
    exists (one trainer, one CPU or none known, or 3 trainers on 2 CPUs, where one CPU would
    carry two trainers and the other one): the scheduler then balances them.

    Raises:
        ValueError: `index` is not in range(count).
    """
    if not 0 <= index < count:
        raise ValueError(f"trainer index {index} of {count}")
    cpus = tuple(cpus)
    if count == 1 or len(cpus) <= 1:
        return cpus
    if count >= len(cpus):
        return (cpus[index % len(cpus)],) if count % len(cpus) == 0 else cpus
    size, extra = divmod(len(cpus), count)
    start = index * size + min(index, extra)
    return cpus[start:start + size + (index < extra)]


def parse(text: str) -> tuple[int, ...]:
    """A `--cpus` value: CPU numbers separated by commas ("0,2"), ranges allowed ("0-3").

    Raises:
        ValueError: naming the part that is not a CPU number or range.
    """
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        if not _number(low) or (dash and not _number(high)):
            raise ValueError(f"--cpus: {part!r} is not a CPU number or range (e.g. 0,2-3)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last >= _MAX_CPU:
            raise ValueError(f"--cpus: {part!r} is {'an empty range' if last < first else 'no CPU number'}")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone takes '²', which int() refuses


def pin(cpus: Sequence[int]) -> None:
    """Run every thread of this process, and whatever it starts from now on, on `cpus` only.
    Linux sets the mask a thread at a time and new threads and child processes inherit their
    creator's, so each thread already running is set too, until a listing finds none new (a
    thread not yet set may start another meanwhile).

    Raises:
        ValueError: a CPU is not one this process may use, or none is given.
        InfraError: the platform has no CPU affinity, or the kernel refused the mask.
    """
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None:
        raise InfraError("--cpus: this platform has no CPU affinity (Linux only)")
    allowed = set(available())
    wrong = sorted(set(cpus) - allowed)
    if not cpus or wrong:
        raise ValueError(f"--cpus: {', '.join(map(str, wrong)) or 'none given'}: this process may run on "
                         f"CPUs {', '.join(map(str, sorted(allowed)))}")
    done: set[str] = set()
    while todo := set(os.listdir("/proc/self/task")) - done:
        for task in todo:
            try:
                setter(int(task), set(cpus))
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
            except OSError as exc:
                raise InfraError(f"--cpus: the kernel refused CPUs {', '.join(map(str, cpus))}: {exc}") from exc
        done |= todo
