"""The view of a running job: what it reads (`JobMonitor`), how it shows it (`render` for the
rich live table, `headline` for the one-line headless log) and the loop that refreshes it
(`follow`), for `streamtrain demo` and `streamtrain job run`.

Sources, all read-only:
- `jobstate.status.job_status`: task queues, per-partition lag (stable end − trained watermark);
- `<job>.metrics` (read_committed, assigned from the beginning): one record per finished task,
  with loss, prequential AUC, examples, timings and the newest event time it trained on;
- Redis `RedisKeys(job).stats(i)`: each pserver shard's counters (version, deltas, examples
  applied exactly once, checkpoints).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from streamtrain.infra import Endpoints
from streamtrain.local import LocalJob, shard_of_child
from streamtrain.schemas import RedisKeys, SchemaError, ShardStats, TaskReport, partition_label, partition_of
from streamtrain.supervisor import Supervisor

if TYPE_CHECKING:
    from rich.console import Console

REFRESH_S = 0.5
HEADLINE_EVERY_S = 5.0
ROLLING_TASKS = 20
RATE_WINDOW_S = 10.0


@dataclass
class Snapshot:
    """One reading of the job, taken by `JobMonitor.sample`."""

    elapsed_s: float
    queues: dict[str, int] = field(default_factory=dict)
    lag: int | None = None  # records in the input not yet trained, all partitions
    lag_by_partition: dict[str, int | None] = field(default_factory=dict)  # by `partition_label`
    leader_pid: int | None = None
    trainers: int = 0
    pservers: int = 0
    tasks_reported: int = 0
    examples: int = 0  # trained, from the tasks' metrics (each task once)
    examples_per_s: float | None = None
    applied: int | None = None  # applied exactly once by every shard (min over shards)
    auc: float | None = None  # prequential, rolling over the last ROLLING_TASKS tasks
    loss: float | None = None
    event_to_trained_s: float | None = None  # median over the rolling tasks
    newest_trained_age_s: float | None = None  # now − newest event time trained on
    timings: dict[str, float] = field(default_factory=dict)  # per-task means, seconds
    shards: list[ShardStats | None] = field(default_factory=list)  # None: not written yet
    errors: list[str] = field(default_factory=list)


class JobMonitor:
    """Reads the job's status, metrics and shard stats; keep one for the whole run."""

    def __init__(self, endpoints: Endpoints, job: str, pservers: int, started: float) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from streamtrain.infra.clients import redis_client
        from streamtrain.jobstate.etcd import Etcd
        from streamtrain.jobstate.offsets import InputOffsets
        from streamtrain.params.redisnodes import ShardNodes
        from streamtrain.schemas import Topics

        self.job = job
        self.started = started
        self.etcd = Etcd.connect(endpoints)
        self.offsets = InputOffsets(endpoints)
        self.redis = redis_client(endpoints)
        self.nodes = ShardNodes(self.redis, job)
        self.stats_keys = {i: RedisKeys(job).stats(i) for i in range(pservers)}  # follows resizes
        self.consumer = Consumer({
            "bootstrap.servers": endpoints.kafka, "group.id": f"{job}.demo-view",
            "enable.auto.commit": False, "isolation.level": "read_committed",
        })
        self.consumer.assign([TopicPartition(Topics(job).metrics, 0, OFFSET_BEGINNING)])
        self.recent: deque[TaskReport] = deque(maxlen=ROLLING_TASKS)
        self.seen: set[str] = set()
        self.examples = 0
        self.rate_samples: deque[tuple[float, int]] = deque()
        self.first_auc_s: float | None = None
        self.auc_history: list[tuple[float, float]] = []  # (elapsed s, rolling AUC), every sample

    def close(self) -> None:
        for closer in (self.consumer.close, self.etcd.close, self.redis.close):
            try:
                closer()
            except Exception:  # noqa: BLE001  closing is best effort
                pass

    def _read_metrics(self) -> None:
        while True:
            batch = self.consumer.consume(500, timeout=0.05)
            if not batch:
                return
            for msg in batch:
                if msg.error():
                    continue
                try:
                    report = TaskReport.from_json(msg.value() or b"")  # no value: refused, as None was
                except SchemaError:
                    continue
                if report.task_id in self.seen:  # a re-run task (timeout, zombie): count it once
                    continue
                self.seen.add(report.task_id)
                self.examples += report.examples
                if report.examples:
                    self.recent.append(report)

    def sample(self) -> Snapshot:
        from streamtrain.jobstate.status import job_status

        now_wall, now = time.time(), time.monotonic()
        snap = Snapshot(elapsed_s=now - self.started)
        try:
            status = job_status(self.etcd, self.offsets, self.job)
            snap.queues = status.queues
            snap.lag_by_partition = {partition_label(p.topic, p.partition): p.lag for p in status.partitions}
            lags = [p.lag for p in status.partitions]
            known = [lag for lag in lags if lag is not None]
            snap.lag = sum(known) if lags and len(known) == len(lags) else None
            snap.leader_pid = status.leader.pid if status.leader else None
            snap.trainers = len(status.members.trainers)
            snap.pservers = len(status.members.pservers)
            if status.slots and len(status.slots) != len(self.stats_keys):  # resized
                self.stats_keys = {i: RedisKeys(self.job).stats(i) for i in status.slots}
        except Exception as exc:  # noqa: BLE001  the view never dies of a slow service
            snap.errors.append(f"status: {exc}")
        try:
            self._read_metrics()
        except Exception as exc:  # noqa: BLE001
            snap.errors.append(f"metrics: {exc}")
        try:
            raw = self.nodes.get_each(self.stats_keys)
            snap.shards = [ShardStats.from_json(value) if (value := raw[i]) else None for i in self.stats_keys]
            applied = [s.examples for s in snap.shards if s is not None]
            snap.applied = min(applied) if applied and len(applied) == len(snap.shards) else None
        except Exception as exc:  # noqa: BLE001
            snap.errors.append(f"shard stats: {exc}")

        snap.tasks_reported = len(self.seen)
        snap.examples = self.examples
        self.rate_samples.append((now, self.examples))
        while len(self.rate_samples) > 2 and now - self.rate_samples[1][0] >= RATE_WINDOW_S:
            self.rate_samples.popleft()
        (t0, n0) = self.rate_samples[0]
        if now - t0 >= 1.0:
            snap.examples_per_s = (self.examples - n0) / (now - t0)

        recent = list(self.recent)
        scored = [(r.auc, r.examples) for r in recent if r.auc is not None]
        if scored:
            weight = sum(examples for _, examples in scored)
            snap.auc = sum(auc * examples for auc, examples in scored) / weight
            if self.first_auc_s is None:
                self.first_auc_s = snap.elapsed_s
            self.auc_history.append((snap.elapsed_s, snap.auc))
        with_loss = [(r.loss, r.examples) for r in recent if r.loss is not None]
        if with_loss:
            snap.loss = (sum(loss * examples for loss, examples in with_loss)
                         / sum(examples for _, examples in with_loss))
        timed = [r for r in recent if r.max_event_time_ms]
        if timed:
            snap.event_to_trained_s = statistics.median(r.finished_at - r.max_event_time_ms / 1000 for r in timed)
            snap.newest_trained_age_s = now_wall - max(r.max_event_time_ms for r in timed) / 1000
        if recent:
            snap.timings = {k: statistics.fmean(getattr(r, k) for r in recent)
                            for k in ("pull_s", "compute_s", "push_s")}
        return snap


