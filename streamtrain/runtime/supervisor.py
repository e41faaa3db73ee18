"""A tiny process supervisor: start a `Command`'s children, restart the ones that exit
unexpectedly (with exponential backoff, counting restarts), stop them all on request.

Every local job runs under one (`streamtrain.local.LocalJob`, and through it `job run`, the
demo and the Python API): what Kubernetes (restartPolicy: Always, CrashLoopBackOff) does for a
real deployment, reduced to one machine. Children run in their own session, so a Ctrl-C in the
terminal reaches only the supervisor, which then stops them in order: SIGTERM, a grace period,
SIGKILL for stragglers. On Linux each child also asks the kernel for SIGTERM should the
supervisor die without cleaning up (PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no
stray process.

Children start warm (warm.py): forked from a server that has imported the command's code
(`Command.preload`: for streamtrain, torch and the job's code) once, so a start or a restart
imports nothing, however many come at once: started cold, a restarted trainer spends most of
its recovery importing (bench/RESULTS.md, docs/chaos.md). If the fork server cannot start a
child, that child and every later one starts as a new interpreter (`Command.argv`).

Not thread-safe: calls must not overlap (`LocalJob` starts its children before its poller
thread runs, then makes every call under one lock). A child started as a new interpreter gets its parent-death
signal when the thread that started it ends, not the process (PR_SET_PDEATHSIG follows the
thread): start children from a thread that lives as long as they should. A warm child's
follows the fork server instead, which ends with the supervisor's process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .command import Command
from .warm import Forked
from .warm import start as start_warm

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    """One supervised command and what happened to it so far."""

    name: str
    args: Sequence[str] | Callable[[], Sequence[str]]  # a callable is evaluated at every (re)start
    log_path: Path
    proc: subprocess.Popen | Forked | None = None
    state: str = "new"  # new | running | restarting | retired | stopped
    retired: bool = False  # not restarted once it exits (`Supervisor.retire`)
    restarts: int = 0
    last_exit: int | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    backoff_s: float = 0.0
    pids: list[int] = field(default_factory=list)  # every pid this child ever had

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


_EXTERNAL = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def restart_backoff(previous_s: float, ran_s: float, returncode: int, *, min_s: float, max_s: float,
                    healthy_after_s: float) -> float:
    """How long to wait before restarting a child that exited with `returncode` after `ran_s`.

    Backing off is for a child that fails by itself, again and again, soon after it starts (a
    bad config, a service it cannot reach): its wait doubles up to `max_s`. A child killed by a
    signal from outside (SIGKILL, SIGTERM, SIGINT, SIGHUP: an operator, the OOM killer, a chaos
    test) did not fail: it restarts at once, since a successor takes its predecessor's place
    without waiting (jobstate/predecessors.py) and the start itself (an interpreter, torch) is
    what bounds a loop of such kills. One that ran at least `healthy_after_s` was not
    crash-looping: it restarts after `min_s`, so a job under repeated kills recovers in seconds
    rather than waiting out a backoff grown to `max_s`. A crash by signal (SIGSEGV, SIGABRT) is
    its own failure."""
    if -returncode in _EXTERNAL:
        return 0.0
    if ran_s >= healthy_after_s or not previous_s:
        return min_s
    return min(previous_s * 2, max_s)


class Supervisor:
    """Starts children as `command ARGS`, with `env` added to this process's environment and
    stdout/stderr appended to `<log_dir>/<name>.log`."""

    def __init__(self, command: Command, env: Mapping[str, str], log_dir: Path, *, min_backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, healthy_after_s: float = 10.0,
                 grace_s: float = 15.0, warm: bool = True) -> None:
        """`warm`: children forked from the fork server (warm.py); otherwise each start is a
        new interpreter."""
        self.command = command
        self.env = {**os.environ, **env}
        self.log_dir = log_dir
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.healthy_after_s = healthy_after_s
        self.grace_s = grace_s
        self.warm = warm
        self.children: dict[str, Child] = {}
        self.stopping = False
        self._events: list[str] = []  # said by the next poll()
        log_dir.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, args: Sequence[str] | Callable[[], Sequence[str]]) -> Child:
        """Start `command ARGS` as `name`; `args` may be a callable, evaluated at every
        (re)start, for a command that must resume where its predecessor stopped. A retired
        child of that name is supervised again (started if it has exited), with these args."""
        child = self.children.get(name)
        if child is not None and not child.retired:
            raise ValueError(f"child {name!r} already supervised")
        if child is None:
            child = self.children[name] = Child(name, args, self.log_dir / f"{name}.log")
        child.args = args if callable(args) else list(args)
        child.retired = False
        if child.state in ("new", "retired"):
            if child.state == "retired":
                child.restarts += 1
            try:
                self._spawn(child)
            except Exception:
                # Retried by poll() as a failed restart is, whoever catches this.
                child.state, child.backoff_s = "restarting", self.min_backoff_s
                child.restart_at = time.monotonic() + child.backoff_s
                raise
        return child

    def retire(self, name: str) -> None:
        """Let child `name` run until it exits by itself, then not restart it (a shard the job
        was resized without stops once its slots are others'). Unknown names are ignored."""
        child = self.children.get(name)
        if child is None or child.retired:
            return
        child.retired = True
        if child.state == "restarting":
            child.state = "retired"

    def running(self, name: str) -> bool:
        """Whether child `name` is supervised and not retired."""
        child = self.children.get(name)
        return child is not None and not child.retired

    def _spawn(self, child: Child) -> None:
        args = list(child.args() if callable(child.args) else child.args)  # may raise: see poll()
        with open(child.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} supervisor: starting {child.name} "
                      f"(restart {child.restarts}): {self.command.name} {' '.join(args)}\n".encode())
            log.flush()
            child.proc = self._forked(args, child.log_path)
            if child.proc is None:
                child.proc = subprocess.Popen(
                    [*self.command.argv, *args], env=self.env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        child.pids.append(child.proc.pid)
        child.state = "running"
        child.started_at = time.monotonic()

    def _forked(self, args: list[str], log_path: Path) -> Forked | None:
        """The child forked warm, or None (not warm, or the fork server failed: then no more)."""
        if not self.warm:
            return None
        try:
            return start_warm(self.command, args, log_path, self.env)
        except Exception as exc:  # noqa: BLE001  a new interpreter does as well, only slower
            self.warm = False
            self._events.append(f"warm starts failed ({exc!r}); every start is a new interpreter from now on")
            return None

    def poll(self) -> list[str]:
        """Notice exits and start due restarts; returns a line per event (for the view's log)."""
        events: list[str] = []
        if self.stopping:
            return events
        now = time.monotonic()
        for child in self.children.values():
            if child.state == "running" and child.proc is not None and (code := child.proc.poll()) is not None:
                child.last_exit = code  # the returncode
                ran = now - child.started_at
                if child.retired:
                    child.state = "retired"
                    events.append(f"{child.name} exited with {child.last_exit} after {ran:.0f} s; retired, "
                                  "not restarted")
                    continue
                child.backoff_s = restart_backoff(child.backoff_s, ran, code, min_s=self.min_backoff_s,
                                                  max_s=self.max_backoff_s, healthy_after_s=self.healthy_after_s)
                child.restart_at = now + child.backoff_s
                child.state = "restarting"
                events.append(f"{child.name} exited with {child.last_exit} after {ran:.0f} s; "
                              f"restarting in {child.backoff_s:.0f} s")
            if child.state == "restarting" and now >= child.restart_at:
                child.restarts += 1
                try:
                    self._spawn(child)
                except Exception as exc:  # noqa: BLE001  a failed start is retried like a crash
                    child.backoff_s = min(max(child.backoff_s, self.min_backoff_s) * 2, self.max_backoff_s)
                    child.restart_at = now + child.backoff_s
                    events.append(f"{child.name} could not start ({exc}); retrying in {child.backoff_s:.0f} s")
                    continue
                assert child.proc is not None  # _spawn made it
                how = "warm" if isinstance(child.proc, Forked) else "a new interpreter"
                events.append(f"{child.name} restarted (pid {child.proc.pid}, restart {child.restarts}, {how})")
        said, self._events = self._events, []
        return said + events

    def stop(self) -> list[str]:
        """SIGTERM every running child, wait up to the grace period, SIGKILL the rest, reap all.
        Returns the names of the children that had to be killed."""
        self.stopping = True
        running = [(c, c.proc) for c in self.children.values() if c.proc is not None and c.proc.poll() is None]
        for child, proc in running:
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child, proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        killed = []
        for child, proc in running:
            if proc.poll() is None:
                killed.append(child.name)
                _signal(proc, signal.SIGKILL)
                proc.wait(10)
        for child in self.children.values():
            if child.proc is not None:
                child.last_exit = child.proc.poll() if child.state == "running" else child.last_exit
            child.state = "stopped"
        return killed

    # Copies first (one C call each): another thread may add a child meanwhile (LocalJob's
    # poller adds the shards a resize brings).
    def all_pids(self) -> list[int]:
        return [pid for child in list(self.children.values()) for pid in child.pids]

    @property
    def restarts(self) -> dict[str, int]:
        return {name: c.restarts for name, c in list(self.children.items())}


def _signal(proc: subprocess.Popen | Forked, sig: int) -> None:
    try:
        # The child leads its own process group: signal the group, so anything it spawned goes too.
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
