"""Sync and bounded-staleness SGD with real shards and trainers: the barrier holds steps,
lets a frozen trainer go when its lease expires, and nothing is applied twice or lost."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from conftest import wait_for
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.master.service import Master
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.schemas import BarrierSteps, EtcdKeys, RedisKeys
from streamtrain.schemas.config import SgdMode
from streamtrain.trainer.steps import StepGate
from streamtrain.trainer.worker import Trainer
from test_trainer import (
    MODEL,
    Background,
    applied_exactly,
    finished,
    make_job,
    shard_stats,
    trainer_process,
    write_examples,
)

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_sync_barrier_releases_steps_and_lets_a_frozen_trainer_go(services, redis_conn, topic_factory,
                                                                 unique, tmp_path) -> None:
    topic = topic_factory("sync", partitions=2)
    # 625 mini-batches, 313 steps at the default two a push: the in-process trainer can train
    # many steps alone while the trainer process starts, and at least ten must be left after
    # the freeze (16,000 records, 125 steps, left too few in one CI run).
    counts = write_examples(services, topic, [e.to_json() for e in MODEL.examples(40_000)], 2)
    config = make_job(unique("sync"), topic, tmp_path, sgd="sync", batch_size=64, max_records=1000, timeout_s=6)
    coord, background = Etcd.connect(services), Background()
    frozen = None
    try:
        background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
        for i in range(2):
            background.start(lambda stop, i=i: PserverShard(services, ShardOptions(config.name, i, lease_ttl_s=2))
                             .run(stop))
        # Paused (no task is claimed) until both trainers are up: the first one up, alone, could
        # otherwise train most of the steps, or all of them, before the other starts (a fresh
        # clone's CI saw the in-process one find no task left).
        keys = EtcdKeys(config.name)
        pause = keys.control("pause")
        coord.put(pause, b"until both trainers are up")
        frozen = trainer_process(services, config.name, "frozen", tmp_path)
        background.start(lambda stop: Trainer(services, config.name, "steady", lease_ttl_s=2).run(stop))
        wait_for(lambda: {keys.trainer_of(e.key) for e in coord.range(keys.trainers_prefix)}
                 >= {"frozen", "steady"}, 90, "both trainers registered", interval=0.1)
        coord.delete_prefix(pause)
        # Both trainers at the barrier: each step waits for both.
        wait_for(lambda: len((shard_stats(redis_conn, config.name)[0].get("barrier") or {})
                             .get("participants", [])) == 2, 90, "two trainers at the barrier", interval=0.1)
        step_before = shard_stats(redis_conn, config.name)[0]["barrier"]["next_step"]
        frozen.kill(signal.SIGSTOP)  # its lease expires: it must leave the barrier
        wait_for(lambda: shard_stats(redis_conn, config.name)[0]["barrier"]["next_step"] > step_before + 10,
                 60, "steps released without the frozen trainer", interval=0.2)
        frozen.kill(signal.SIGCONT)
        wait_for(lambda: finished(coord, config.name), 180, "the job's single pass", interval=0.5)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 30, "exactly once")
        assert all(s["barrier"]["waiting"] == 0 for s in shard_stats(redis_conn, config.name))
    finally:
        if frozen is not None:
            frozen.kill(signal.SIGCONT)
            frozen.kill(signal.SIGTERM)
            frozen.wait(30)
        background.close()
        coord.close()


def test_bounded_staleness_keeps_trainers_within_s_steps(services, redis_conn, topic_factory, unique, tmp_path) -> None:
    topic = topic_factory("bounded", partitions=2)
    counts = write_examples(services, topic, [e.to_json() for e in MODEL.examples(6_000)], 2)
    # Tasks of 100 records: a trainer claims at most a few ahead, so both have work until the
    # last few tasks (with 1,000-record tasks one could hold four of the six).
    staleness = 3
    config = make_job(unique("bounded"), topic, tmp_path, sgd="bounded", staleness=staleness, batch_size=64,
                      max_records=100)
    coord, background = Etcd.connect(services), Background()
    spread = []

    def watch() -> bool:
        raw = redis_conn.get(RedisKeys(config.name).steps(0))
        steps = BarrierSteps.from_json(raw).trainers if raw else {}
        # The bound holds back a trainer ahead of one that is still training; once one has no
        # task left, the other rightly goes on (after the gate's capped wait).
        holders = {json.loads(e.value)["trainer_id"] for e in coord.range(EtcdKeys(config.name).tasks("pending"))}
        if {"a", "b"} <= set(steps) and {"a", "b"} <= holders:
            spread.append(abs(steps["a"] - steps["b"]))
        return finished(coord, config.name)

    try:
        background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
        for i in range(2):
            background.start(lambda stop, i=i: PserverShard(services, ShardOptions(config.name, i, lease_ttl_s=2))
                             .run(stop))
        for name in ("a", "b"):
            background.start(lambda stop, name=name: Trainer(services, config.name, name, lease_ttl_s=2).run(stop))
        wait_for(watch, 180, "the job's single pass", interval=0.05)
        wait_for(lambda: applied_exactly(redis_conn, config.name, counts, topic), 30, "exactly once")
        # The first trainer up runs ahead alone until the second one's first step reaches a
        # shard, and the step it is training then still lands before its gate sees the other:
        # the spread may first read s + 2 or more (5, then 6, in one CI run). Once the second
        # is within s, the first's gate has seen it: from then on neither may be more than s,
        # plus the step it is training, plus one step between the shards' reads, ahead.
        bound = staleness + 2
        together = next((i for i, d in enumerate(spread) if d <= staleness), None)
        assert together is not None, spread
        assert max(spread[together:]) <= bound, spread[together:]
    finally:
        background.close()
        coord.close()


def test_a_gated_trainer_joins_once_every_shard_has_written_its_steps(redis_conn, unique) -> None:
    """After a Redis restart (or before the shards are up) there are no steps documents: a
    trainer must not join at step 0, which in bounded mode would read its own steps as visible
    at once while the shards remember its predecessor's newer one."""
    job = unique("join")
    keys = RedisKeys(job)
    gate = StepGate(redis_conn, job, 2, SgdMode.BOUNDED, 2, "t2", max_wait_s=5)  # joining anew
    redis_conn.set(keys.steps(0), BarrierSteps(0, {"t0": 40, "t1": 37}).to_json())
    writer = threading.Timer(0.5, lambda: redis_conn.set(keys.steps(1),
                                                         BarrierSteps(0, {"t0": 41, "t1": 30}).to_json()))
    began = time.monotonic()
    writer.start()
    try:
        assert gate.first_step(wait_s=10) == 31  # t1's step at shard 1, written 0.5 s later
        assert time.monotonic() - began >= 0.5
        redis_conn.delete(keys.steps(1))
        assert gate.first_step(wait_s=0.3) == 38  # one shard silent past the wait: the others say
    finally:
        writer.cancel()
        gate.close()