def follow(job: LocalJob, stop: threading.Event, deadline: float | None, events: list[str],
           show: Callable[[Snapshot], None],
           on_tick: Callable[[float, Supervisor], None] | None = None) -> Snapshot | None:
    """Refresh the view of `job` every REFRESH_S until `stop` is set or the monotonic `deadline`
    passes; the children's events are added to `events`. Returns the last snapshot."""
    snap = None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        if on_tick is not None:
            assert job.monitor is not None and job.supervisor is not None  # ticks are of a started job
            on_tick(time.monotonic() - job.monitor.started, job.supervisor)
        events.extend(job.events())
        snap = job.status()
        show(snap)
        stop.wait(REFRESH_S if deadline is None else max(0.0, min(REFRESH_S, deadline - time.monotonic())))
    return snap


def headlines(console: Console, supervisor: Supervisor, events: list[str]) -> Callable[[Snapshot], None]:
    """A `show` for `follow` without a screen: each event as it comes, a headline every
    HEADLINE_EVERY_S."""
    last = [0.0]

    def show(snap: Snapshot) -> None:
        while events:
            console.print(f"event: {events.pop(0)}", highlight=False, markup=False)
        if time.monotonic() - last[0] >= HEADLINE_EVERY_S:
            last[0] = time.monotonic()
            console.print(headline(snap, supervisor), highlight=False, markup=False, soft_wrap=True)

    return show


