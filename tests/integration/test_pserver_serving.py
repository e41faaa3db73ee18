"""Publishing to and pulling from the real Redis."""

from __future__ import annotations

import numpy as np
import pytest

from pserver.optimizers import Adagrad
from pserver.serving import ParamClient, ParamsUnavailableError, Publisher
from pserver.sharding import SlotMap
from pserver.state import ShardState
from schemas import DenseSlice, GradientDelta, SparseRows, TaskRecord

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
    probe = np.array([3, 999, 5000], dtype=np.uint64)  # 5000 was never trained
    pulled = client.pull_rows("user", probe, 8)
    for i, row_id in enumerate(probe[:2]):
        owner = states[slot_map.shard_of_rows("user", probe[i:i + 1])[0]].tables["user"]
        assert np.array_equal(pulled.values[i], owner.values[owner.index.lookup(probe[i:i + 1])[0]])
    fresh = ShardState(Adagrad(lr=0.1))._table("user", 8)
    assert np.array_equal(pulled.values[2], fresh.values[fresh.rows_for(probe[2:])[0]])
    assert set(pulled.versions.values()) == {1}
    blocks, _ = client.pull_blocks([("fc", 0), ("fc", 1)])
    assert set(blocks) == {("fc", 0)} and blocks[("fc", 0)].shape == (4,)


def test_after_a_flush_pulls_are_refused_until_the_shard_republishes(redis_conn, unique) -> None:
    job, slot_map = unique("flush"), SlotMap.uniform(128, 1)
    state = trained_shard(job, 0, slot_map, np.arange(10, dtype=np.uint64))
    publisher = Publisher(redis_conn, job, 0)
    publisher.publish_all(state)
    client = ParamClient(redis_conn, job, slot_map)
    before = client.pull_rows("user", np.arange(10, dtype=np.uint64), 8).values
    for key in redis_conn.scan_iter(f"st:{job}:*"):  # FLUSHALL, limited to this test's job
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
