"""The Prometheus exporter and the per-process metric views; the TensorBoard curve writer."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from streamtrain.infra.metrics import (
    PORT_ENV,
    MasterMetrics,
    PserverMetrics,
    TrainerMetrics,
    metrics_port,
    serve_metrics,
)
from streamtrain.infra.metrics import scrape as scrape_url
from streamtrain.operations.curves import Curves
from streamtrain.schemas import ShardStats, TaskReport


def scrape(port: int) -> dict[str, float]:
    return scrape_url(f"http://127.0.0.1:{port}/metrics")


@pytest.fixture(scope="module")
def port() -> int:
    return serve_metrics(0, addr="127.0.0.1")


def test_the_exporter_binds_a_free_port_and_serves_every_process_metric(port) -> None:
    job = f"obs-{uuid.uuid4().hex[:8]}"
    m = MasterMetrics.for_job(job)
    m.queues(todo=3, pending=2, done=0, failed=1)
    m.lag("clicks", 1, 120)
    m.sliced.inc(5)
    m.requeued.inc()
    m.leader.set(1)
    m.members("trainers", 2)
    t = TrainerMetrics.for_trainer(job, "t0")
    t.examples.inc(256)
    t.bad_records.inc()
    t.pull_seconds.observe(0.002)
    t.task_ended("done")
    t.task_committed(0.42, 0.77, max_event_time_ms=1_000_000, committed_at=1_003.5)
    p = PserverMetrics.for_shard(job, 1)
    p.observe_stats(ShardStats(1, 7, True, 1.0, deltas=4, rows=40, dropped=1, version=7, offset=11, examples=512,
                               dedup_entries=3))
    p.publish_seconds.observe(0.01)

    assert port > 0
    got = scrape(port)
    j = f"job={job}"
    assert got[f"streamtrain_master_tasks{{{j},state=todo}}"] == 3
    assert got[f"streamtrain_master_tasks{{{j},state=failed}}"] == 1
    assert got[f"streamtrain_master_input_lag_records{{{j},partition=1,topic=clicks}}"] == 120
    assert got[f"streamtrain_master_tasks_sliced_total{{{j}}}"] == 5
    assert got[f"streamtrain_master_tasks_requeued_total{{{j}}}"] == 1
    assert got[f"streamtrain_master_leader{{{j}}}"] == 1
    assert got[f"streamtrain_master_members{{{j},kind=trainers}}"] == 2
    tl = f"{j},trainer=t0"
    assert got[f"streamtrain_trainer_examples_total{{{tl}}}"] == 256
    assert got[f"streamtrain_trainer_bad_records_total{{{tl}}}"] == 1
    assert got[f"streamtrain_trainer_tasks_total{{{j},outcome=done,trainer=t0}}"] == 1
    assert got[f"streamtrain_trainer_tasks_total{{{j},outcome=lost,trainer=t0}}"] == 0
    assert got[f"streamtrain_trainer_pull_seconds_count{{{tl}}}"] == 1
    assert got[f"streamtrain_trainer_task_loss{{{tl}}}"] == pytest.approx(0.42)
    assert got[f"streamtrain_trainer_task_auc{{{tl}}}"] == pytest.approx(0.77)
    assert got[f"streamtrain_trainer_freshness_seconds_sum{{{tl}}}"] == pytest.approx(3.5)
    assert got[f"streamtrain_trainer_freshness_seconds_bucket{{{j},le=5.0,trainer=t0}}"] == 1
    assert got[f"streamtrain_trainer_freshness_seconds_bucket{{{j},le=2.0,trainer=t0}}"] == 0
    for name in ("push_seconds_count", "commit_seconds_count", "compute_seconds_count"):
        assert got[f"streamtrain_trainer_{name}{{{tl}}}"] == 0
    sl = f"{j},shard=1"
    assert got[f"streamtrain_pserver_deltas_applied_total{{{sl}}}"] == 4
    assert got[f"streamtrain_pserver_rows_applied_total{{{sl}}}"] == 40
    assert got[f"streamtrain_pserver_duplicates_dropped_total{{{sl}}}"] == 1
    assert got[f"streamtrain_pserver_bad_deltas_total{{{sl}}}"] == 0  # present from the start
    assert got[f"streamtrain_pserver_examples_applied_total{{{sl}}}"] == 512
    assert got[f"streamtrain_pserver_version{{{sl}}}"] == 7
    assert got[f"streamtrain_pserver_consumed_offset{{{sl}}}"] == 11
    assert got[f"streamtrain_pserver_serving{{{sl}}}"] == 1
    assert got[f"streamtrain_pserver_publish_seconds_count{{{sl}}}"] == 1
    assert got[f"streamtrain_pserver_checkpoint_seconds_count{{{sl}}}"] == 0


def test_pserver_counters_follow_the_cumulative_stats(port) -> None:
    job = f"obs-{uuid.uuid4().hex[:8]}"
    p = PserverMetrics.for_shard(job, 0)
    p.observe_stats(ShardStats(0, 7, False, 1.0, deltas=10, rows=100, version=1))
    p.observe_stats(ShardStats(0, 7, True, 2.0, deltas=15, rows=100, version=2))
    p.observe_stats(ShardStats(0, 7, True, 3.0, deltas=12, rows=100, version=2))  # restored lower: restarts from there
    got = scrape(port)
    sl = f"job={job},shard=0"
    assert got[f"streamtrain_pserver_deltas_applied_total{{{sl}}}"] == 15
    assert got[f"streamtrain_pserver_rows_applied_total{{{sl}}}"] == 100
    assert got[f"streamtrain_pserver_version{{{sl}}}"] == 2
    assert got[f"streamtrain_pserver_serving{{{sl}}}"] == 1


def test_views_of_the_same_labels_share_their_series(port) -> None:
    job = f"obs-{uuid.uuid4().hex[:8]}"
    TrainerMetrics.for_trainer(job, "a").examples.inc(3)
    TrainerMetrics.for_trainer(job, "a").examples.inc(4)  # a restarted Trainer object, same process
    TrainerMetrics.for_trainer(job, "b").examples.inc(1)
    got = scrape(port)
    assert got[f"streamtrain_trainer_examples_total{{job={job},trainer=a}}"] == 7
    assert got[f"streamtrain_trainer_examples_total{{job={job},trainer=b}}"] == 1


def test_the_port_comes_from_the_argument_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(PORT_ENV, raising=False)
    assert metrics_port(None) == 0
    monkeypatch.setenv(PORT_ENV, "9464")
    assert metrics_port(None) == 9464
    assert metrics_port(0) == 0
    assert metrics_port(1234) == 1234
    monkeypatch.setenv(PORT_ENV, "x")
    with pytest.raises(ValueError, match=PORT_ENV):
        metrics_port(None)


class Recorder:
    def __init__(self) -> None:
        self.points: list[tuple[str, float, int, float]] = []

    def add_scalar(self, tag, value, step=None, walltime=None) -> None:
        self.points.append((tag, value, step, walltime))

    def tag(self, name: str) -> list[tuple[float, int]]:
        return [(v, s) for t, v, s, _ in self.points if t == name]


def test_curves_step_by_cumulative_examples_and_skip_undefined_values() -> None:
    rec = Recorder()
    curves = Curves(rec)
    curves.add(TaskReport("t:0:00000000000000000000", "a", 0, 100, 2, 40, 0.6, 0.7, 0.1, 0.5, 0.2, 10.0, 12.0,
                          max_event_time_ms=11_000))
    curves.add(TaskReport("t:1:00000000000000000000", "a", 0, 50, 0, 0, None, None, 0.3, 0.4, 0.1, 12.0, 13.0))
    assert rec.tag("train/loss") == [(0.6, 100)]
    assert rec.tag("train/auc") == [(0.7, 100)]
    assert rec.tag("data/bad_records") == [(2, 100), (2, 150)]
    assert rec.tag("throughput/task_examples_per_s") == [(50.0, 100), (50.0, 150)]
    assert rec.tag("throughput/job_examples_per_s") == [(50.0, 100), (50.0, 150)]
    assert rec.tag("freshness/seconds") == [(1.0, 100)]
    assert rec.tag("time/pull_s") == [(0.1, 100), (0.3, 150)]
    assert curves.tasks == 2 and curves.examples == 150


def test_metric_families_are_made_under_a_lock() -> None:
    """Two trainers started at once in one process both found the families missing, and the
    second registration raised DuplicateTimeseries: making them must hold the lock that the
    check for them takes."""
    from streamtrain.infra import metrics as observability

    held = []
    assert observability._get("test-lock", lambda: held.append(observability._families_lock.locked()) or 1) == 1
    assert held == [True]
    assert observability._get("test-lock", lambda: 2) == 1  # made once


def test_probes_answer_liveness_always_and_readiness_as_the_process_says() -> None:
    import urllib.error
    import urllib.request

    state = {"ready": lambda: False}
    port = serve_metrics(0, addr="127.0.0.1", registry=CollectorRegistry(), ready=lambda: state["ready"]())

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert (status("/healthz"), status("/readyz"), status("/metrics")) == (200, 503, 200)
    state["ready"] = lambda: True
    assert status("/readyz") == 200
    state["ready"] = lambda: 1 / 0  # a readiness check that fails reads as not ready
    assert status("/readyz") == 503