# ------------------------------------------------------------------------------ rendering


def _num(value: float | int | None, fmt: str = "{:,.0f}", none: str = "–") -> str:
    return none if value is None else fmt.format(value)


def headline(snap: Snapshot, supervisor: Supervisor) -> str:
    """One plain line for logs and CI."""
    q = snap.queues
    procs = " ".join(f"{c.name}:{'up' if c.state == 'running' else c.state}"
                     + (f"(r{c.restarts})" if c.restarts else "") for c in list(supervisor.children.values()))
    return (f"t={snap.elapsed_s:5.0f}s lag={_num(snap.lag)} "
            f"tasks todo/pending/done/failed={q.get('todo', '?')}/{q.get('pending', '?')}/"
            f"{q.get('done', '?')}/{q.get('failed', '?')} examples={snap.examples} "
            f"ex/s={_num(snap.examples_per_s)} auc={_num(snap.auc, '{:.4f}')} "
            f"loss={_num(snap.loss, '{:.4f}')} event->trained={_num(snap.event_to_trained_s, '{:.1f}s')} "
            f"[{procs}]")


def render(snap: Snapshot, supervisor: Supervisor, job: str, events: list[str]) -> Group:
    """The live screen, compact enough for an 80x24 terminal: the job, quality, freshness, then
    one row per process (pserver rows carry their shard's counters)."""
    top = Table.grid(padding=(0, 2))
    top.add_column(style="bold")
    top.add_column()
    q = snap.queues
    top.add_row("job", f"{job}   {snap.elapsed_s:,.0f} s   trainers {snap.trainers}   pservers {snap.pservers}")
    parts = "  ".join(f"p{partition_of(p)[1]} {_num(v)}" for p, v in sorted(snap.lag_by_partition.items()))
    top.add_row("input lag", f"{_num(snap.lag)} records" + (f"   ({parts})" if parts else ""))
    top.add_row("tasks", f"todo {q.get('todo', '–')}   pending {q.get('pending', '–')}   "
                         f"done {q.get('done', '–')}   failed {q.get('failed', '–')}   "
                         f"[dim]({snap.tasks_reported:,} finished)[/dim]")
    top.add_row("throughput", f"{_num(snap.examples_per_s)} examples/s   {snap.examples:,} trained   "
                              f"{_num(snap.applied)} applied")
    top.add_row("quality", f"prequential AUC [bold green]{_num(snap.auc, '{:.4f}')}[/bold green]   "
                           f"log-loss {_num(snap.loss, '{:.4f}')}   [dim](last {ROLLING_TASKS} tasks)[/dim]")
    top.add_row("freshness", f"event → trained {_num(snap.event_to_trained_s, '{:.1f} s')} [dim](median)[/dim]"
                             f"   newest trained event {_num(snap.newest_trained_age_s, '{:.1f} s')} old")
    if snap.timings:
        top.add_row("per task", "   ".join(f"{k[:-2]} {v:.2f} s" for k, v in snap.timings.items()))

    procs = Table("process", "state", "pid", "restarts", "exit", "detail", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False)
    colours = {"running": "green", "restarting": "yellow", "stopped": "dim", "retired": "dim"}
    for c in list(supervisor.children.values()):  # a copy: LocalJob's poller may add a shard
        colour = colours.get(c.state, "red")
        detail = ""
        if (i := shard_of_child(c.name)) is not None:
            s = snap.shards[i] if i < len(snap.shards) else None
            if s is not None:
                detail = (f"v{s.version}  {s.examples:,} applied  {s.checkpoints} ckpt"
                          + (f"  {s.dropped:,} dups" if s.dropped else ""))
        elif c.name == "master" and c.pid is not None:
            detail = "leader" if snap.leader_pid == c.pid else "standby"
        procs.add_row(c.name, f"[{colour}]{c.state}[/{colour}]", _num(c.pid, "{}"), str(c.restarts),
                      _num(c.last_exit, "{}"), detail)

    shown: list[Table | Text] = [top, procs]
    if events or snap.errors:
        shown.append(Text("\n".join([*events[-3:], *snap.errors[-2:]]), style="dim"))
    shown.append(Text("Ctrl-C stops the demo: children get SIGTERM, then the services stop.", style="dim"))
    return Group(*shown)
