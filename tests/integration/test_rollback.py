"""A job-wide checkpoint, more training, then `rollback`: the parameters are the checkpoint's
again, and what came after it is trained once more, exactly once."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import StreamtrainProcess, wait_for
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.offsets import InputOffsets
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.master.service import Master
from streamtrain.operations.checkpoints import request_checkpoint, rollback
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.schemas import EtcdKeys
from streamtrain.trainer.scoring import Scorer
from streamtrain.trainer.worker import Trainer
from test_trainer import (
    HOLDOUT,
    MODEL,
    Background,
    applied_counts,
    applied_exactly,
    make_job,
    run_job,
    shard_stats,
    write_examples,
)

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_rollback_restores_parameters_and_replays_what_came_after(services, redis_conn, topic_factory,
                                                                 unique, tmp_path) -> None:
    topic = topic_factory("rollback", partitions=2)
    config = make_job(unique("rollback"), topic, tmp_path, passes=0, max_records=1000)
    first = write_examples(services, topic, [e.to_json() for e in MODEL.examples(6_000)], 2)
    coord, background = Etcd.connect(services), Background()
    try:
        run_job(services, coord, config, background, trainers=1)
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 120, "the first 6,000")
        checkpoint = request_checkpoint(coord, config.name)
        assert coord.get(EtcdKeys(config.name).checkpoint_job(checkpoint.id)) is not None
        scorer = Scorer(config, redis_conn, SlotMap.from_json(coord.get(EtcdKeys(config.name).slots).value))
        probe = HOLDOUT[:2_000]
        at_checkpoint = scorer.score(probe)

        more = write_examples(services, topic, [e.to_json() for e in MODEL.examples(4_000, start=6_000)], 2)
        both = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120, "all 10,000")
        assert not np.allclose(scorer.score(probe), at_checkpoint, atol=1e-4)

        rollback(coord, config.name, checkpoint.id, resume=False)
        wait_for(lambda: np.allclose(scorer.score(probe), at_checkpoint, atol=1e-6, rtol=0), 10,
                 "the checkpoint's parameters served again")
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 10,
                 "the shards' counts back at the checkpoint")

        coord.delete_prefix(EtcdKeys(config.name).control("pause"))  # trainers go on
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120,
                 "the 4,000 after the checkpoint trained again, once")
    finally:
        background.close()
        coord.close()


def test_a_shard_restarted_after_a_rollback_stays_on_the_rolled_back_timeline(services, redis_conn, topic_factory,
                                                                             unique, tmp_path) -> None:
    """Issue 16: a shard restarted after a rollback, before any checkpoint of its own, loaded the
    newest checkpoint, from the abandoned timeline, or replayed the abandoned deltas after the
    rollback's target; the redone tasks' deltas were then dropped as duplicates (the counts still
    add up, the parameters are wrong). So: every redone group must be applied, none dropped."""
    topic = topic_factory("rbkill", partitions=2)
    config = make_job(unique("rbkill"), topic, tmp_path, passes=0, max_records=1000)
    first = write_examples(services, topic, [e.to_json() for e in MODEL.examples(4_000)], 2)
    coord, background = Etcd.connect(services), Background()
    shard = None
    try:
        background.start(lambda stop: Master(Etcd.connect(services), InputOffsets(services), config).run(stop))
        wait_for(lambda: coord.get(EtcdKeys(config.name).slots) is not None, 30, "the slot map")
        shard = shard_process(services, config.name, tmp_path, 0)
        background.start(lambda stop: PserverShard(services, ShardOptions(config.name, 1, lease_ttl_s=2)).run(stop))
        background.start(lambda stop: Trainer(services, config.name, "t0", lease_ttl_s=2).run(stop))
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 120, "the first 4,000")
        target = request_checkpoint(coord, config.name)
        more = write_examples(services, topic, [e.to_json() for e in MODEL.examples(3_000, start=4_000)], 2)
        both = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120, "all 7,000")
        request_checkpoint(coord, config.name)  # a checkpoint of the timeline the rollback abandons

        rollback(coord, config.name, target.id, resume=False)
        shard.kill()  # SIGKILL before it checkpoints again
        shard.wait()
        shard = shard_process(services, config.name, tmp_path, 1)
        wait_for(lambda: shard_stats(redis_conn, config.name)[0].get("serving"), 60, "the restarted shard serving")
        # The target's counts, not the abandoned ones (the trainers are paused: nothing moves
        # them on meanwhile), once both shards have published all they hold.
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 10, "the target's counts")

        coord.delete_prefix(EtcdKeys(config.name).control("pause"))
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120,
                 "the 3,000 after the target trained again")
        assert [s["dropped"] for s in shard_stats(redis_conn, config.name)] == [0, 0]
        latest = json.loads(coord.get(EtcdKeys(config.name).checkpoints_latest).value)
        assert latest["id"] == target.id  # the abandoned checkpoint is no rollback target any more
    finally:
        if shard is not None:
            shard.kill()
        background.close()
        coord.close()


def shard_process(services, job: str, log_dir, n: int) -> StreamtrainProcess:
    return StreamtrainProcess(services, ["pserver", "--job", job, "--index", "0", "--lease-ttl-s", "2"],
                              f"{job}-shard0-{n}", log_dir)


def test_a_checkpoint_taken_while_trainers_train_is_returned_to_exactly_once(services, redis_conn, topic_factory,
                                                                            unique, tmp_path) -> None:
    """Issue 16: job-wide checkpoints without a pause. Taken while records stream in and two
    trainers train them, the checkpoint holds every task its job record calls done and groups
    of tasks then in hand; rolled back to, those tasks are trained again, the groups the shards
    hold are dropped by their ledgers, and every example ends applied exactly once."""
    topic = topic_factory("rbmid", partitions=2)
    config = make_job(unique("rbmid"), topic, tmp_path, passes=0, max_records=400, batch_size=64)
    keys = EtcdKeys(config.name)
    coord, background = Etcd.connect(services), Background()
    written: dict[int, int] = {0: 0, 1: 0}
    try:
        run_job(services, coord, config, background, trainers=2)
        examples = [e.to_json() for e in MODEL.examples(16_000)]

        def stream(stop) -> None:  # 16,000 records over about 8 s, as a live topic gets them
            for start in range(0, len(examples), 1_000):
                if stop.is_set():
                    return
                for p, n in write_examples(services, topic, examples[start:start + 1_000], 2).items():
                    written[p] += n
                stop.wait(0.5)

        background.start(stream)
        wait_for(lambda: sum(shard_stats(redis_conn, config.name)[0].get("examples_by_partition", {}).values())
                 >= 3_000, 60, "training under way")
        checkpoint = request_checkpoint(coord, config.name)
        assert coord.get(keys.control("pause")) is None  # the trainers were never paused
        record = json.loads(coord.get(keys.checkpoint_job(checkpoint.id)).value)
        assert record["todo"] or record["done"] or record["cursors"]
        wait_for(lambda: sum(written.values()) == len(examples), 60, "every record written")
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 120, "all 16,000")

        rollback(coord, config.name, checkpoint.id, resume=False)
        assert not applied_counts(redis_conn, config.name, written, topic)  # back before the end
        coord.delete_prefix(keys.control("pause"))
        wait_for(lambda: applied_exactly(redis_conn, config.name, written, topic), 60,
                 "what came after the checkpoint trained again, once")
    finally:
        background.close()
        coord.close()


def test_the_master_takes_periodic_rollback_targets_and_prunes_their_records(services, redis_conn, topic_factory,
                                                                            unique, tmp_path) -> None:
    topic = topic_factory("rbperiodic", partitions=2)
    config = make_job(unique("rbperiodic"), topic, tmp_path, passes=0, max_records=1000,
                      pservers={"checkpoint_every_s": 1.0, "keep_checkpoints": 2})
    keys = EtcdKeys(config.name)
    first = write_examples(services, topic, [e.to_json() for e in MODEL.examples(4_000)], 2)
    coord, background = Etcd.connect(services), Background()

    def records() -> list[str]:
        paths = [keys.checkpoint_path(e.key) for e in coord.range(keys.checkpoints_prefix, keys_only=True)]
        return sorted(path[0] for path in paths if path[1:] == ("job",))

    try:
        run_job(services, coord, config, background, trainers=1)
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 120, "the first 4,000")
        named: set[str] = set()

        def latest() -> str | None:
            entry = coord.get(keys.checkpoints_latest)
            if entry is not None:
                named.add(json.loads(entry.value)["id"])
            return json.loads(entry.value)["id"] if entry is not None else None

        wait_for(lambda: latest() and len(named) >= 5, 60, "five periodic checkpoints named the latest")
        assert coord.get(keys.checkpoint_job(latest())) is not None
        # Shards keep 2 and the latest; the master drops the records of what they pruned.
        wait_for(lambda: len(records()) <= 4, 10, "old records pruned")

        more = write_examples(services, topic, [e.to_json() for e in MODEL.examples(2_000, start=4_000)], 2)
        both = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120, "all 6,000")
        rollback(coord, config.name, latest())
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120, "trained again, once")
    finally:
        background.close()
        coord.close()
