"""`streamtrain predict`, `streamtrain checkpoint` and `streamtrain job run` as real processes
against the session's services and a real (small, bounded) job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import StreamtrainProcess, publish_job, wait_for, write_job_file
from streamtrain.cli import app
from streamtrain.infra import Endpoints
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.master.service import Master
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.runtime.supervisor import pid_alive
from streamtrain.schemas import EtcdKeys, RedisKeys, ResizeRecord
from streamtrain.trainer.worker import Trainer
from test_trainer import MODEL, Background, applied_exactly, finished, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]


def streamtrain(services: Endpoints, *args: str, stdin: bytes | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, STREAMTRAIN_KAFKA=services.kafka, STREAMTRAIN_ETCD=services.etcd,
               STREAMTRAIN_REDIS=services.redis)
    return subprocess.run([sys.executable, "-m", "streamtrain", *args], input=stdin, env=env,
                          capture_output=True, timeout=timeout)


def serving(redis_conn, job: str, shards: int = 2) -> bool:
    raw = [redis_conn.get(RedisKeys(job).stats(i)) for i in range(shards)]
    return all(r is not None and json.loads(r).get("serving") for r in raw)


def start_shards(background: Background, services: Endpoints, job: str, count: int = 2) -> None:
    for i in range(count):
        background.start(lambda stop, i=i: PserverShard(services, ShardOptions(job, i, lease_ttl_s=2)).run(stop))


def predict(services: Endpoints, job: str, path: Path) -> list[dict]:
    done = streamtrain(services, "predict", "--job", job, str(path))
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_predict_scores_records_with_the_served_parameters_and_scores_move_with_training(
        services, redis_conn, topic_factory, unique, tmp_path, monkeypatch) -> None:
    topic = topic_factory("predict", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in MODEL.examples(4_000)], 2)
    config = make_job(unique("predict"), topic, tmp_path)
    probe = MODEL.examples(4, start=10**7)
    records = tmp_path / "records.jsonl"
    records.write_bytes(b"\n".join([probe[0].to_json(), probe[1].to_json(), b'{"v":1,"sparse":', b"",
                                    probe[2].to_json(), probe[3].to_json()]) + b"\n")
    coord, background = Etcd.connect(services), Background()
    try:
        background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
        start_shards(background, services, config.name)
        wait_for(lambda: serving(redis_conn, config.name), 60, "both shards serving", interval=0.2)

        before = predict(services, config.name, records)  # served, nothing trained yet
        assert [r["line"] for r in before] == [1, 2, 3, 5, 6]  # line 4 is blank: no record
        assert "error" in before[2] and "score" not in before[2], before
        assert before[2]["error"], before
        scored = [r for r in before if "score" in r]
        assert len(scored) == 4 and all(0 < r["score"] < 1 for r in scored), before

        background.start(lambda stop: Trainer(services, config.name, "t0", lease_ttl_s=2).run(stop))
        wait_for(lambda: finished(coord, config.name), 90, "the job's single pass", interval=0.5)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 30, "pservers applied all")

        after = predict(services, config.name, records)
        assert [r["line"] for r in after] == [1, 2, 3, 5, 6] and "error" in after[2]
        trained = [r["score"] for r in after if "score" in r]
        assert len(trained) == 4 and all(0 < p < 1 for p in trained), after
        moved = np.abs(np.array(trained) - np.array([r["score"] for r in scored]))
        assert moved.max() > 0.01, (scored, after)

        # stdin and the text format (in this process: a third start-up of torch costs seconds);
        # an unknown job fails clearly.
        monkeypatch.setenv("STREAMTRAIN_KAFKA", services.kafka)
        monkeypatch.setenv("STREAMTRAIN_ETCD", services.etcd)
        monkeypatch.setenv("STREAMTRAIN_REDIS", services.redis)
        text = CliRunner().invoke(app, ["predict", "--job", config.name, "--text"], input=records.read_bytes())
        assert text.exit_code == 0, text.output
        lines = text.stdout.splitlines()
        assert len(lines) == 5 and lines[2].startswith("3\terror: "), lines
        assert abs(float(lines[0].split("\t")[1]) - trained[0]) < 1e-5
        missing = CliRunner().invoke(app, ["predict", "--job", unique("nojob")], input=b"")
        assert missing.exit_code == 1 and "no config" in missing.stderr, missing.output
    finally:
        background.close()
        coord.close()


def test_checkpoint_asks_the_master_registers_every_shard_and_sets_latest(services, etcd, redis_conn, unique,
                                                                           topic_factory, tmp_path,
                                                                           start_master) -> None:
    topic = topic_factory("ckpt", partitions=1)  # the master leads once its input exists
    config = make_job(unique("ckpt"), topic, tmp_path)
    keys = EtcdKeys(config.name)
    coord, background = Etcd.connect(services), Background()
    try:
        publish_job(coord, config)
        start_master(config)
        start_shards(background, services, config.name)
        wait_for(lambda: serving(redis_conn, config.name), 60, "both shards serving", interval=0.2)
        started = time.monotonic()
        done = streamtrain(services, "checkpoint", "--job", config.name, "--wait-s", "30")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr.decode()
        checkpoint_id = done.stdout.decode().strip()
        assert coord.get(keys.checkpoint_job(checkpoint_id)) is not None  # the master recorded the job's side
        for i in range(2):
            entry = coord.get(keys.checkpoint_shard(checkpoint_id, i))
            assert entry is not None and json.loads(entry.value)["shard"] == i
        latest = json.loads(coord.get(keys.checkpoints_latest).value)
        assert latest["id"] == checkpoint_id and latest["shards"] == 2 and latest["at"] > time.time() - took - 5
        assert coord.get(keys.control("checkpoint")) is None  # the request is withdrawn

        # A job whose master runs but whose shards do not: exit 1, naming them.
        other = make_job(unique("ckptdown"), topic, tmp_path)
        publish_job(coord, other)
        start_master(other)
        failed = streamtrain(services, "checkpoint", "--job", other.name, "--wait-s", "2")
        assert failed.returncode == 1
        message = " ".join(failed.stderr.decode().split())  # as wrapped for the terminal
        assert "[0, 1]" in message and "did not register" in message and "not running" in message, message
        assert coord.get(EtcdKeys(other.name).checkpoints_latest) is None
        assert coord.get(EtcdKeys(other.name).control("checkpoint")) is None  # taken back

        # A job without a master: nobody records the job's side; exit 1, saying so.
        headless = make_job(unique("ckptnomaster"), topic, tmp_path)
        publish_job(coord, headless)
        failed = streamtrain(services, "checkpoint", "--job", headless.name, "--wait-s", "1")
        assert failed.returncode == 1 and "master did not take" in " ".join(failed.stderr.decode().split())
        assert coord.get(EtcdKeys(headless.name).control("checkpoint")) is None
    finally:
        background.close()
        coord.close()


def descendants_of(pid: int) -> list[int]:
    """Children, theirs and so on: `job run`'s processes are forked by its fork server."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def test_job_run_trains_a_bounded_job_and_stops_cleanly_on_sigterm(services, topic_factory, unique, tmp_path) -> None:
    topic = topic_factory("jobrun", partitions=2)
    write_examples(services, topic, [e.to_json() for e in MODEL.examples(2_000)], 2)
    config = make_job(unique("jobrun"), topic, tmp_path, max_records=500)
    job_file = write_job_file(tmp_path / "job.toml", config)
    run = StreamtrainProcess(services, ["job", "run", "--job", str(job_file), "--trainers", "1",
                                        "--log-dir", str(tmp_path / "logs")], "jobrun", tmp_path)
    coord = Etcd.connect(services)
    seen: set[int] = set()
    try:
        def done() -> bool:
            assert run.proc.poll() is None, run.log.read_text()
            seen.update(descendants_of(run.proc.pid))
            return finished(coord, config.name)

        wait_for(done, 90, "the job's single pass under `job run`", interval=0.5)
        assert len(seen) >= 5, seen  # master, 2 pservers, 1 trainer, its loader (and the fork server)
        wait_for(lambda: "finished its last pass" in run.log.read_text(), 20, "the finished event", interval=0.2)
        run.kill(signal.SIGTERM)
        assert run.wait(40) == 0, run.log.read_text()
        log = run.log.read_text()
        assert "state finished" in log and "no stray process" in log, log
        assert "tasks todo/pending/done/failed" in log, log
        # The fork server (and with it anything it forked) ends once `job run` is gone.
        wait_for(lambda: not [p for p in seen if pid_alive(p)], 10, "no process of the job left", interval=0.2)
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
            "master.log", "pserver-0.log", "pserver-1.log", "trainer-0.log"]
    finally:
        run.kill(signal.SIGKILL)
        coord.close()


