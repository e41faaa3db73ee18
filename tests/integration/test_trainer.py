"""Trainers against real Kafka, etcd and Redis, with real pserver shards and a real master:
accuracy against a single-process run (LR with two trainers; WideDeep and DeepFM with one),
exactly-once across a killed and a frozen trainer, garbage records dead-lettered."""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from conftest import StreamtrainProcess, job_config, read_partition, wait_for, wait_for_value
from streamtrain.infra import Endpoints
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.master.service import Master
from streamtrain.producers.clickmodel import ClickModel
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.schemas import DeadLetter, EtcdKeys, Example, GradientDelta, JobState, RedisKeys, TaskRecord, Topics
from streamtrain.trainer.broker import Broker
from streamtrain.trainer.delivery import Delivery
from streamtrain.trainer.local import LocalTrainer
from streamtrain.trainer.metrics import auc
from streamtrain.trainer.params import ParamSync
from streamtrain.trainer.scoring import Scorer
from streamtrain.trainer.worker import Trainer

pytestmark = [pytest.mark.services, pytest.mark.slow]

MODEL = ClickModel()
HOLDOUT = MODEL.examples(10_000, start=10**7)
LABELS = np.array([e.label for e in HOLDOUT])


class Background:
    """Shards, trainers and a master in threads of this process, stopped at the end."""

    def __init__(self) -> None:
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, target) -> None:
        stop = threading.Event()

        def run() -> None:
            try:
                target(stop)
            except BaseException as exc:
                self.errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.stops.append(stop)
        self.threads.append(thread)

    def close(self) -> None:
        for stop in self.stops:
            stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, self.errors


def write_examples(services: Endpoints, topic: str, values: list[bytes], partitions: int) -> dict[int, int]:
    # Idempotent, so each partition holds its values in the order given: a plain producer
    # retries a batch refused while a fresh topic's leader settles after later batches landed
    # (seen: 6,558 later records of a partition written before its first ones).
    producer = Producer({"bootstrap.servers": services.kafka, "linger.ms": 20, "enable.idempotence": True})
    counts = dict.fromkeys(range(partitions), 0)
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)  # over 100,000 queued: let some go
        counts[i % partitions] += 1
    assert producer.flush(60) == 0, f"records to {topic} left undelivered"
    return counts


def all_done(snapshot, written: dict[int, int]) -> bool:
    """A job's metrics count every example written once and its queue holds no task (one a
    fault put back, trained again and dropped by the ledgers, included)."""
    return (snapshot.examples == sum(written.values())
            and snapshot.queues.get("todo") == 0 and snapshot.queues.get("pending") == 0)


def make_job(name: str, topic: str, tmp_path: Path, **train):
    pservers = train.pop("pservers", {})
    return job_config(name, topic, input={"passes": train.pop("passes", 1)},
                      tasks={"max_records": train.pop("max_records", 2000), "timeout_s": train.pop("timeout_s", 30)},
                      model={"factory": train.pop("factory", "streamtrain.trainer.models:LogisticRegression"),
                             "sparse_fields": list(MODEL.fields), "dense_features": MODEL.dense_features,
                             "batch_size": train.pop("batch_size", 256)},
                      train={"learning_rate": 0.1, **train},
                      pservers={"count": 2, "checkpoint_uri": (tmp_path / name).as_uri(), **pservers})


def finished(etcd: Etcd, job: str) -> bool:
    entry = etcd.get(EtcdKeys(job).state)
    return entry is not None and JobState.from_json(entry.value).finished


def shard_stats(redis_conn, job: str) -> list[dict]:
    return [json.loads(redis_conn.get(RedisKeys(job).stats(s)) or b"{}") for s in range(2)]


def applied_counts(redis_conn, job: str, counts: dict[int, int], topic: str) -> bool:
    """Every shard applied each partition's examples once (by its ledger)."""
    want = {f"{topic}:{p}": n for p, n in counts.items()}
    return all(s.get("examples_by_partition") == want for s in shard_stats(redis_conn, job))


