"""Warm starts for the supervisor (streamtrain/supervisor.py): a child forked from a server
that has imported what a job's processes import, torch above all, rather than a new
interpreter that imports it all again.

A restarted trainer spent most of its recovery importing (about 3.5 s of 4 here, 5-10 s on a
busy machine: docs/chaos.md). Warm spares, interpreters imported ahead and waiting, helped
until restarts came faster than spares could import: under a restart every 5 s of the chaos
harness, restarts took 4-7 s again (bench/RESULTS.md). A fork costs no imports, however many
restarts come: the standard library's fork server (`multiprocessing`'s "forkserver" context,
started once, `PRELOAD` imported in it) forks each child, which then becomes `streamtrain
ARGS`: its own session, the child's log as stdout and stderr, stdin /dev/null and the
supervisor's environment, as a child started with `subprocess` has them. It gets SIGTERM when
the fork server ends, which the server does when the supervisor is gone.

`start` returns a `Forked`, which the supervisor handles as a `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext
from pathlib import Path

PRELOAD = (
    "streamtrain.warm_server",  # first: the server's own session and signals (its docstring)
    "torch",  # most of it
    "streamtrain.params.optimizer_kernels",  # numba, the shards' update rules
    "streamtrain.master.service",
    "streamtrain.pserver.shard",
    "streamtrain.trainer.worker",
    "streamtrain.cli",
)
_PR_SET_PDEATHSIG = 1


def _context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


class Forked:
    """A child the fork server started, handled as the supervisor handles a `subprocess.Popen`:
    `pid`, `returncode`, `poll`, `wait`, `send_signal`, `kill`."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        assert process.pid is not None  # a started process
        self.pid: int = process.pid
        self.returncode: int | None = None
        # Its exit code is read once from a pipe: a poll from the supervisor's thread and
        # another from a thread adding a child must not both read it.
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self.returncode = self._process.exitcode
                if self.returncode is not None:
                    self._process.close()  # its pipe from the server: a job restarts children for days
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            with contextlib.suppress(OSError, ValueError):  # exited and closed meanwhile
                multiprocessing.connection.wait([self._process.sentinel], timeout)
        code = self.poll()  # the returncode
        if code is None:
            raise subprocess.TimeoutExpired(f"streamtrain (pid {self.pid})", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_START = threading.Lock()


def start(args: Sequence[str], log_path: Path, env: Mapping[str, str]) -> Forked:
    """`streamtrain ARGS` forked from the fork server (started, and `PRELOAD` imported, by the
    first call: that one waits for the imports)."""
    process = _context().Process(target=_become, args=(list(args), str(log_path), dict(env)),
                                 name=f"streamtrain {' '.join(args)}"[:200])
    # multiprocessing has a child import the parent's main module first, as a library would
    # want; ours may be `streamtrain/__main__.py`, which runs the command line it was given (a
    # whole `job run` again), or a bench. A main module with no name and no file is left alone.
    with _START:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main
        # Out of multiprocessing's own list of children: it would poll their exit codes at the
        # next start, from whatever thread that is, and join them without a timeout at exit.
        # The supervisor polls and stops its children itself.
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]  # private: not in the stubs
    return Forked(process)


def _become(args: list[str], log_path: str, env: dict[str, str]) -> None:
    """In the forked child: become `streamtrain ARGS` as the supervisor starts a child."""
    try:  # ends with the fork server, which ends with the supervisor
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the server ended before that took hold
        os._exit(128 + signal.SIGTERM)
    os.setsid()  # its own process group, as `start_new_session`: signalled as a group
    for sig in (signal.SIGTERM, signal.SIGHUP):  # ignored by the server (streamtrain/warm_server.py)
        signal.signal(sig, signal.SIG_DFL)
    # The fork server ends when no process holds its "alive" pipe any more, and it hands every
    # child one, so that a child may fork through it too. Ours do not: held, a supervisor
    # killed would leave the server and its children (which end with the server) running.
    alive = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    # The import path `python -m streamtrain` would have: the working directory and PYTHONPATH
    # first (a user's decoder module may be found there only).
    first = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.path[:0] = [p for p in first if p not in sys.path]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["streamtrain", *args]
    from streamtrain.cli import main

    main()