def test_a_job_file_whose_shard_count_changed_is_refused_with_the_reason(services, topic_factory, unique,
                                                                         tmp_path) -> None:
    """The job already has a slot map for two shards; its file now asks for three. Nothing
    starts: `job run` and the master both refuse, naming both layouts, and `ps_desired` stays
    at two (a third shard would own no slot; a shrink would leave slots owned by nobody)."""
    import threading

    from streamtrain.jobstate.errors import LayoutChangedError

    topic = topic_factory("layout", partitions=2)
    config = make_job(unique("layout"), topic, tmp_path)
    coord = Etcd.connect(services)
    try:
        publish_job(coord, config)
        grown = make_job(config.name, topic, tmp_path, pservers={"count": 3})
        job_file = write_job_file(tmp_path / "job.toml", grown)
        done = streamtrain(services, "job", "run", "--job", str(job_file), "--trainers", "1",
                           "--log-dir", str(tmp_path / "logs"))
        message = " ".join((done.stderr.decode() + done.stdout.decode()).split())  # unwrapped
        assert done.returncode == 2, message
        assert "pservers.count = 3" in message and "2 shard(s)" in message, message
        assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())
        with pytest.raises(LayoutChangedError, match="pservers.count = 2 and pservers.slots"):
            Master(coord, InputOffsets(services), grown).run(threading.Event())
        keys = EtcdKeys(config.name)
        assert keys.ps_desired_of(coord.get(keys.ps_desired).value) == 2
    finally:
        coord.close()


