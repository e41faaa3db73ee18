"""Resizing a running job's parameter servers (streamtrain/operations/resizing.py): 2 -> 3 -> 2 shards
mid-pass, every example applied exactly once per shard by the shards' ledgers."""

from __future__ import annotations

import json
import threading

import pytest

from conftest import wait_for
from streamtrain.jobstate.etcd import Etcd
from streamtrain.operations.resizing import Resized, resize
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.pserver.storage import ShardStorage
from streamtrain.schemas import EtcdKeys, RedisKeys
from test_trainer import (
    MODEL,
    Background,
    applied_exactly,
    job_and_one_process_auc,
    job_holdout_auc,
    make_job,
    run_job,
    write_examples,
)

pytestmark = [pytest.mark.services, pytest.mark.slow]


def resized_meanwhile(services, etcd: Etcd, job: str, shards: int, background: Background,
                      join: list[int]) -> Resized:
    """`resize` in a thread; the shards in `join` started once `ps_desired` lets them register."""
    done: list[Resized] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            done.append(resize(etcd, ShardStorage(services), job, shards, wait_s=120))
        except BaseException as exc:  # noqa: BLE001  reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if join:
        keys = EtcdKeys(job)
        wait_for(lambda: errors or ((e := etcd.get(keys.ps_desired)) is not None
                                    and keys.ps_desired_of(e.value) == shards),
                 120, "the resize's new shard count", interval=0.1)
        assert not errors, errors
        for index in join:
            background.start(lambda stop, i=index: PserverShard(services, ShardOptions(job, i, lease_ttl_s=2))
                             .run(stop))
    thread.join(180)
    assert not errors, errors
    return done[0]


def applied_by(redis_conn, job: str, shards: int, topic: str, written: dict[int, int]) -> bool:
    """Each of `shards` shards counts every example written once, by its ledger."""
    want = {f"{topic}:{p}": n for p, n in written.items()}
    stats = [redis_conn.get(RedisKeys(job).stats(s)) for s in range(shards)]
    return all(raw is not None and json.loads(raw).get("examples_by_partition") == want for raw in stats)


@pytest.mark.parametrize("factory, sgd", [
    ("streamtrain.trainer.models:LogisticRegression", "async"),
    ("streamtrain.trainer.models:WideDeep", "async"),
    ("streamtrain.trainer.models:LogisticRegression", "sync"),  # a step barrier on every shard
    ("streamtrain.trainer.models:LogisticRegression", "bounded"),
])
def test_a_job_resized_from_two_to_three_shards_and_back_applies_every_example_once(
        services, etcd, redis_conn, topic_factory, unique, tmp_path, factory, sgd) -> None:
    """A live job (its topic read as it grows) resized between batches of records: the shard
    that joins takes its slots' rows at the cut and trains them from there, its ledger counting
    every example as the others' do, and when it leaves its slots' rows go back to the others.
    In sync and bounded mode the trainers' steps wait at every shard's barrier, the joining
    shard's included."""
    train = MODEL.examples(40_000)
    topic = topic_factory("resize", partitions=2)
    config = make_job(unique("resize"), topic, tmp_path, passes=0, max_records=500, factory=factory, sgd=sgd,
                      **({"staleness": 2} if sgd == "bounded" else {}))
    coord, background = Etcd.connect(services), Background()
    written = dict.fromkeys(range(2), 0)

    def write(part: list) -> None:
        for p, n in write_examples(services, topic, [e.to_json() for e in part], 2).items():
            written[p] += n

    try:
        run_job(services, coord, config, background, trainers=2)

        def under_way(shards: int, at_least: int) -> None:
            """Resized while trainers train: the resize pauses them, the tasks in hand finish
            by the old map, and the rest is trained by the new one."""
            wait_for(lambda: min(json.loads(redis_conn.get(RedisKeys(config.name).stats(s)) or b"{}").get("examples", 0)
                                 for s in range(shards)) >= at_least, 120, "training under way", interval=0.05)

        write(train[:16_000])
        under_way(2, 1)
        grown = resized_meanwhile(services, coord, config.name, 3, background, join=[2])
        print(f"2 -> 3: {grown}")
        assert grown.shards == 3 and grown.moved_slots == 85  # 256 slots: 86, 85 and 85
        write(train[16_000:24_000])
        wait_for(lambda: applied_by(redis_conn, config.name, 3, topic, written), 120, "the first 24,000", interval=0.2)
        # The joined shard trains: the trainers push its slots' rows to it, and its ledger,
        # taken over at the cut, counts every example since as the others' do.
        third = json.loads(redis_conn.get(RedisKeys(config.name).stats(2)))
        assert third["deltas"] > 0 and third["table_rows"], third
        write(train[24_000:])
        under_way(3, 24_001)
        shrunk = resized_meanwhile(services, coord, config.name, 2, background, join=[])
        print(f"3 -> 2: {shrunk}")
        assert shrunk.shards == 2 and shrunk.moved_slots == 85
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 120, "every example once")
        distributed, single = job_and_one_process_auc(services, redis_conn, config, train)
        print(f"holdout AUC, {factory} {sgd}: resized 2 -> 3 -> 2 {distributed:.4f}, single process {single:.4f}")
        assert abs(distributed - single) < 0.01
    finally:
        background.close()
        coord.close()


