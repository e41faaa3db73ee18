"""`streamtrain demo`: a real online-training job on real local Kafka, etcd and Redis.

1. The services come up (or given endpoints are used as they are), the input topic
   `demo.examples` (2 partitions) is created and a job file for a fresh job `demo-<timestamp>` is
   written into the state dir: online input, logistic regression on the click model's fields,
   2 pserver shards checkpointing to `<state dir>/demo/<job>/ckpt`.
2. A `LocalJob` starts the job's processes as `python -m streamtrain …` children, each logging to
   `<state dir>/demo/<job>/logs/<name>.log`: the synthetic click producer (labelled examples at
   ~2000/s), the master, 2 pservers and 2 trainers; it restarts any that exits unexpectedly.
3. A live view (or, `--headless`, a line every few seconds) shows lag, tasks, throughput,
   prequential AUC, freshness and the processes. `--resize T:N` moves the job to N pserver
   shards T seconds in (`streamtrain resize`, while it trains): the view shows the shards that
   join or leave.
4. On Ctrl-C, SIGTERM or the end of `duration`: children get SIGTERM (then SIGKILL after a grace
   period), the services stop (unless kept or given), and a `DemoSummary` is printed and returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live

from streamtrain.infra import Endpoints, LocalServices
from streamtrain.infra.signals import handle_stop_signals
from streamtrain.runtime.supervisor import Supervisor

if TYPE_CHECKING:
    from streamtrain.local import LocalJob

INPUT_TOPIC = "demo.examples"
INPUT_PARTITIONS = 2
PRODUCER_RATE = 2000.0
PSERVERS = 2
TRAINERS = 2


@dataclass
class DemoSummary:
    job: str
    duration_s: float
    examples: int  # trained (from the tasks' metrics, each task once)
    applied: int | None  # applied exactly once by every pserver shard
    auc: float | None  # final rolling prequential AUC
    loss: float | None
    first_auc_s: float | None  # seconds from the job's start until the first AUC was shown
    auc_at: dict[int, float | None]  # rolling AUC as shown at 30, 60, 90, 120 … s
    tasks: dict[str, int]
    restarts: dict[str, int]
    pids: list[int]  # every child process the supervisor ever started
    killed: list[str]  # children that needed SIGKILL at the end
    stray: list[int]  # child pids still alive after the demo: should always be empty
    state_dir: str
    log_dir: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class DemoPlan:
    """Where a demo run keeps its files, and its job file."""

    job: str
    root: Path
    job_file: Path = field(init=False)
    log_dir: Path = field(init=False)
    checkpoints: Path = field(init=False)

    def __post_init__(self) -> None:
        self.job_file = self.root / "job.toml"
        self.log_dir = self.root / "logs"
        self.checkpoints = self.root / "ckpt"


def job_toml(job: str, checkpoint_uri: str) -> str:
    from streamtrain.producers.clickmodel import ClickModel

    model = ClickModel()
    fields = ", ".join(f'"{f}"' for f in model.fields)
    return f"""\
# Written by `streamtrain demo`; keys: docs/job-config.md
[job]
name = "{job}"

[input]
topics = ["{INPUT_TOPIC}"]
format = "json"
passes = 0               # online: follow the live stream
start_from = "latest"    # the topic outlives demo runs: train on this run's records only

[tasks]
max_records = 1000
linger_ms = 300
timeout_s = 20

[model]
factory = "streamtrain.trainer.models:LogisticRegression"
sparse_fields = [{fields}]
dense_features = {model.dense_features}
batch_size = 256

[train]
learning_rate = 0.1

