"""A server process we own: started detached, found again by pid file, stopped for good.

Every service (Kafka, etcd, Redis) is one long-running process started with its data dir as
working directory, so a pid file plus a `/proc/<pid>/cwd` check tells our live server from a
reused pid (the command line is no proof: Redis rewrites its process title).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from streamtrain.infra.errors import MissingDependencyError, ServiceStartError


def require(program: str, install: str) -> str:
    """Absolute path of `program`, or an error naming the command that installs it."""
    path = shutil.which(program)
    if path is None:
        raise MissingDependencyError(program, install)
    return path


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie counts as dead (and is reaped if it is our child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class ServerProcess(ABC):
    """One service's process: subclasses say how to prepare, launch and probe it."""

    name: str
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 20.0

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pid_file = data_dir / f"{self.name}.pid"
        self.log_file = data_dir / f"{self.name}.log"

    @abstractmethod
    def command(self) -> list[str]:
        """argv of the server (run with `self.data_dir` as working directory)."""

    @property
    @abstractmethod
    def ports(self) -> tuple[int, ...]:
        """Every port the server listens on."""

    @abstractmethod
    def healthy(self) -> bool:
        """A real client round trip succeeds."""

    @property
    @abstractmethod
    def address(self) -> str:
        """What a client connects to."""

    def prepare(self) -> None:
        """One-time set-up before the first start (formatting storage, writing configs)."""

    def env(self) -> dict[str, str] | None:
        return None

    def pid(self) -> int | None:
        """The pid of our running server, or None (stale pid files are ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return None
        return pid if Path(cwd) == self.data_dir.resolve() else None

    def start(self) -> float | None:
        """Start unless already running; wait until healthy. Returns seconds to ready, or None
        when it was already up."""
        if self.pid() is not None:
            if not wait_until(self.healthy, self.start_timeout_s):
                raise ServiceStartError(f"{self.name} runs but is not healthy; see {self.log_file}")
            return None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            if port_in_use(port):
                raise ServiceStartError(
                    f"{self.name} cannot start: port {port} is already in use by another process "
                    "(choose other ports with --port-base or STREAMTRAIN_PORT_BASE)"
                )
        self.prepare()
        began = time.monotonic()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                env=self.env(),
                # Its own session: Ctrl-C in the terminal that ran `up` must not kill servers.
                start_new_session=True,
            )
        self.pid_file.write_text(f"{proc.pid}\n")

        def exited() -> None:
            if proc.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {proc.returncode} while starting; "
                    f"last lines of {self.log_file}:\n{self.log_tail()}"
                )

        def ready() -> bool:
            exited()
            healthy = self.healthy()
            exited()  # healthy, and still our process answering
            return healthy

        if not wait_until(ready, self.start_timeout_s, interval=0.2):
            self.stop()
            raise ServiceStartError(
                f"{self.name} not healthy after {self.start_timeout_s:.0f} s; "
                f"last lines of {self.log_file}:\n{self.log_tail()}"
            )
        return time.monotonic() - began

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after `stop_timeout_s`. True if a process was stopped."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: not pid_alive(pid), self.stop_timeout_s):
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not pid_alive(pid), 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class OnePortServer(ServerProcess):
    """A server that listens on one port."""

    def __init__(self, data_dir: Path, port: int) -> None:
        super().__init__(data_dir)
        self.port = port

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,)
