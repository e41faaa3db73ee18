"""Warm starts for the supervisor (supervisor.py): a child forked from a server that has
imported what the command's children import (`Command.preload`; for streamtrain, torch above
all), rather than a new interpreter that imports it all again.

A cold restart of a trainer spends most of its recovery importing, and spares imported ahead
stop helping once restarts come faster than spares can import (bench/RESULTS.md,
docs/chaos.md). A fork costs no imports, however many restarts come: the standard library's
fork server (`multiprocessing`'s "forkserver" context, started once, `warm_server` and then
the command's `preload` imported in it) forks each child, which then becomes `NAME ARGS` by
calling the command's `entry`: its own session, the child's log as stdout and stderr, stdin
/dev/null and the supervisor's environment, as a child started with `subprocess` has them. It
gets SIGTERM when the fork server ends, which the server does when the supervisor is gone.

There is one fork server per process, and the `preload` of the first start is what it imports.
`start` returns a `Forked`, which the supervisor handles as a `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
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

from .command import Command

# Imported first by the server, before the command's preload: its own session and signals (its
# docstring). Named from this package's, so that the runtime names nothing outside itself.
SERVER = f"{__package__}.warm_server"
_PR_SET_PDEATHSIG = 1


def _context(command: Command) -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([SERVER, *command.preload])
    return context


class Forked:
    """A child the fork server started, handled as the supervisor handles a `subprocess.Popen`:
    `pid`, `returncode`, `poll`, `wait`, `send_signal`, `kill`."""

    def __init__(self, process: multiprocessing.process.BaseProcess, name: str) -> None:
        self._process = process
        self.name = name
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
            raise subprocess.TimeoutExpired(f"{self.name} (pid {self.pid})", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_START = threading.Lock()


def start(command: Command, args: Sequence[str], log_path: Path, env: Mapping[str, str]) -> Forked:
    """`NAME ARGS` of `command` forked from the fork server (started, and its preload imported,
    by the first call: that one waits for the imports)."""
    process = _context(command).Process(
        target=_become, args=(command.name, command.entry, list(args), str(log_path), dict(env)),
        name=f"{command.name} {' '.join(args)}"[:200])
    # multiprocessing has a child import the parent's main module first, as a library would
    # want; ours may be a program's `__main__`, which would run the command line it was given (a
    # whole `streamtrain job run` again), or a bench. A main module with no name and no file is
    # left alone.
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
    return Forked(process, command.name)


def _become(name: str, entry: str, args: list[str], log_path: str, env: dict[str, str]) -> None:
    """In the forked child: become `NAME ARGS`, as the supervisor starts a child, and call
    `entry` ("module:function")."""
    try:  # ends with the fork server, which ends with the supervisor
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the server ended before that took hold
        os._exit(128 + signal.SIGTERM)
    os.setsid()  # its own process group, as `start_new_session`: signalled as a group
    for sig in (signal.SIGTERM, signal.SIGHUP):  # ignored by the server (warm_server.py)
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
    # The import path a new interpreter (`python -m streamtrain`) would have: the working
    # directory and PYTHONPATH first (a user's decoder module may be found there only).
    first = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.path[:0] = [p for p in first if p not in sys.path]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [name, *args]
    module, _, function = entry.partition(":")
    getattr(importlib.import_module(module), function)()