def test_job_status_shows_the_queues_the_members_and_the_slots_each_shard_owns(services, topic_factory, unique,
                                                                               tmp_path) -> None:
    topic = topic_factory("status", partitions=2)
    config = make_job(unique("status"), topic, tmp_path)
    coord = Etcd.connect(services)
    try:
        publish_job(coord, config)
        done = streamtrain(services, "job", "status", "--job", config.name, "--json")
        assert done.returncode == 0, done.stderr.decode()
        status = json.loads(done.stdout)
        assert status["job"] == config.name and status["queues"] == {"todo": 0, "pending": 0, "done": 0, "failed": 0}
        assert status["slots"] == {"0": 128, "1": 128} and status["epoch"] == 0
        text = " ".join(streamtrain(services, "job", "status", "--job", config.name).stdout.decode().split())
        assert "slots 256 over 2 shards (epoch 0): 0:128 1:128" in text and "resizing" not in text, text
        assert status["resizing"] is None
        # A resize left half done (streamtrain/operations/resizing.py): the status says so, and how to finish it.
        coord.put(EtcdKeys(config.name).control("resize"), ResizeRecord(3, "00000000000000000042", 1.0).to_json())
        status = json.loads(streamtrain(services, "job", "status", "--job", config.name, "--json").stdout)
        assert status["resizing"] == {"shards": 3, "checkpoint": "00000000000000000042", "at": 1.0}
        text = " ".join(streamtrain(services, "job", "status", "--job", config.name).stdout.decode().split())
        assert "resizing to 3 shards: rolling back to 00000000000000000042" in text, text
    finally:
        coord.close()