def applied_exactly(redis_conn, job: str, counts: dict[int, int], topic: str) -> bool:
    """`applied_counts`, and every shard has all it applied in Redis (row keys included: what
    the holdout scoring reads)."""
    return (applied_counts(redis_conn, job, counts, topic)
            and all(s.get("settled") for s in shard_stats(redis_conn, job)))


def holdout_auc(etcd: Etcd, redis_conn, config) -> float:
    slot_map = SlotMap.from_json(etcd.get(EtcdKeys(config.name).slots).value)
    return auc(LABELS, Scorer(config, redis_conn, slot_map).score(HOLDOUT))


def run_job(services, etcd, config, background: Background, trainers: int = 2, lease_ttl_s: int = 2) -> None:
    background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
    for i in range(2):
        background.start(lambda stop, i=i: PserverShard(
            services, ShardOptions(config.name, i, lease_ttl_s=lease_ttl_s)).run(stop))
    for i in range(trainers):
        background.start(lambda stop, i=i: Trainer(services, config.name, f"t{i}", lease_ttl_s=lease_ttl_s).run(stop))


def train_one_pass(services, redis_conn, config, topic: str, counts: dict[int, int], trainers: int,
                   timeout_s: float = 240) -> None:
    """A master, two shards and `trainers` trainers in this process, until the job's single
    pass is done and every shard has applied every example."""
    coord, background = Etcd.connect(services), Background()
    try:
        run_job(services, coord, config, background, trainers)
        wait_for(lambda: finished(coord, config.name), timeout_s, "the job's single pass", interval=0.5)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 30, "pservers applied all")
    finally:
        background.close()
        coord.close()


def distributed_and_single_auc(services, redis_conn, config, train, topic: str, counts: dict[int, int],
                               trainers: int) -> tuple[float, float]:
    """The holdout AUC after one pass through the shards, and after one in a single process:
    in the order `train` was written (round robin over the partitions) for two or more
    trainers, in the order the trainer took its tasks for one."""
    train_one_pass(services, redis_conn, config, topic, counts, trainers)
    if trainers > 1:
        return job_and_one_process_auc(services, redis_conn, config, train)
    local = LocalTrainer(config)
    for part in trained_in_order(services, config.name, counts, lambda p, o: train[o * len(counts) + p]):
        local.train(part)
    return job_holdout_auc(services, redis_conn, config), auc(LABELS, local.score(HOLDOUT))


def job_and_one_process_auc(services: Endpoints, redis_conn, config, train: list[Example]) -> tuple[float, float]:
    """The holdout AUC of the parameters a job left in Redis, and of one process trained on
    `train` in its order."""
    local = LocalTrainer(config)
    local.train(train)
    return job_holdout_auc(services, redis_conn, config), auc(LABELS, local.score(HOLDOUT))


def job_holdout_auc(services: Endpoints, redis_conn, config) -> float:
    coord = Etcd.connect(services)
    try:
        return holdout_auc(coord, redis_conn, config)
    finally:
        coord.close()


def trained_in_order(services: Endpoints, job: str, counts: dict[int, int],
                     at: Callable[[int, int], Example | None]) -> Iterator[list[Example]]:
    """The good examples of each task in the order a single trainer took them, from its metrics
    records (`at(partition, offset)` is the example there, None for a bad record). Sync SGD with
    one trainer is sequential SGD, so a single process that trains them so, task by task (a
    task's last mini-batch is shorter), ends where the job does up to floating point; in
    another order the holdout AUC moves by up to 0.006 on its own."""
    for partition, start, end in ranges_in_order(
            [json.loads(value)["task_id"] for value in committed(services, Topics(job).metrics)], counts):
        yield [e for e in (at(partition, o) for o in range(start, end)) if e is not None]


