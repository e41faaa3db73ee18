"""A running job's status as a plain type: what `JobMonitor` reads, `Snapshot` holds.

`LocalJob.status()` returns a `Snapshot`; the console (streamtrain/console/live.py) shows one
as a rich live table or a headline. Nothing here renders.

Sources, all read-only:
- `jobstate.status.job_status`: task queues, per-partition lag (stable end − trained watermark);
- `<job>.metrics` (read_committed, assigned from the beginning): one record per finished task,
  with loss, prequential AUC, examples, timings and the newest event time it trained on;
- Redis `RedisKeys(job).stats(i)`: each pserver shard's counters (version, deltas, examples
  applied exactly once, checkpoints).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from streamtrain.infra import Endpoints
from streamtrain.schemas import RedisKeys, SchemaError, ShardStats, TaskReport, partition_label

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