def examples_applied(redis_conn, job: str, shards: int) -> int:
    """The fewest examples any of `shards` shards has applied, by its ledger."""
    stats = [redis_conn.get(RedisKeys(job).stats(s)) for s in range(shards)]
    return min((json.loads(raw).get("examples", 0) if raw else 0) for raw in stats)


def test_a_bounded_job_resized_2_3_2_mid_pass_with_a_shard_and_the_master_killed(services, redis_conn, topic_factory,
                                                                                  unique, tmp_path) -> None:
    """The whole job as processes under `job run`'s supervisor (`LocalJob`), one bounded pass,
    resized 2 -> 3 -> 2 shards before the pass is done. Shard 0 is SIGKILLed once the first
    resize's slot map is written and before the job has rolled back to the resharded
    checkpoint: restarted, it loads its part of that checkpoint and the resize completes. The
    master is SIGKILLed before the second: restarted with its job file, which still says 2
    shards while the map says 3, it leads and takes that resize's checkpoint. The LocalJob
    starts the shard that joins and retires the one that leaves, which deletes its keys and
    stops. By ledger every shard applies every example once, and the holdout AUC is within
    0.005 of the same job unresized on the same records."""
    import os
    import signal

    from streamtrain.jobstate.status import job_status
    from streamtrain.local import LocalJob
    from streamtrain.schemas.config import JobConfig

    topic = topic_factory("resizekill", partitions=2)
    written = write_examples(services, topic, [e.to_json() for e in MODEL.examples(120_000)], 2)
    total = sum(written.values())

    def job_named(prefix: str) -> JobConfig:
        return JobConfig.from_json(make_job(unique(prefix), topic, tmp_path, max_records=500).to_json())

    config, unresized = job_named("resized"), job_named("unresized")
    keys = EtcdKeys(config.name)
    coord = Etcd.connect(services)
    try:
        with LocalJob(config, trainers=2, endpoints=services, log_dir=tmp_path / "logs") as job:
            children = job.supervisor.children
            wait_for(lambda: examples_applied(redis_conn, config.name, 2) >= total // 10, 180, "a tenth of the pass",
                     interval=0.1)
            done: list[Resized] = []
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    done.append(job.resize(3, wait_s=180))
                except BaseException as exc:  # noqa: BLE001  reported by the test
                    errors.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            wait_for(lambda: errors or coord.get(keys.control("resize")) is not None, 120, "the new slot map",
                     interval=0.05)
            os.kill(children["pserver-0"].proc.pid, signal.SIGKILL)
            # Killed during the move: the record goes once the rollback to the new map is done.
            assert coord.get(keys.control("resize")) is not None
            thread.join(240)
            assert not errors and done and done[0].shards == 3, (errors, done)
            assert job.state() != "finished", "the pass ended before the first resize: make it longer"
            assert job.supervisor.running("pserver-2") and job.config.pservers.count == 3
            assert children["pserver-0"].restarts >= 1

            moved_at = examples_applied(redis_conn, config.name, 3)
            wait_for(lambda: examples_applied(redis_conn, config.name, 3) >= moved_at + total // 10, 180,
                     "a tenth more on 3 shards", interval=0.1)
            master_restarts = children["master"].restarts
            os.kill(children["master"].proc.pid, signal.SIGKILL)
            assert job.resize(2, wait_s=180).shards == 2  # its checkpoint needs a leading master
            assert job.state() != "finished", "the pass ended before the second resize: make it longer"
            assert job.wait_finished(240)
            wait_for(lambda: applied_by(redis_conn, config.name, 2, topic, written), 60, "every example, 2 shards",
                     interval=0.5)
            wait_for(lambda: children["pserver-2"].state == "retired", 60, "shard 2 to stop", interval=0.2)
            assert children["master"].restarts == master_restarts + 1 and children["master"].state == "running"
            assert children["pserver-2"].last_exit == 0 and job.config.pservers.count == 2
            assert not list(redis_conn.scan_iter(RedisKeys(config.name).prefix(2) + "*"))  # it cleared them
            assert job.resize(2).checkpoint is None  # the count it has: nothing to do
            status = job_status(coord, None, config.name)
            assert status.epoch == 2 and sorted(status.slots) == [0, 1] and status.resizing is None
        with LocalJob(unresized, trainers=2, endpoints=services, log_dir=tmp_path / "logs-unresized") as job:
            assert job.wait_finished(240)
            wait_for(lambda: applied_by(redis_conn, unresized.name, 2, topic, written), 60, "every example, unresized",
                     interval=0.5)
        resized_auc = job_holdout_auc(services, redis_conn, config)
        unresized_auc = job_holdout_auc(services, redis_conn, unresized)
        print(f"holdout AUC: resized 2 -> 3 -> 2 with a shard and the master killed {resized_auc:.4f}, "
              f"unresized {unresized_auc:.4f}")
        assert abs(resized_auc - unresized_auc) <= 0.005
    finally:
        coord.close()
