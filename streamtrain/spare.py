"""A warm spare for the supervisor (streamtrain/supervisor.py): a process that has already
imported what a job's processes import, torch above all, and waits to be told which
`streamtrain` command to become.

A restarted trainer spent most of its recovery importing (about 3.5 s of 4 here, more on a
busy machine: docs/chaos.md); a spare becomes it at once. The supervisor writes one JSON line
to the spare's stdin, `{"args": [...], "log": "<path>"}`: the spare points its stdout and
stderr at that log, reads no more input, and runs `streamtrain ARGS` in this process. End of
file instead (the supervisor stopping, or gone) exits 0.

    python -m streamtrain.spare
"""

from __future__ import annotations

import json
import os
import sys


def preload() -> None:
    """What the job's processes import, so the command starts without it."""
    import torch  # noqa: F401  most of it

    import streamtrain.jobstate.optimizer_kernels  # noqa: F401  numba, the shards' update rules
    import streamtrain.master.service  # noqa: F401
    import streamtrain.pserver.shard  # noqa: F401
    import streamtrain.trainer.worker  # noqa: F401


def become(order: bytes) -> list[str]:
    """Take the supervisor's order: the log becomes stdout and stderr, stdin /dev/null, as
    a child the supervisor starts itself has them. Returns the command's arguments."""
    request = json.loads(order)
    args, log = request["args"], request["log"]
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args) and isinstance(log, str)):
        raise ValueError(f"not a spare's order: {order[:200]!r}")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return args


def main() -> None:
    preload()
    order = sys.stdin.buffer.readline()
    if not order.strip():
        return
    args = become(order)
    sys.argv = ["streamtrain", *args]
    from streamtrain.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
