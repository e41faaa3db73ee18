"""/metrics of a real master and trainer (with two real shards) scraped over HTTP; TensorBoard
curves written from a job's metrics topic."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from conftest import wait_for
from streamtrain.infra.metrics import scrape as scrape_url
from streamtrain.infra.metrics import serve_metrics
from streamtrain.jobstate.etcd import Etcd
from streamtrain.operations.curves import write_curves
from streamtrain.schemas import TaskReport, Topics
from test_trainer import MODEL, Background, finished, make_job, run_job, write_examples

pytestmark = [pytest.mark.services]


def scrape(port: int) -> dict[str, float]:
    return scrape_url(f"http://127.0.0.1:{port}/metrics")


def scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_running_job_exposes_trainer_and_master_metrics(services, topic_factory, unique, tmp_path) -> None:
    sent_at_ms = int(time.time() * 1000)
    train = MODEL.examples(2_000, event_time_ms=sent_at_ms)
    topic = topic_factory("obs", partitions=1)
    write_examples(services, topic, [e.to_json() for e in train], 1)
    config = make_job(unique("obs"), topic, tmp_path, max_records=500)
    port = serve_metrics(0, addr="127.0.0.1")
    coord, background = Etcd.connect(services), Background()
    try:
        run_job(services, coord, config, background, trainers=1)
        wait_for(lambda: finished(coord, config.name), 120, "the job's single pass", interval=0.2)
        got = scrape(port)  # while the master still leads
    finally:
        background.close()
        coord.close()
    j, t = f"job={config.name}", f"job={config.name},trainer=t0"
    # Trainer: every example once (no fault), four tasks of 500, one freshness sample per task.
    assert got[f"streamtrain_trainer_examples_total{{{t}}}"] == 2_000
    assert got[f"streamtrain_trainer_tasks_total{{{j},outcome=done,trainer=t0}}"] == 4
    assert got[f"streamtrain_trainer_bad_records_total{{{t}}}"] == 0
    assert got[f"streamtrain_trainer_pull_seconds_count{{{t}}}"] == 8  # batches of 256: 2 per task
    assert got[f"streamtrain_trainer_compute_seconds_count{{{t}}}"] == 8
    assert got[f"streamtrain_trainer_commit_seconds_count{{{t}}}"] >= 4
    assert got[f"streamtrain_trainer_freshness_seconds_count{{{t}}}"] == 4
    freshness = got[f"streamtrain_trainer_freshness_seconds_sum{{{t}}}"] / 4
    assert 0 < freshness < time.time() - sent_at_ms / 1000
    assert 0 < got[f"streamtrain_trainer_task_loss{{{t}}}"] < 1.5
    assert 0 <= got[f"streamtrain_trainer_task_auc{{{t}}}"] <= 1
    # Master: leading, four tasks sliced, queues drained, nothing left to train.
    assert got[f"streamtrain_master_leader{{{j}}}"] == 1
    assert got[f"streamtrain_master_tasks_sliced_total{{{j}}}"] == 4
    for state in ("todo", "pending", "done", "failed"):
        assert f"streamtrain_master_tasks{{{j},state={state}}}" in got
    assert got[f"streamtrain_master_tasks{{{j},state=failed}}"] == 0
    assert got[f"streamtrain_master_input_lag_records{{{j},partition=0,topic={topic}}}"] == 0
    assert got[f"streamtrain_master_members{{{j},kind=trainers}}"] == 1
    assert got[f"streamtrain_master_members{{{j},kind=ps}}"] == 2

    # The same job's metrics topic, as TensorBoard curves.
    logdir = tmp_path / "tb"
    assert write_curves(services, config.name, logdir, threading.Event(), from_beginning=True, until_end=True) == 4
    curves = scalars(logdir)
    assert [step for step, _ in curves["train/loss"]] == [500, 1_000, 1_500, 2_000]


def test_curves_from_a_metrics_topic(services, unique, tmp_path) -> None:
    job = unique("curves")
    producer = Producer({"bootstrap.servers": services.kafka})
    now = time.time()
    docs = [TaskReport(f"t{i}", "x", 0, 100 * (i + 1), i, 10, 0.7 - 0.1 * i, 0.6 + 0.05 * i if i != 1 else None,
                       0.1, 0.2, 0.05, now + i, now + i + 0.5, int((now + i - 2) * 1000)) for i in range(3)]
    from streamtrain.infra.clients import TopicSpec, ensure_topics

    ensure_topics(services, [TopicSpec(Topics(job).metrics)])
    for doc in docs[:2]:
        producer.produce(Topics(job).metrics, doc.to_json(), key=doc.task_id.encode())
    producer.produce(Topics(job).metrics, b"not json")
    producer.produce(Topics(job).metrics, docs[2].to_json())
    producer.flush(30)

    logdir = tmp_path / "tb"
    assert write_curves(services, job, logdir, threading.Event(), from_beginning=True, until_end=True) == 3
    assert list(logdir.glob("events.out.tfevents.*"))
    curves = scalars(logdir)
    assert [s for s, _ in curves["train/loss"]] == [100, 300, 600]
    assert [v for _, v in curves["train/loss"]] == pytest.approx([0.7, 0.6, 0.5])
    assert [s for s, _ in curves["train/auc"]] == [100, 600]  # the single-class task has none
    assert [v for _, v in curves["data/bad_records"]] == [0, 1, 3]
    assert [v for _, v in curves["throughput/task_examples_per_s"]] == pytest.approx([200, 400, 600])
    assert [v for _, v in curves["freshness/seconds"]] == pytest.approx([2.5, 2.5, 2.5], abs=0.01)
    assert "throughput/job_examples_per_s" in curves and "time/pull_s" in curves

    # From now (the default) there is nothing new to read.
    assert write_curves(services, job, tmp_path / "tb2", threading.Event(), until_end=True) == 0