def test_two_trainers_two_pservers_reach_the_auc_of_a_single_process_run(services, etcd, redis_conn, topic_factory,
                                                                        unique, tmp_path) -> None:
    train = MODEL.examples(40_000)
    topic = topic_factory("clicks", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    # Bounded staleness: asynchronous trainers, but neither trains on parameters more than two
    # steps behind anyone's updates, its own included. Fully async, the gap grows with how far
    # the shards lag (0.0004-0.002 on a quiet box, 0.0145 once under CI's load).
    config = make_job(unique("auc"), topic, tmp_path, sgd="bounded", staleness=2)
    distributed, single = distributed_and_single_auc(services, redis_conn, config, train, topic, counts, trainers=2)
    print(f"holdout AUC: 2 trainers + 2 pservers ({config.train.sgd}) {distributed:.4f}, single process {single:.4f}")
    assert single > 0.74
    assert abs(distributed - single) < 0.01, (distributed, single)


@pytest.mark.parametrize("factory", ["streamtrain.trainer.models:WideDeep", "streamtrain.trainer.models:DeepFM"])
def test_the_deep_built_ins_lose_no_accuracy_through_the_shards(services, etcd, redis_conn, topic_factory, unique,
                                                                tmp_path, factory) -> None:
    """Dense blocks pulled and pushed every mini-batch, embeddings by row: one sync trainer runs
    the single process's update rule, so through the shards it must end where the single
    process does when that trains the same tasks in the same order. 42 runs landed within
    0.0002 (last-bit differences that Adam's division by a small second moment now and then
    lifts to 1e-3 in a dense weight). A replica that kept rows read before it followed their
    shard trained the second step on rows missing the first, in one run in four, and ended up
    to 0.0054 apart (bench/RESULTS.md)."""
    train = MODEL.examples(20_000)
    topic = topic_factory("clicks", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    config = make_job(unique("deep"), topic, tmp_path, factory=factory, sgd="sync")
    distributed, single = distributed_and_single_auc(services, redis_conn, config, train, topic, counts, trainers=1)
    print(f"holdout AUC, {factory}: 1 sync trainer + 2 pservers {distributed:.4f}, single process {single:.4f}")
    assert single > 0.72
    assert abs(distributed - single) < 0.002, (distributed, single)


def dead_letters(services: Endpoints, job: str) -> list[DeadLetter]:
    return [DeadLetter.from_json(msg.value()) for msg in read_partition(services, Topics(job).dlq)]


def test_pushes_every_n_and_dense_pulls_every_m_mini_batches(services, etcd, redis_conn, topic_factory, unique,
                                                             tmp_path, monkeypatch) -> None:
    """The seeds' n and m at 3: a task's mini-batches go out in groups of three (the last one
    shorter), every mini-batch a step of its own that pulls its rows, and with them the dense
    blocks once three mini-batches have trained since their last pull."""
    train = MODEL.examples(6_000)
    topic = topic_factory("every", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    pulls: list[tuple[bool, bool]] = []  # (rows, dense blocks) per pull, in order
    send = ParamSync.send
    monkeypatch.setattr(ParamSync, "send", lambda self, tables, ids, shards, dense: (
        pulls.append((len(ids) > 0, dense)), send(self, tables, ids, shards, dense))[1])
    sizes: list[int] = []  # mini-batches per group, in the order trained
    train_group = Trainer._train_group
    monkeypatch.setattr(Trainer, "_train_group", lambda self, run, batches: (
        sizes.append(len(batches)), train_group(self, run, batches))[1])
    config = make_job(unique("every"), topic, tmp_path, push_every=3, pull_every=3)
    train_one_pass(services, redis_conn, config, topic, counts, trainers=1, timeout_s=120)
    batch = config.model.batch_size
    groups = 0
    for shard in range(2):
        by_task: dict[str, dict[int, GradientDelta]] = {}
        steps: dict[tuple[str, int], int] = {}  # each dense block's steps, as the shard applies them
        for value in committed(services, Topics(config.name).grad(shard)):
            delta = GradientDelta.from_bytes(value)
            by_task.setdefault(delta.task_id, {}).setdefault(delta.seq, delta)
            for piece in delta.dense:
                # A trainer alone computes every dense step at the version the shard applies it
                # to: pulled after its last push was published, plus the group's earlier steps
                # estimated. A base below would damp its steps as if another trainer had moved
                # the block (pserver/state.py).
                key = (piece.param, piece.block)
                assert piece.base == steps.get(key, 0), (key, piece.base, steps.get(key, 0))
                steps[key] = steps.get(key, 0) + 1
        groups = 0
        for task_id, deltas in by_task.items():
            seqs = [deltas[seq] for seq in sorted(deltas)]
            task_batches = -(-sum(d.examples for d in seqs) // batch)
            assert [d.seq for d in seqs] == list(range(-(-task_batches // 3))), task_id
            assert [d.examples for d in seqs[:-1]] == [3 * batch] * (len(seqs) - 1), task_id
            # A part per mini-batch: the shard steps each (a few hundred ids a batch reach both shards).
            assert [len(d.sparse) for d in seqs] == [min(3, task_batches - 3 * g) for g in range(len(seqs))], task_id
            groups += len(seqs)
    # Counted by wrapping the real pull (a spy, not a mock): one pull a mini-batch, with the
    # dense blocks when three mini-batches have trained since their last pull.
    assert len(sizes) == groups and len(pulls) == sum(sizes) and all(rows for rows, _ in pulls)
    assert [dense for _, dense in pulls] == [k % 3 == 0 for k in range(len(pulls))]
    assert [s.get("damped") for s in shard_stats(redis_conn, config.name)] == [0, 0]


def test_at_least_once_delivery_trains_without_transactions(services, etcd, redis_conn, topic_factory,
                                                           unique, tmp_path) -> None:
    train = MODEL.examples(8_000)
    topic = topic_factory("alo", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    config = make_job(unique("alo"), topic, tmp_path, delivery="at_least_once")
    # No fault: nothing is redone, so not even its side outputs repeat here.
    train_one_pass(services, redis_conn, config, topic, counts, trainers=1, timeout_s=120)


class RefusedOnce(Broker):
    """The job's Kafka, but the first task's side outputs carry a message the producer refuses
    (over its 1 MB `message.max.bytes`), so that commit's transaction fails."""

    def __init__(self, endpoints: Endpoints) -> None:
        super().__init__(endpoints)
        self.refused: list[str] = []  # the task ids of the commits refused

    def delivery(self, config, trainer_id: str) -> Delivery:
        delivery, broker = super().delivery(config, trainer_id), self
        commit = delivery.commit

        def refusing_once(messages) -> None:
            if messages and not broker.refused:
                task_id = json.loads(next(v for t, v, k in messages if t == Topics(config.name).metrics))["task_id"]
                broker.refused.append(task_id)
                messages = [*messages, (Topics(config.name).metrics, b"x" * 2_000_000, None)]
            commit(messages)

        delivery.commit = refusing_once
        return delivery


def test_a_task_whose_commit_fails_is_redone_and_its_outputs_committed_once(services, redis_conn,
                                                                            topic_factory, unique, tmp_path) -> None:
    """A side-output transaction that fails fails that attempt only: the transaction is
    aborted, the task redone, every example applied once by the ledger and each task's metrics
    record committed once (the refused attempt's with it: none)."""
    train = MODEL.examples(8_000)
    topic = topic_factory("refused", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    config = make_job(unique("refused"), topic, tmp_path)
    broker, background, trainers, coord = RefusedOnce(services), Background(), [], Etcd.connect(services)
    background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
    for i in range(2):
        background.start(lambda stop, i=i: PserverShard(services, ShardOptions(config.name, i, lease_ttl_s=2))
                         .run(stop))
    trainers.append(Trainer(services, config.name, "t0", lease_ttl_s=2, broker=broker))
    background.start(trainers[0].run)
    try:
        wait_for(lambda: finished(coord, config.name), 120, "the job's single pass", interval=0.5)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 30, "pservers applied all")
    finally:
        background.close()
        coord.close()
    assert len(broker.refused) == 1
    assert trainers[0].stats.failed_tasks == 1, trainers[0].stats
    reports = [json.loads(value) for value in committed(services, Topics(config.name).metrics)]
    by_task = {task_id: sum(r["task_id"] == task_id for r in reports) for task_id in {r["task_id"] for r in reports}}
    assert broker.refused[0] in by_task and set(by_task.values()) == {1}, by_task
    assert sum(r["examples"] for r in reports) == len(train)


def test_one_percent_garbage_trains_as_well_and_lands_exactly_in_the_dlq(services, etcd, redis_conn, topic_factory,
                                                                         unique, tmp_path) -> None:
    train = MODEL.examples(40_000)
    rng = np.random.default_rng(3)
    garbage_at = set(rng.choice(len(train) + 400, size=400, replace=False).tolist())
    values, good, it = [], {}, iter(train)
    for i in range(len(train) + 400):
        if i in garbage_at:
            values.append(b'{"v":1,"sparse":' if i % 2 else b"\xff\xfe not json")
        else:
            good[(i % 2, i // 2)] = example = next(it)
            values.append(example.to_json())
    topic = topic_factory("dirty", partitions=2)
    counts = write_examples(services, topic, values, 2)
    # One trainer in sync mode: every mini-batch trains on parameters that include the one
    # before, as the single-process run does, so the comparison measures the garbage, not
    # asynchrony (the AUC test above covers two async trainers, within 0.01).
    config = make_job(unique("garbage"), topic, tmp_path, sgd="sync")
    coord, background = Etcd.connect(services), Background()
    try:
        run_job(services, coord, config, background, trainers=1)
        wait_for(lambda: finished(coord, config.name), 240, "the job's single pass", interval=0.5)
        examples = {p: sum(1 for q, _ in good if q == p) for p in counts}
        wait_for(lambda: applied_exactly(redis_conn, config.name, examples, topic), 30, "pservers applied all")
        dirty = holdout_auc(coord, redis_conn, config)
    finally:
        background.close()
        coord.close()
    letters = dead_letters(services, config.name)
    positions = {(d.partition, d.offset) for d in letters}
    assert positions == {(i % 2, i // 2) for i in garbage_at}
    assert len(letters) == 400 and all(d.reason for d in letters)
    # One metrics record per task (no fault: each task once), adding up to the input.
    metrics = [json.loads(value) for value in committed(services, Topics(config.name).metrics)]
    assert sum(m["bad_records"] for m in metrics) == 400
    assert sum(m["examples"] for m in metrics) == len(train)
    assert len({m["task_id"] for m in metrics}) == len(metrics)
    # Each record well formed; prequential AUC only on the whole: a task trained first scores the
    # model's initial dense weights, which may rank the wrong way round.
    assert all(m["pull_s"] > 0 and m["compute_s"] > 0 and m["push_s"] > 0 and 0 < m["loss"] < 2
               and 0 <= m["auc"] <= 1 and m["positives"] > 0 for m in metrics), metrics[:2]
    assert sum(m["auc"] * m["examples"] for m in metrics) / len(train) > 0.65
    local = LocalTrainer(config)
    for part in trained_in_order(services, config.name, counts, lambda p, o: good.get((p, o))):
        local.train(part)
    clean = auc(LABELS, local.score(HOLDOUT))
    print(f"holdout AUC with 1% garbage {dirty:.4f}, clean single process in the job's order {clean:.4f}")
    assert abs(dirty - clean) < 0.002, (dirty, clean)


def ranges_in_order(task_ids: list[str], counts: dict[int, int]) -> list[tuple[int, int, int]]:
    """(partition, start, end) of each task, in the order given: the tasks of a single pass tile
    each partition, so a task ends where the next one of its partition starts."""
    tasks = [TaskRecord.parse_id(task_id) for task_id in task_ids]
    starts = {p: sorted(t.start for t in tasks if t.partition == p) for p in counts}
    ends = {(p, a): b for p, s in starts.items() for a, b in zip(s, [*s[1:], counts[p]])}
    return [(t.partition, t.start, ends[t.partition, t.start]) for t in tasks]


def committed(services: Endpoints, topic: str) -> list[bytes]:
    """The committed values of partition 0 of `topic`, from the start to its end now."""
    return [msg.value() for msg in read_partition(services, topic)]


def committed_groups(services: Endpoints, topic: str) -> dict[tuple[str, int], list[int]]:
    """Every committed delta of a gradient topic: (task_id, seq) -> the examples of each copy,
    in the order the shard read them (it applies the first, drops the rest)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for value in committed(services, topic):
        delta = GradientDelta.from_bytes(value)
        groups.setdefault((delta.task_id, delta.seq), []).append(delta.examples)
    return groups


def assert_each_task_applied_once(services: Endpoints, redis_conn, job: str, counts: dict[int, int]) -> None:
    """Per task, from what the shards read: the first copies of its groups add up to its range
    (all records are good), each range once, the ranges tile the partitions; some groups came
    twice (the victim's and the redo's), and every later copy is one the shard counted as a
    dropped duplicate (once it has read that far: the redo's copies can come last, after the
    counts were already exact)."""
    for shard in range(2):
        groups = committed_groups(services, Topics(job).grad(shard))
        applied: dict[str, int] = {}
        for (task_id, _), copies in groups.items():
            assert len(set(copies)) == 1, (task_id, copies)  # a redone group is the same group
            applied[task_id] = applied.get(task_id, 0) + copies[0]
        tasks = sorted((t.partition, t.start, applied[task_id])
                       for task_id in applied for t in [TaskRecord.parse_id(task_id)])
        for partition, total in counts.items():
            ranges = [(start, n) for p, start, n in tasks if p == partition]
            assert [start for start, _ in ranges] == list(
                itertools.accumulate((n for _, n in ranges[:-1]), initial=0)), (shard, partition, ranges)
            assert sum(n for _, n in ranges) == total, (shard, partition, ranges)
        duplicates = sum(len(copies) - 1 for copies in groups.values())
        assert duplicates > 0, shard
        wait_for(lambda: shard_stats(redis_conn, job)[shard].get("dropped") == duplicates, 30,
                 f"shard {shard} dropping the {duplicates} later copies")


def victim_tasks(etcd: Etcd, job: str) -> set[str]:
    """The ids of the pending tasks the victim holds."""
    return {task["task_id"] for task in (json.loads(e.value) for e in etcd.range(EtcdKeys(job).tasks("pending")))
            if task["trainer_id"] == "victim"}


def victim_mid_task(services: Endpoints, etcd: Etcd, job: str, below: int) -> str | None:
    """A task the victim holds, of which some but fewer than `below` groups are in a shard's
    topic. The topics are read before the tasks held: a task read as held first could be
    completed while the topics are read, and found part-way in a read begun before."""
    if not victim_tasks(etcd, job):
        return None
    counted: list[dict[str, int]] = []
    for shard in range(2):
        seqs: dict[str, int] = {}
        for task_id, _ in committed_groups(services, Topics(job).grad(shard)):
            seqs[task_id] = seqs.get(task_id, 0) + 1
        counted.append(seqs)
    held = victim_tasks(etcd, job)
    return next((task_id for seqs in counted for task_id in sorted(held) if 0 < seqs.get(task_id, 0) < below),
                None)


# What a resumed zombie logs when it finds its task redone (jobstate/tasks.py, trainer/worker.py).
ZOMBIE_LEARNS = ("is no longer held by this attempt", "dropping the task in hand")


def trainer_process(services, job: str, name: str, log_dir: Path) -> StreamtrainProcess:
    return StreamtrainProcess(services, ["trainer", "--job", job, "--id", name, "--lease-ttl-s", "2"], name, log_dir)


DELIVERY = {"exactly_once": {}, "at_least_once": {"delivery": "at_least_once"}}


@pytest.mark.parametrize("delivery", list(DELIVERY))
@pytest.mark.parametrize("fault", ["sigkill", "sigstop", "sigterm"])
def test_a_task_redone_after_a_killed_or_frozen_trainer_is_applied_exactly_once(
        fault, delivery, services, etcd, redis_conn, topic_factory, unique, tmp_path) -> None:
    """The fault lands after some of the task's groups reached the shards' topics (deltas go out
    as they are made, in either delivery mode), so the redo's copies of them must be dropped:
    the shards' (task_id, seq) ledger is all that keeps them out."""
    train = MODEL.examples(12_000)
    topic = topic_factory("faults", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in train], 2)
    # Long tasks of many small push groups: the fault lands mid-task, after some pushes. A
    # push a mini-batch: a lone trainer's pushes of 4 (push_every "auto") let the victim race
    # through its tasks between two looks.
    config = make_job(unique(fault), topic, tmp_path, max_records=3000, batch_size=16, timeout_s=4,
                      push_every=1, **DELIVERY[delivery])
    coord, background = Etcd.connect(services), Background()
    try:
        background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
        # Stats every 50 ms, not every second: the waits below for drops read them.
        for i in range(2):
            background.start(lambda stop, i=i: PserverShard(services, ShardOptions(
                config.name, i, lease_ttl_s=2, housekeeping_s=0.05)).run(stop))
        victim = trainer_process(services, config.name, "victim", tmp_path)
        # The fault lands in a state the test sees, not in one it hopes for: the victim holds
        # a claimed task (its pending key), and where groups must be redone, that task has
        # committed fewer than half its groups. No trainer completes the rest of such a task,
        # let alone the rest of the input, between this check and the signal.
        groups_per_task = -(-3000 // 16)
        held = wait_for_value(lambda: victim_mid_task(services, coord, config.name, groups_per_task // 2), 90,
                              "the victim holding a task part-way", interval=0.02)
        victim.kill({"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP, "sigterm": signal.SIGTERM}[fault])
        if fault == "sigterm":  # a clean stop: the task is released at once, not left to time out
            assert victim.wait(30) == 0
            todo = {task["task_id"]: task for task in (json.loads(e.value) for e in
                                                         coord.range(EtcdKeys(config.name).tasks("todo")))}
            assert held in todo and todo[held]["attempt"] == 0 and todo[held]["trainer_id"] is None, \
                f"the victim did not release {held}"
        else:
            assert held in victim_tasks(coord, config.name), f"the victim ended {held} before the fault"
        background.start(lambda stop: Trainer(services, config.name, "rescuer", lease_ttl_s=2).run(stop))
        if fault == "sigstop":
            # Resume the zombie once its task has been requeued and redone by the rescuer.
            wait_for(lambda: shard_stats(redis_conn, config.name)[0].get("dropped", 0) > 0, 60,
                     "the rescuer redoing the victim's task", interval=0.1)
            victim.kill(signal.SIGCONT)
        wait_for(lambda: finished(coord, config.name), 120, "the job's single pass", interval=0.5)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 60,
                 "every example applied exactly once")
        if fault == "sigstop":
            # The zombie learns that its tasks were redone (at a heartbeat, a commit or the
            # completion) and stops; whatever it committed late is then in the topics, and
            # the ledger check below counts it as dropped copies.
            wait_for(lambda: any(line in victim.log.read_text() for line in ZOMBIE_LEARNS), 60,
                     "the resumed victim to learn its task was lost")
            victim.kill(signal.SIGTERM)
            assert victim.wait(30) == 0
        assert_each_task_applied_once(services, redis_conn, config.name, counts)
        assert applied_counts(redis_conn, config.name, counts, topic)  # the copies added nothing
    finally:
        victim.kill(signal.SIGKILL)
        background.close()
        coord.close()
