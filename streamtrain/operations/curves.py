"""Training curves for TensorBoard from a job's `<job>.metrics` topic.

Every trainer writes one `TaskReport` per task (schemas/report.py) in the task's last Kafka
transaction. `streamtrain curves` reads them read_committed, by assign (no
consumer group offsets are committed: it keeps no state), and writes scalars with torch's
`SummaryWriter`. The step of every point is the job's cumulative examples as read so far, so
curves from runs at different speeds line up; the wall time is the task's finish time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from streamtrain.infra import Endpoints
from streamtrain.schemas import SchemaError, TaskReport

log = logging.getLogger(__name__)

JOB_RATE_WINDOW_S = 30.0  # job-wide examples/s: tasks finished within this window


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None,
                   walltime: float | None = None) -> None: ...


@dataclass
class Curves:
    """Turns task records into scalars. Tags:

    - `train/loss`, `train/auc`: the task's mean log loss and prequential AUC (AUC skipped when
      the task held a single class);
    - `throughput/task_examples_per_s`: one trainer's speed on that task (examples / task time);
    - `throughput/job_examples_per_s`: examples of all tasks finished in the last 30 s / 30 s
      (from the first task's start until 30 s have passed);
    - `data/bad_records`: cumulative records dead-lettered by trainers;
    - `freshness/seconds`: the task's finish minus the event time of its newest example;
    - `time/pull_s`, `time/compute_s`, `time/push_s`: the task's time in each phase.
    """

    writer: ScalarWriter
    examples: int = 0
    bad_records: int = 0
    tasks: int = 0
    _window: deque = field(default_factory=deque, repr=False)  # (finished_at, examples)
    _first_start: float | None = None

    def add(self, report: TaskReport) -> None:
        """One task's record."""
        examples, started, finished = report.examples, report.started_at, report.finished_at
        self.tasks += 1
        self.examples += examples
        self.bad_records += report.bad_records
        step, w = self.examples, self.writer

        def put(tag: str, value: float | None) -> None:
            if value is not None:
                w.add_scalar(tag, float(value), step, finished)

        put("train/loss", report.loss)
        put("train/auc", report.auc)
        if finished > started:
            put("throughput/task_examples_per_s", examples / (finished - started))
        self._first_start = started if self._first_start is None else min(self._first_start, started)
        self._window.append((finished, examples))
        while self._window and self._window[0][0] < finished - JOB_RATE_WINDOW_S:
            self._window.popleft()
        span = min(JOB_RATE_WINDOW_S, finished - self._first_start)
        if span > 0:
            put("throughput/job_examples_per_s", sum(n for _, n in self._window) / span)
        put("data/bad_records", self.bad_records)
        if report.max_event_time_ms > 0:
            put("freshness/seconds", max(finished - report.max_event_time_ms / 1000, 0.0))
        for phase in ("pull_s", "compute_s", "push_s"):
            put(f"time/{phase}", getattr(report, phase))


def summary_writer(logdir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # tensorboard is a dependency; a trimmed install may lack it
        raise RuntimeError("writing TensorBoard curves needs the tensorboard package "
                           "(pip install 'tensorboard>=2.16,<3')") from exc
    return SummaryWriter(log_dir=str(logdir), flush_secs=5)


def write_curves(endpoints: Endpoints, job: str, logdir: Path, stop: threading.Event,
                 from_beginning: bool = False, until_end: bool = False) -> int:
    """Follow `<job>.metrics` (from its start, or from now) and write curves into `logdir` until
    `stop`, or, with `until_end`, until the end the topic had when reading began. Returns the
    number of task records written."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from streamtrain.infra.clients import TopicSpec, ensure_topics
    from streamtrain.jobstate.offsets import InputOffsets
    from streamtrain.schemas import Topics

    topic = Topics(job).metrics
    ensure_topics(endpoints, [TopicSpec(topic)])  # as the trainers create it: follow a job not started yet
    partitions = [p for _, p in InputOffsets(endpoints).partitions([topic])]
    ends = {p: b.stable_end for (_, p), b in
            InputOffsets(endpoints).bounds([(topic, p) for p in partitions], earliest=False).items()}
    consumer = Consumer({
        "bootstrap.servers": endpoints.kafka,
        "group.id": f"{job}.curves",  # required by librdkafka; never committed
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 200,
    })
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING if from_beginning else OFFSET_END)
                     for p in partitions])
    writer = summary_writer(logdir)
    curves = Curves(writer)
    log.info("writing curves of job %s from %s (%s) into %s", job, topic,
             "its beginning" if from_beginning else "now", logdir)
    try:
        while not stop.is_set():
            if until_end and (not from_beginning or _reached(consumer, topic, ends)):
                break
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    continue
                try:
                    curves.add(TaskReport.from_json(msg.value() or b""))
                except SchemaError as exc:
                    log.warning("skipping a record that is not a task's metrics at %s:%d:%d: %s",
                                msg.topic(), msg.partition(), msg.offset(), exc)
    finally:
        consumer.close()
        writer.close()
    log.info("wrote %d tasks, %d examples", curves.tasks, curves.examples)
    return curves.tasks


def _reached(consumer, topic: str, ends: dict[int, int]) -> bool:
    from confluent_kafka import TopicPartition

    # The position moves past transaction markers too, which are never delivered.
    positions = consumer.position([TopicPartition(topic, p) for p in ends])
    return all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions)

