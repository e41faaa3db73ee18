"""`streamtrain job run`: a whole job on this machine under the restarting supervisor.

The job file's processes run as `python -m streamtrain …` children of one supervisor
(`streamtrain.supervisor.Supervisor`, the demo's): one master, `pservers.count` shards (pinned
to their indexes) and N trainers, each with the current endpoints (`Endpoints.resolve()`) in its
environment and its output in `<log dir>/<name>.log`. A child that exits unexpectedly is
restarted with backoff. A status line (`streamtrain.live.headline`) is printed every few
seconds, and an event when a bounded job has trained its last pass. Ctrl-C or SIGTERM stops the
children (SIGTERM, grace period, SIGKILL) and returns.

Unlike `streamtrain demo`, nothing else is started: the services and the input topic must exist.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from streamtrain.infra import Endpoints

STATE_CHECK_S = 1.0


@dataclass
class JobRunSummary:
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


def start_children(supervisor, job_file: Path, job: str, pservers: int, trainers: int) -> None:
    supervisor.add("master", ["master", "--job", str(job_file)])
    for i in range(pservers):
        supervisor.add(f"pserver-{i}", ["pserver", "--job", job, "--index", str(i)])
    for i in range(trainers):
        supervisor.add(f"trainer-{i}", ["trainer", "--job", job, "--id", f"trainer-{i}"])


def job_state(etcd, job: str) -> str | None:
    from streamtrain.schemas import EtcdKeys

    entry = etcd.get(EtcdKeys(job).state)
    if entry is None:
        return None
    try:
        return json.loads(entry.value).get("state")
    except (ValueError, AttributeError):
        return None


def run_job(endpoints: Endpoints, job_file: Path, config, console: Console, *, log_dir: Path,
            trainers: int = 2, stop: threading.Event | None = None) -> JobRunSummary:
    """Run the job until SIGINT/SIGTERM (or `stop` is set). `config` is the loaded job file."""
    from streamtrain.demo import _loop_headless
    from streamtrain.infra.clients import TopicSpec, ensure_topics
    from streamtrain.infra.signals import handle_stop_signals
    from streamtrain.live import JobMonitor, headline
    from streamtrain.schemas import Topics
    from streamtrain.supervisor import Supervisor, pid_alive

    started = time.monotonic()
    job, pservers = config.name, config.pservers.count
    stop = stop or threading.Event()
    restore = handle_stop_signals(stop)
    supervisor = monitor = snap = None
    events: list[str] = []
    state: dict[str, object] = {"value": None, "checked": 0.0}
    try:
        console.print(f"job    {job}  ({pservers} pservers, {trainers} trainers)", highlight=False)
        console.print(f"file   {job_file}", highlight=False, soft_wrap=True)
        console.print(f"logs   {log_dir}", highlight=False, soft_wrap=True)
        console.print(f"kafka  {endpoints.kafka}  etcd {endpoints.etcd}  redis {endpoints.redis}", highlight=False)
        # The metrics topic as trainers would create it, so the status line can read it from the start.
        ensure_topics(endpoints, [TopicSpec(Topics(job).metrics)])
        supervisor = Supervisor(endpoints.env(), log_dir)
        start_children(supervisor, job_file, job, pservers, trainers)
        monitor = JobMonitor(endpoints, job, pservers, started)

        def watch_state(_elapsed: float, _supervisor) -> None:
            now = time.monotonic()
            if now - state["checked"] < STATE_CHECK_S:
                return
            state["checked"] = now
            try:
                value = job_state(monitor.etcd, job)
            except Exception:  # noqa: BLE001  the status view never dies of a slow service
                return
            if value != state["value"]:
                state["value"] = value
                if value == "finished":
                    events.append(f"job {job} finished its last pass over the input; Ctrl-C to stop")

        snap = _loop_headless(console, supervisor, monitor, stop, None, events, headline, watch_state)
    finally:
        killed = supervisor.stop() if supervisor is not None else []
        if monitor is not None:
            try:
                snap = monitor.sample()
                state["value"] = job_state(monitor.etcd, job)
            except Exception:  # noqa: BLE001
                pass
            monitor.close()
        restore()
    pids = supervisor.all_pids()
    summary = JobRunSummary(
        job=job, duration_s=round(time.monotonic() - started, 1), state=state["value"],
        tasks=dict(snap.queues) if snap else {}, restarts=supervisor.restarts, pids=pids, killed=killed,
        stray=[p for p in pids if pid_alive(p)], log_dir=str(log_dir))
    console.print(headline(snap, supervisor) if snap else "no status", highlight=False, markup=False,
                  soft_wrap=True)
    restarts = {k: v for k, v in summary.restarts.items() if v}
    console.print(f"stopped after {summary.duration_s:.0f} s; state {summary.state or '-'}; restarts "
                  f"{sum(restarts.values())}" + (f" {restarts}" if restarts else "")
                  + (f"; needed SIGKILL: {', '.join(killed)}" if killed else "")
                  + (f"; [red]stray processes {summary.stray}[/red]" if summary.stray else "; no stray process"),
                  highlight=False)
    return summary