[pservers]
count = {PSERVERS}
checkpoint_uri = "{checkpoint_uri}"
checkpoint_every_s = 30
"""


def prepare(endpoints: Endpoints, home: Path, job: str | None = None) -> DemoPlan:
    """Topics and job file of a fresh demo job."""
    from streamtrain.infra.clients import TopicSpec, ensure_topics
    from streamtrain.schemas import Topics

    job = job or time.strftime("demo-%Y%m%d-%H%M%S")
    plan = DemoPlan(job, home / "demo" / job)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    plan.checkpoints.mkdir(parents=True, exist_ok=True)
    plan.job_file.write_text(job_toml(job, plan.checkpoints.as_uri()))
    # The metrics topic as trainers would create it, so the view can assign it from the start.
    ensure_topics(endpoints, [TopicSpec(INPUT_TOPIC, INPUT_PARTITIONS), TopicSpec(Topics(job).metrics)])
    return plan


def produced(endpoints: Endpoints, timeout_s: float = 15.0) -> int:
    """Records in the input topic so far (all partitions): where a (re)started producer resumes
    the click model's impression index, so no impression is sent twice. Falls back to an index
    from the clock (ahead of any the producer can have reached at its rate) if Kafka cannot say."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": endpoints.kafka, "group.id": "streamtrain-demo-probe"})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:  # a just-created topic's partitions may have no leader for a moment
                return sum(consumer.get_watermark_offsets(TopicPartition(INPUT_TOPIC, p), timeout=5)[1]
                           for p in range(INPUT_PARTITIONS))
            except KafkaException:
                if time.monotonic() > deadline:
                    return int(time.time() * PRODUCER_RATE * 2)
                time.sleep(0.5)
    finally:
        consumer.close()


def producer_args(endpoints: Endpoints) -> list[str]:
    """The synthetic producer's command, resuming after the records already in the topic."""
    return ["produce", "synthetic", "--labelled", "--topic", INPUT_TOPIC, "--rate", str(PRODUCER_RATE),
            "--partitions", str(INPUT_PARTITIONS), "--start", str(produced(endpoints))]


def parse_resize(text: str) -> tuple[float, int]:
    """`T:N` (`--resize`): N pserver shards from T seconds after the demo starts. Raises
    ValueError naming what is wrong."""
    at, sep, shards = text.partition(":")
    try:
        when, count = float(at), int(shards)
    except ValueError:
        when, count = -1.0, 0
    if not sep or when < 0 or count < 1:
        raise ValueError(f"{text!r}: expected SECONDS:SHARDS, e.g. 60:3 (3 shards from 60 s in)")
    return when, count


def _resize_on_schedule(job: LocalJob, resizes: Sequence[tuple[float, int]], stop: threading.Event) -> None:
    """Each (T, N) of `resizes` in turn, T seconds after the job started; a failed resize is an
    event in the view, not the end of the demo."""
    for at, shards in sorted(resizes):
        assert job.monitor is not None  # the job was started
        if stop.wait(max(0.0, at - (time.monotonic() - job.monitor.started))):
            return
        try:
            job.resize(shards)
        except Exception as exc:  # noqa: BLE001  shown, and the demo goes on
            if not stop.is_set():
                job.note(f"resize to {shards} shards failed: {exc}")


