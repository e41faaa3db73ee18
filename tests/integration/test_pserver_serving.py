"""Publishing to and pulling from the real Redis."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis
import torch

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.optimizers import Adagrad
from streamtrain.params.paramstore import ParamClient, ParamsUnavailableError
from streamtrain.params.watches import AppliedWatch
from streamtrain.pserver.redis_rounds import Publisher, Snapshot
from streamtrain.pserver.state import Changes, ShardState
from streamtrain.schemas import DenseSlice, GradientDelta, RedisKeys, SparseRows, TaskRecord
from streamtrain.trainer.params import DenseLayout, ParamSync
from streamtrain.trainer.replica import RowReplica

pytestmark = pytest.mark.services


def trained_shard(job: str, shard: int, slot_map: SlotMap, ids: np.ndarray) -> ShardState:
    state = ShardState(Adagrad(lr=0.1))
    mine = ids[slot_map.shard_of_rows("user", ids) == shard]
    grads = np.ones((len(mine), 8), dtype=np.float32)
    state.apply(GradientDelta(TaskRecord.make_id("in", 0, 0), 0, "t", shard, 0, 1,
                              sparse=(SparseRows("user", mine, grads),),
                              dense=(DenseSlice("fc", 0, 0, np.ones(4, dtype=np.float32)),)
                              if slot_map.shard_of_block("fc", 0) == shard else ()))
    return state


def test_pull_returns_what_the_shards_published_with_their_versions(redis_conn, unique) -> None:
    job, slot_map = unique("serve"), SlotMap.uniform(128, 2)
    ids = np.arange(1000, dtype=np.uint64)
    states = [trained_shard(job, s, slot_map, ids) for s in range(2)]
    for s, state in enumerate(states):
        assert Publisher(redis_conn, job, s).publish_all(state) == 1
    client = ParamClient(redis_conn, job, slot_map)
    # Ids of one to four digits, shuffled: each shard's MGET names its keys grouped by digits,
    # and every row must still come back in the place of its id. 5000 was never trained.
    probe = np.concatenate([np.random.default_rng(0).permutation(ids), [5000]]).astype(np.uint64)
    pulled = client.pull_rows("user", probe, 8)
    for i in range(len(ids)):
        owner = states[slot_map.shard_of_rows("user", probe[i:i + 1])[0]].tables["user"]
        assert np.array_equal(pulled.values[i], owner.values[owner.index.lookup(probe[i:i + 1])[0]])
    fresh = ShardState(Adagrad(lr=0.1))._table("user", 8)
    assert np.array_equal(pulled.values[-1], fresh.values[fresh.rows_for(probe[-1:])[0]])
    assert set(pulled.versions.values()) == {1}
    blocks, _ = client.pull_blocks([("fc", 0), ("fc", 1)])
    assert set(blocks) == {("fc", 0)} and blocks[("fc", 0)].shape == (4,)


def test_a_pull_whose_kept_connection_was_closed_is_retried_on_a_new_one(redis_conn, unique) -> None:
    """A client keeps a connection between pulls; one the server closed meanwhile (a restarted
    Redis) fails that pull alone (ParamSync retries it), and the next reads the same values."""
    job, slot_map = unique("kept"), SlotMap.uniform(128, 1)
    ids = np.arange(50, dtype=np.uint64)
    assert Publisher(redis_conn, job, 0).publish_all(trained_shard(job, 0, slot_map, ids)) == 1
    name = f"{job}-puller"
    pool = redis_conn.connection_pool
    puller = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **pool.connection_kwargs | {"client_name": name}))
    client = ParamClient(puller, job, slot_map)
    before = client.pull_rows("user", ids, 8).values
    kept = [c["id"] for c in redis_conn.client_list() if c["name"] == name]
    assert len(kept) == 1  # the pull's connection, still open
    redis_conn.client_kill_filter(_id=kept[0])  # only this client's: other tests' stay
    with pytest.raises(ParamsUnavailableError):
        client.pull_rows("user", ids, 8)
    assert np.array_equal(client.pull_rows("user", ids, 8).values, before)  # as ParamSync retries
    puller.close()


def test_after_a_flush_pulls_are_refused_until_the_shard_republishes(redis_conn, unique) -> None:
    job, slot_map = unique("flush"), SlotMap.uniform(128, 1)
    state = trained_shard(job, 0, slot_map, np.arange(10, dtype=np.uint64))
    publisher = Publisher(redis_conn, job, 0)
    publisher.publish_all(state)
    client = ParamClient(redis_conn, job, slot_map)
    before = client.pull_rows("user", np.arange(10, dtype=np.uint64), 8).values
    for key in redis_conn.scan_iter(RedisKeys(job).pattern):  # FLUSHALL, limited to this test's job
        redis_conn.delete(key)
    assert not publisher.published()
    with pytest.raises(ParamsUnavailableError):
        client.pull_rows("user", np.arange(10, dtype=np.uint64), 8)
    publisher.publish_all(state)
    assert np.array_equal(client.pull_rows("user", np.arange(10, dtype=np.uint64), 8).values, before)


def test_a_pull_sent_ahead_reads_what_a_pull_reads_and_a_cancelled_one_leaves_no_stray_reply(
        redis_conn, unique) -> None:
    job, slot_map = unique("ahead"), SlotMap.uniform(128, 2)
    ids = np.arange(1000, dtype=np.uint64)
    for s in range(2):
        Publisher(redis_conn, job, s).publish_all(trained_shard(job, s, slot_map, ids))
    client = ParamClient(redis_conn, job, slot_map)
    probe = np.array([3, 999, 5000], dtype=np.uint64)
    request = ({"user": (probe, 8), "empty": (np.zeros(0, dtype=np.uint64), 4)}, [("fc", 0), ("fc", 1)])
    sent = client.send_pull(*request)
    redis_conn.set(f"st:{job}:meanwhile", b"x")  # the client is used while the replies wait
    pulled = sent.result()
    again = client.pull(*request)
    assert np.array_equal(pulled.rows["user"], again.rows["user"]) and pulled.rows["empty"].shape == (0, 4)
    assert set(pulled.blocks) == {("fc", 0)} and pulled.versions == again.versions
    for _ in range(20):  # cancelled pulls must not leave replies for the next user of a connection
        client.send_pull(*request).cancel()
        assert np.array_equal(client.pull(*request).rows["user"], pulled.rows["user"])


def replica_sync(redis_conn, job: str, slot_map: SlotMap) -> ParamSync:
    layout = DenseLayout(torch.nn.Linear(1, 1))
    return ParamSync(ParamClient(redis_conn, job, slot_map), layout, wait_s=5,
                     replica=RowReplica("user", 8, slot_map.shards))


def fetch(sync: ParamSync, slot_map: SlotMap, ids: np.ndarray) -> np.ndarray:
    return sync.send({"user": 8}, ids, {"user": slot_map.shard_of_rows("user", ids)}, dense=False
                     ).result().rows["user"]


def step(job: str, state: ShardState, shard: int, slot_map: SlotMap, ids: np.ndarray, seq: int) -> Changes:
    mine = ids[slot_map.shard_of_rows("user", ids) == shard]
    return state.apply(GradientDelta(TaskRecord.make_id("in", 0, 0), seq, "t", shard, seq, 1,
                                     sparse=(SparseRows("user", mine, np.ones((len(mine), 8), np.float32)),)))


def flush_all(publishers: list[Publisher], states: list[ShardState]) -> None:
    for publisher, state in zip(publishers, states):
        publisher.send(publisher.snapshot(state, Changes(), flush=True))


def unflushed(publisher: Publisher, state: ShardState, changes: Changes) -> None:
    publisher.send(publisher.snapshot(state, changes, flush=False))


def test_a_trainers_replica_follows_the_rounds_so_its_rows_are_current_before_the_keys_are(
        redis_conn, unique) -> None:
    job, slot_map = unique("replica"), SlotMap.uniform(128, 2)
    ids = np.arange(1000, dtype=np.uint64)
    states = [trained_shard(job, s, slot_map, ids) for s in range(2)]
    publishers = [Publisher(redis_conn, job, s) for s in range(2)]
    for publisher, state in zip(publishers, states):
        publisher.publish_all(state)
    sync = replica_sync(redis_conn, job, slot_map)
    client = sync.client
    probe = np.array([3, 500, 999, 5000], dtype=np.uint64)
    assert np.array_equal(fetch(sync, slot_map, probe), client.pull_rows("user", probe, 8).values)
    assert sync.replica.size == 4
    # The shards change two rows and publish the rounds without writing the row keys: the
    # replica has them from the rounds, a trainer that starts now too (from the last flush).
    stale = client.pull_rows("user", probe, 8).values
    for seq in (1, 2):
        for s in range(2):
            unflushed(publishers[s], states[s], step(job, states[s], s, slot_map, probe[:2], seq))
    later = replica_sync(redis_conn, job, slot_map)
    wider = np.array([3, 500, 999, 5000, 7], dtype=np.uint64)
    got, got_later = fetch(sync, slot_map, wider), fetch(later, slot_map, wider)
    assert np.array_equal(client.pull_rows("user", probe, 8).values, stale)  # the keys lag
    flush_all(publishers, states)
    assert np.array_equal(got, client.pull_rows("user", wider, 8).values) and np.array_equal(got, got_later)
    assert not np.array_equal(got[:2], stale[:2])
    assert sync.replica.size == 5 and sync.replica.drops == 0
    # A republish (a restarted shard) starts a new epoch: the replica drops that shard's rows.
    owner = int(slot_map.shard_of_rows("user", probe[:1])[0])
    states[owner].tables["user"].values[:] += 1.0
    publishers[owner].publish_all(states[owner])
    unflushed(publishers[owner], states[owner], step(job, states[owner], owner, slot_map, probe[:1], 3))
    got = fetch(sync, slot_map, wider)
    flush_all(publishers, states)
    assert np.array_equal(got, client.pull_rows("user", wider, 8).values)
    assert sync.replica.drops == 1
    # Rounds trimmed before the replica read them: a gap, so the shard's rows are dropped and
    # followed again from its last flush.
    for seq in range(4, 7):
        unflushed(publishers[owner], states[owner], step(job, states[owner], owner, slot_map, probe[:1], seq))
    flush_all(publishers, states)
    unflushed(publishers[owner], states[owner], step(job, states[owner], owner, slot_map, probe[:1], 7))
    flushed = client.flushed([owner])[owner].at
    redis_conn.xtrim(RedisKeys(job).rounds(owner), minid=flushed, approximate=False)
    fetch(sync, slot_map, wider)  # finds the gap, drops, reads the rows again from the keys
    got = fetch(sync, slot_map, wider)  # and the rounds after the flush
    flush_all(publishers, states)
    assert np.array_equal(got, client.pull_rows("user", wider, 8).values)
    assert sync.replica.drops == 2


def test_a_watch_wakes_when_a_round_carries_a_newer_step_of_its_trainer_and_reads_the_keys_if_none_comes(
        redis_conn, unique) -> None:
    job = unique("watch")
    publisher = Publisher(redis_conn, job, 1)
    publisher.send(Snapshot([], []), {"t": 3})  # before anyone listens: read from the key
    watch = AppliedWatch(redis_conn, job, 2, "t")
    try:
        assert watch.wait(0.01) == {1: {"t": 3}}
        publisher.send(Snapshot([], []), {"t": 7})  # a round of duplicates only: no rows, a step
        publisher.send(Snapshot([], []), {"t": 8, "u": 1})
        assert watch.wait(1.0) == {1: {"t": 8}}  # the newest of what arrived
        began = time.monotonic()
        publisher.send(Snapshot([], []), {"t": 8, "u": 2})  # another trainer's step: no wake
        assert watch.wait(0.2) == {1: {"t": 8, "u": 2}} and time.monotonic() - began >= 0.2
    finally:
        watch.close()


def test_scoring_pulls_the_served_average_and_training_the_values_at_one_version(redis_conn, unique) -> None:
    job, slot_map = unique("served"), SlotMap.uniform(128, 1)
    state = ShardState(Adagrad(lr=0.1), average_steps=4)
    for seq in range(3):
        state.apply(GradientDelta(TaskRecord.make_id("in", 0, 0), seq, "t", 0, seq, 1,
                                  dense=(DenseSlice("fc", 0, 0, np.full(4, seq + 1.0, dtype=np.float32)),)))
    Publisher(redis_conn, job, 0).publish_all(state)
    trained, trained_versions = ParamClient(redis_conn, job, slot_map).pull_blocks([("fc", 0)])
    served, served_versions = ParamClient(redis_conn, job, slot_map, served=True).pull_blocks([("fc", 0)])
    block = state.dense[("fc", 0)]
    assert np.array_equal(trained[("fc", 0)], block.values[0]) and np.array_equal(served[("fc", 0)], block.served()[0])
    assert not np.array_equal(served[("fc", 0)], trained[("fc", 0)]) and served_versions == trained_versions
