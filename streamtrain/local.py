"""A whole job on this machine, from Python: `LocalJob`.

    from streamtrain import JobConfig, LocalJob

    config = JobConfig.load("job.toml")
    with LocalJob(config, trainers=2) as job:   # master, shards and trainers start here
        job.wait_finished(timeout_s=600)        # a bounded job: its last pass is trained
        print(job.status().examples, job.status().auc)
        checkpoint = job.checkpoint()           # a rollback target, taken while it trains
    # leaving the block stops every process: SIGTERM, a grace period, SIGKILL

The job's processes are `python -m streamtrain …` children (`COMMAND`) of one restarting
supervisor (`streamtrain.runtime.supervisor`): one master, `pservers.count` shards pinned to their indexes and N
trainers, each with the endpoints in its environment and its output in `<log dir>/<name>.log`.
A thread of this process restarts a child that exits; nothing needs to be called for that, so
a notebook cell can return while the job trains. The same thread follows the job's shard count
in etcd: after `streamtrain resize` (or `LocalJob.resize`) it starts the shards that join and
lets the ones that leave stop for good; a job resized before has the slot map's count. The
services (`streamtrain up`) and the input topic must exist. `status()` is a
`streamtrain.monitor.Snapshot`, `checkpoint()` a `streamtrain.operations.checkpoints.Checkpoint`
(both exported by `streamtrain`). `streamtrain job run` and `streamtrain demo` (the console)
are built on this class.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from streamtrain.infra import Endpoints, InfraError
from streamtrain.infra.cpus import available, share
from streamtrain.infra.endpoints import state_home
from streamtrain.jobstate.errors import EtcdError
from streamtrain.runtime.command import Command
from streamtrain.runtime.supervisor import Supervisor, pid_alive
from streamtrain.schemas import StreamtrainError
from streamtrain.schemas.config import JobConfig

if TYPE_CHECKING:
    from streamtrain.jobstate.etcd import Etcd
    from streamtrain.monitor import JobMonitor, Snapshot
    from streamtrain.operations.checkpoints import Checkpoint
    from streamtrain.operations.resizing import Resized

POLL_S = 0.2  # how soon an exited child is noticed (its restart backoff starts then)
FOLLOW_S = 1.0  # how soon a resized job's shard count is followed

# What every child of a local job runs: `python -m streamtrain ARGS` as a new interpreter, or,
# forked warm (streamtrain.runtime.warm), `streamtrain.__main__:main` in a server that has
# imported torch and the processes' code once.
COMMAND = Command(
    name="streamtrain",
    argv=(sys.executable, "-m", "streamtrain"),
    entry="streamtrain.__main__:main",
    preload=(
        "torch",  # most of it
        "streamtrain.params.optimizer_kernels",  # numba, the shards' update rules
        "streamtrain.master.service",
        "streamtrain.pserver.shard",
        "streamtrain.trainer.worker",
        "streamtrain.__main__",  # the CLI
    ),
)


def pserver_child(index: int) -> str:
    """The supervisor's name for shard `index`'s process (its log is `<name>.log`)."""
    return f"pserver-{index}"


def shard_of_child(name: str) -> int | None:
    """The shard index of a child `pserver_child` named; None for any other child."""
    index = name.removeprefix("pserver-")
    return int(index) if index != name and index.isascii() and index.isdigit() else None


def trainer_args(job: str, index: int, count: int, cpus: Sequence[int], trainer_id: str | None = None) -> list[str]:
    """The command line of trainer `index` of `count` on a machine whose CPUs (those this
    process may use) are `cpus`: its share of them (`infra.cpus.share`) when it is not all.
    Its id is `trainer-<index>` unless `trainer_id` names another."""
    args = ["trainer", "--job", job, "--id", trainer_id or f"trainer-{index}"]
    mine = share(index, count, cpus)
    if mine != tuple(cpus):
        args += ["--cpus", ",".join(map(str, mine))]
    return args


class LocalJobError(StreamtrainError, RuntimeError):
    """A LocalJob used out of turn: started twice, or asked about before `start()`."""


@dataclass
class LocalJobResult:
    job: str
    duration_s: float
    state: str | None  # the job's state in etcd at the end: running | finished | None
    tasks: dict[str, int]
    restarts: dict[str, int]
    pids: list[int]  # every child process the supervisor ever started
    killed: list[str]  # children that needed SIGKILL
    stray: list[int]  # child pids still alive at the end: should always be empty
    log_dir: str

    def as_dict(self) -> dict:
        return asdict(self)


class LocalJob:
    """`config`'s job as local processes. `job_file`: the file the master reads (default: the
    config written as JSON into the log dir); `log_dir` defaults to
    `<state dir>/jobs/<job>/logs`; `endpoints` to `Endpoints.resolve()`."""

    def __init__(self, config: JobConfig, *, trainers: int = 2, endpoints: Endpoints | None = None,
                 log_dir: Path | None = None, job_file: Path | None = None) -> None:
        if trainers < 0:
            raise ValueError(f"LocalJob: trainers must be >= 0, got {trainers}")
        self.config = config
        self.trainers = trainers
        self.endpoints = endpoints or Endpoints.resolve()
        self.log_dir = log_dir or state_home() / "jobs" / config.name / "logs"
        self.job_file = job_file
        self.supervisor: Supervisor | None = None
        self.monitor: JobMonitor | None = None  # the status view's reader, from start()
        self._events: list[str] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._poller: threading.Thread | None = None
        self._etcd: Etcd | None = None  # the poller's client, from start()
        self._started = 0.0
        self.result: LocalJobResult | None = None
        self.final_status: Snapshot | None = None  # read as the children stopped

    @property
    def name(self) -> str:
        return self.config.name

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> LocalJob:
        """Start the master, the shards and the trainers. Raises InfraError if a service is
        not reachable, LayoutChangedError if the job has a slot map for other shards (its
        master would refuse to lead, again at every restart). A job resized before runs the
        slot map's shard count (`config.pservers.count` becomes it)."""
        from streamtrain.jobstate.etcd import Etcd
        from streamtrain.jobstate.topics import ensure_job_topics, metrics_spec
        from streamtrain.master.service import read_slot_map, resized_note, settled_config
        from streamtrain.monitor import JobMonitor

        if self.supervisor is not None:
            raise LocalJobError(f"LocalJob {self.name!r} already started")
        try:
            etcd = Etcd.connect(self.endpoints)  # kept for the poller, which follows the shard count
            try:
                slot_map, _ = read_slot_map(etcd, self.name)
                settled = settled_config(self.config, slot_map)
            except BaseException:
                etcd.close()
                raise
        except EtcdError as exc:
            raise InfraError(f"etcd at {self.endpoints.etcd}: {exc}") from exc
        if slot_map is not None and settled.pservers.count != self.config.pservers.count:
            self.note(resized_note(self.name, slot_map, self.config.pservers.count))
        self.config, self._etcd = settled, etcd
        self._started = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.job_file is None:
            self.job_file = self.log_dir / f"{self.name}.job.json"
            self.job_file.write_bytes(self.config.to_json())
        # The metrics topic as trainers would create it, so the status can be read from the start.
        ensure_job_topics(self.endpoints, self.config, [metrics_spec(self.name)])
        self.supervisor = Supervisor(COMMAND, self.endpoints.env(), self.log_dir)
        self.supervisor.add("master", ["master", "--job", str(self.job_file)])
        for i in range(self.config.pservers.count):
            self.supervisor.add(pserver_child(i), self._pserver_args(i))
        for i in range(self.trainers):
            # At every start: a restart finds the CPUs this process may use now.
            self.supervisor.add(f"trainer-{i}", self._trainer_args(i))
        self.monitor = JobMonitor(self.endpoints, self.name, self.config.pservers.count, self._started)
        self._poller = threading.Thread(target=self._poll, name=f"{self.name}-supervisor", daemon=True)
        self._poller.start()
        return self

    def add(self, name: str, args: Sequence[str] | Callable[[], Sequence[str]]) -> None:
        """Another `python -m streamtrain ARGS` child under the same supervisor, restarted the
        same way (the demo's producer); `args` may be a callable evaluated at every start."""
        if self.supervisor is None:
            raise LocalJobError(f"LocalJob {self.name!r}: start() first")
        with self._lock:
            self.supervisor.add(name, args)

    def stop(self) -> LocalJobResult:
        """Stop every child (SIGTERM, the grace period, SIGKILL) and return what happened.
        Idempotent."""
        if self.result is not None:
            return self.result
        self._halt.set()
        if self._poller is not None:
            self._poller.join()
        if self._etcd is not None:
            self._etcd.close()
        supervisor = self.supervisor
        killed = supervisor.stop() if supervisor is not None else []
        state = None
        if self.monitor is not None:
            try:
                # The last metrics the children committed before they stopped.
                self.final_status = self.monitor.sample()
                state = self.state()
            except Exception:  # noqa: BLE001  a result even with a service away
                pass
            self.monitor.close()
        pids = supervisor.all_pids() if supervisor is not None else []
        self.result = LocalJobResult(
            job=self.name, duration_s=round(time.monotonic() - self._started, 1), state=state,
            tasks=dict(self.final_status.queues) if self.final_status else {},
            restarts=supervisor.restarts if supervisor is not None else {}, pids=pids, killed=killed,
            stray=[p for p in pids if pid_alive(p)], log_dir=str(self.log_dir))
        return self.result

    def __enter__(self) -> LocalJob:
        return self.start() if self.supervisor is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _poll(self) -> None:
        followed = time.monotonic()
        while not self._halt.wait(POLL_S):
            # A shard that exited may be one a resize left out: it is retired before the
            # supervisor would restart it into a registration that cannot succeed.
            if time.monotonic() - followed >= FOLLOW_S or self._shard_exited():
                followed = time.monotonic()
                try:
                    self._follow_shards()
                except Exception as exc:  # noqa: BLE001  the poller restarts every child: it must not die
                    self.note(f"could not follow the job's shard count: {exc}")
            with self._lock:
                assert self.supervisor is not None  # the poller starts after it
                events = self.supervisor.poll()
                self._events.extend(events)

    def _shard_exited(self) -> bool:
        assert self.supervisor is not None  # the poller starts after it
        return any(c.state == "running" and c.proc is not None and c.proc.poll() is not None
                   for name, c in list(self.supervisor.children.items()) if shard_of_child(name) is not None)

    def _trainer_args(self, index: int) -> Callable[[], list[str]]:
        return lambda: trainer_args(self.name, index, self.trainers, available())

    def _pserver_args(self, index: int) -> list[str]:
        return ["pserver", "--job", self.name, "--index", str(index)]

    def _follow_shards(self) -> None:
        """Shards 0..ps_desired-1 supervised, the ones above retired: a shard that joins must
        run to load its part of the resize's checkpoint; one that leaves stops by itself once
        its slots are others' (`ShardLeft`), and would find no index to register under if
        restarted."""
        from streamtrain.schemas import EtcdKeys

        keys = EtcdKeys(self.name)
        assert self._etcd is not None and self.supervisor is not None  # the poller starts after both
        try:
            entry = self._etcd.get(keys.ps_desired)
        except EtcdError:
            return  # etcd away: the shards ride it out, and so does their count
        if entry is None:
            return
        desired = keys.ps_desired_of(entry.value)
        with self._lock:
            supervised = {i for name in self.supervisor.children if (i := shard_of_child(name)) is not None
                          and self.supervisor.running(name)}
            for i in sorted(set(range(desired)) - supervised):
                try:
                    self.supervisor.add(pserver_child(i), self._pserver_args(i))
                except OSError as exc:  # retried by the supervisor, as a failed restart is
                    self._events.append(f"{pserver_child(i)} could not start ({exc}); retrying")
                    continue
                self._events.append(f"{pserver_child(i)} started: the job has {desired} shards now")
            for i in sorted(i for i in supervised if i >= desired):
                self.supervisor.retire(pserver_child(i))
                self._events.append(f"{pserver_child(i)} retired: the job has {desired} shards now")
        if desired != self.config.pservers.count:
            self.config = self.config.with_shards(desired)

    # -- while it runs -------------------------------------------------------------------
    def note(self, event: str) -> None:
        """Add a line to what `events` returns next (the view shows it)."""
        with self._lock:
            self._events.append(event)

    def events(self) -> list[str]:
        """What happened to the children since the last call (exits, restarts), oldest first."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def status(self) -> Snapshot:
        """Queues, members, examples trained, rolling AUC and loss, shard stats (`streamtrain.monitor`)."""
        return self._running_monitor().sample()

    def state(self) -> str | None:
        """The job's state in etcd: "running", "finished" (a bounded job's last pass), or None."""
        from streamtrain.schemas import EtcdKeys, JobState, SchemaError

        entry = self._running_monitor().etcd.get(EtcdKeys(self.name).state)
        try:
            return JobState.from_json(entry.value).state if entry is not None else None
        except SchemaError:
            return None

    def wait_finished(self, timeout_s: float | None = None, stop: threading.Event | None = None,
                      poll_s: float = 1.0) -> bool:
        """Wait until a bounded job has trained its last pass; False if `timeout_s` passed or
        `stop` was set first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stop = stop or threading.Event()
        while True:
            try:
                if self.state() == "finished":
                    return True
            except EtcdError:
                pass  # etcd away or electing a leader: the job's processes ride it out, so do we
            left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            if left <= 0 or stop.wait(left):
                return False

    def checkpoint(self, wait_s: float = 60.0) -> Checkpoint:
        """A job-wide checkpoint, taken while the trainers train (`streamtrain checkpoint`)."""
        from streamtrain.operations.checkpoints import request_checkpoint

        return request_checkpoint(self._running_monitor().etcd, self.name, wait_s)

    def resize(self, shards: int, wait_s: float = 300.0) -> Resized:
        """Move the job to `shards` parameter-server shards while it trains (`streamtrain
        resize`); the shards that join are started, the ones that leave stop."""
        from streamtrain.operations.resizing import resize
        from streamtrain.pserver.storage import ShardStorage

        done = resize(self._running_monitor().etcd, ShardStorage(self.endpoints), self.name, shards, wait_s)
        self.note(f"resized from {done.shards_before} to {done.shards} shards: {done.moved_slots} slots moved "
                  f"in {done.took_s:.1f} s" if done.checkpoint else f"the job has {done.shards} shards already")
        return done

    def rollback(self, checkpoint_id: str, wait_s: float = 120.0) -> None:
        """Return the whole job to a job-wide checkpoint (`streamtrain rollback`)."""
        from streamtrain.operations.checkpoints import rollback

        rollback(self._running_monitor().etcd, self.name, checkpoint_id, wait_s)

    def _running_monitor(self) -> JobMonitor:
        if self.monitor is None or self.result is not None:
            raise LocalJobError(f"LocalJob {self.name!r} is not running")
        return self.monitor