def run_demo(target: LocalServices | Endpoints, console: Console, *, home: Path | None = None,
             duration: float | None = None, headless: bool = False, keep_running: bool = False,
             job: str | None = None, resizes: Sequence[tuple[float, int]] = (),
             on_tick: Callable[[float, Supervisor], None] | None = None) -> DemoSummary:
    """Run the demo job until `duration` seconds pass, or SIGINT/SIGTERM; `resizes`: (T, N),
    the job moved to N shards T seconds in.

    `target` is either local services to bring up (and stop at the end unless `keep_running`),
    or the endpoints of running services, used as they are and never stopped; then `home` names
    the dir for the job file, logs and checkpoints. `on_tick(elapsed_s, supervisor)` is called
    on every refresh (tests use it to inject faults).
    """
    from streamtrain.console.live import follow, headlines, render
    from streamtrain.local import LocalJob
    from streamtrain.schemas.config import JobConfig

    started = time.monotonic()
    console.rule("streamtrain demo")
    local = target if isinstance(target, LocalServices) else None
    if isinstance(target, LocalServices):
        local = target
        try:
            for name, took in local.up().items():
                console.print(f"{name:6} " + ("already running" if took is None else f"ready in {took:.1f} s"))
        except BaseException:  # a failed or interrupted start leaves nothing half up
            if not keep_running:
                local.down()
            raise
        endpoints, home = local.endpoints, home or local.home
    else:
        endpoints = target
        if home is None:
            raise ValueError("run_demo: give `home` (the state dir) with explicit endpoints")
    stop = threading.Event()
    restore = handle_stop_signals(stop)
    running: LocalJob | None = None
    snap = None
    events: list[str] = []
    try:
        plan = prepare(endpoints, home, job)
        console.print(f"job    {plan.job}", highlight=False)
        console.print(f"file   {plan.job_file}", highlight=False, soft_wrap=True)
        console.print(f"logs   {plan.log_dir}", highlight=False, soft_wrap=True)
        running = LocalJob(JobConfig.load(plan.job_file), trainers=TRAINERS, endpoints=endpoints,
                           log_dir=plan.log_dir, job_file=plan.job_file).start()
        running.add("producer", lambda: producer_args(endpoints))
        if resizes:
            threading.Thread(target=_resize_on_schedule, args=(running, resizes, stop), name="demo-resize",
                             daemon=True).start()
        deadline = None if duration is None else started + duration
        supervisor = running.supervisor
        assert supervisor is not None  # started above
        if headless:
            snap = follow(running, stop, deadline, events, headlines(console, supervisor, events), on_tick)
        else:
            with Live(console=console, refresh_per_second=2, transient=False) as live:
                def show(s):
                    live.update(render(s, supervisor, plan.job, events))
                snap = follow(running, stop, deadline, events, show, on_tick)
    finally:
        result = running.stop() if running is not None else None
        if local is not None and not keep_running:
            console.print(f"stopped: {', '.join(local.down()) or 'nothing'}")
        restore()  # only now: a second Ctrl-C must not interrupt the clean-up
    snap = running.final_status or snap
    monitor = running.monitor
    assert monitor is not None  # made by start()
    summary = DemoSummary(
        job=plan.job, duration_s=round(time.monotonic() - started, 1),
        examples=snap.examples if snap else 0, applied=snap.applied if snap else None,
        auc=snap.auc if snap else None, loss=snap.loss if snap else None,
        first_auc_s=None if monitor.first_auc_s is None else round(monitor.first_auc_s, 1),
        auc_at=_auc_at(monitor.auc_history, snap.elapsed_s if snap else 0),
        tasks=dict(snap.queues) if snap else {}, restarts=result.restarts, pids=result.pids,
        killed=result.killed, stray=result.stray, state_dir=str(home), log_dir=str(plan.log_dir))
    print_summary(console, summary)
    return summary


def _auc_at(history: list[tuple[float, float]], elapsed: float, every: int = 30) -> dict[int, float | None]:
    marks = {}
    for t in range(every, int(elapsed) + 1, every):
        shown = [auc for at, auc in history if at <= t]
        marks[t] = round(shown[-1], 4) if shown else None
    return marks


def print_summary(console: Console, s: DemoSummary) -> None:
    console.rule("demo summary")
    auc = "–" if s.auc is None else f"{s.auc:.4f}"
    first = "never" if s.first_auc_s is None else f"{s.first_auc_s:.0f} s after start"
    marks = "  ".join(f"{t}s {'–' if a is None else f'{a:.4f}'}" for t, a in s.auc_at.items())
    restarts = sum(s.restarts.values())
    console.print(f"job                 {s.job}")
    console.print(f"duration            {s.duration_s:.0f} s")
    console.print(f"examples trained    {s.examples:,}"
                  + ("" if s.applied is None else f"  (applied by every shard: {s.applied:,})"))
    console.print(f"prequential AUC     {auc}  (rolling, last tasks; first shown {first})")
    if marks:
        console.print(f"AUC over time       {marks}")
    console.print("tasks               " + "  ".join(f"{k} {v}" for k, v in s.tasks.items()))
    console.print(f"restarts            {restarts}"
                  + ("" if not restarts else "  (" + ", ".join(f"{k} {v}" for k, v in s.restarts.items() if v) + ")"))
    if s.killed:
        console.print(f"[yellow]needed SIGKILL[/yellow]      {', '.join(s.killed)}")
    console.print("stray processes     " + ("none" if not s.stray else f"[red]{s.stray}[/red]"))
    console.print(f"logs                {s.log_dir}")
