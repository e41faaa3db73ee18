import fnmatch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from streamtrain.schemas import (
    CONTROLS,
    TASK_STATES,
    EtcdKeys,
    RedisKeys,
    SchemaError,
    Topics,
    partition_label,
    partition_of,
    validate_job_name,
)

FAST = settings(max_examples=80, deadline=None)
job_names = st.from_regex(r"[A-Za-z0-9._-]{1,100}", fullmatch=True).filter(lambda s: s not in (".", ".."))


def raises_naming(format, field, fn, *args):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    assert (info.value.format, info.value.field) == (format, field)
    assert f"'{field}'" in str(info.value)


def test_etcd_keys_follow_the_design_layout():
    keys = EtcdKeys("ctr")
    assert [
        keys.prefix, keys.master_lock, keys.config, keys.ps_desired, keys.ps_prefix, keys.ps(2),
        keys.trainers_prefix, keys.trainer("host-1.4242"), keys.cursors_prefix, keys.cursor("clicks", 3),
        keys.tasks("todo"), keys.task("pending", "clicks:3:00000000000000000100"), keys.slots,
        keys.checkpoints_latest, keys.checkpoint("c-1"), keys.checkpoint_shard("c-1", 0),
        keys.control("pause"), keys.control("rollback"),
    ] == [
        "/streamtrain/ctr/", "/streamtrain/ctr/master/lock", "/streamtrain/ctr/config",
        "/streamtrain/ctr/ps_desired", "/streamtrain/ctr/ps/", "/streamtrain/ctr/ps/2",
        "/streamtrain/ctr/trainers/", "/streamtrain/ctr/trainers/host-1.4242", "/streamtrain/ctr/cursor/",
        "/streamtrain/ctr/cursor/clicks/3", "/streamtrain/ctr/tasks/todo/",
        "/streamtrain/ctr/tasks/pending/clicks:3:00000000000000000100", "/streamtrain/ctr/slots",
        "/streamtrain/ctr/checkpoints/latest", "/streamtrain/ctr/checkpoints/c-1/",
        "/streamtrain/ctr/checkpoints/c-1/0", "/streamtrain/ctr/control/pause",
        "/streamtrain/ctr/control/rollback",
    ]  # fmt: skip


def test_every_task_state_has_its_own_prefix():
    keys = EtcdKeys("ctr")
    prefixes = [keys.tasks(state) for state in TASK_STATES]
    assert TASK_STATES == ("todo", "pending", "done", "failed")
    assert CONTROLS == ("pause", "checkpoint", "rollback", "resize")
    assert all(not a.startswith(b) for a in prefixes for b in prefixes if a != b)


def test_a_task_given_back_to_do_waits_in_todos_retry_lane_and_reads_back_as_its_id():
    keys, task_id = EtcdKeys("ctr"), "clicks:3:00000000000000000100"
    back = keys.task_back("todo", task_id)
    assert back == "/streamtrain/ctr/tasks/todo/retry/clicks:3:00000000000000000100"
    assert back.startswith(keys.retry_prefix) and keys.retry_prefix.startswith(keys.tasks("todo"))
    assert keys.task_back("failed", task_id) == keys.task("failed", task_id)
    assert keys.task_id_of(back) == keys.task_id_of(keys.task("todo", task_id)) == task_id
    # A topic named like the lane is not in it: task ids have no '/'.
    assert not keys.task("todo", "retry:0:00000000000000000000").startswith(keys.retry_prefix)


def test_redis_keys_follow_the_design_layout():
    keys = RedisKeys("ctr")
    assert keys.dense(0, "fc.weight", 3) == "st:{ctr:0}:dense:fc.weight:3"
    assert keys.served(0, "fc.weight", 3) == "st:{ctr:0}:served:fc.weight:3"
    assert keys.row(1, "emb", 2**64 - 1) == "st:{ctr:1}:row:emb:18446744073709551615"
    assert keys.version(1) == "st:{ctr:1}:version"


def test_a_shards_keys_share_one_cluster_slot_and_another_shards_do_not():
    keys = RedisKeys("ctr")

    def of(shard: int) -> list[str]:
        return [keys.dense(shard, "fc.weight", 3), keys.served(shard, "fc.weight", 3), keys.row(shard, "emb", 7),
                keys.version(shard),
                keys.applied(shard), keys.rounds(shard), keys.flushed(shard), keys.stats(shard), keys.steps(shard)]

    assert {key_slot(k.encode()) for k in of(0)} == {key_slot(b"{ctr:0}")}
    assert {key_slot(k.encode()) for k in of(1)} == {key_slot(b"{ctr:1}")} != {key_slot(b"{ctr:0}")}
    assert all(fnmatch.fnmatchcase(k, keys.pattern) for k in of(0) + of(1))
    assert not fnmatch.fnmatchcase(RedisKeys("ctr2").version(0), keys.pattern)


@FAST
@given(st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_rows_builds_the_same_keys_as_row(ids):
    keys = RedisKeys("ctr")
    assert keys.rows(3, "emb", np.array(ids, dtype=np.uint64)) == [keys.row(3, "emb", i) for i in ids]


def test_rows_accepts_signed_ids_and_refuses_negative_ones():
    keys = RedisKeys("ctr")
    assert keys.rows(0, "emb", np.array([0, 7], dtype=np.int64)) == ["st:{ctr:0}:row:emb:0", "st:{ctr:0}:row:emb:7"]
    raises_naming("RedisKeys", "ids[1]", keys.rows, 0, "emb", np.array([0, -7]))
    raises_naming("RedisKeys", "ids", keys.rows, 0, "emb", np.array([0.5]))
    raises_naming("RedisKeys", "ids", keys.rows, 0, "emb", [1, 2])


def test_topics_follow_the_design_layout():
    topics = Topics("ctr")
    assert (topics.examples, topics.grad(0), topics.dlq, topics.metrics) == ("ctr.examples", "ctr.grad.0", "ctr.dlq",
                                                                             "ctr.metrics")


@FAST
@given(job_names)
def test_valid_job_names_are_accepted_everywhere(name):
    assert validate_job_name(name) == name
    assert EtcdKeys(name).prefix == f"/streamtrain/{name}/"
    assert RedisKeys(name).prefix(2) == f"st:{{{name}:2}}:"
    assert len(Topics(name).grad(2**32 - 1)) <= 249


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "a/b", "a:b", "ü", "x" * 101, None, 5, "ctr\n"])
def test_bad_job_names_raise_schema_error_naming_job_name(name):
    raises_naming("Job", "job.name", validate_job_name, name)
    for keys in (EtcdKeys, RedisKeys, Topics):
        raises_naming("Job", "job.name", keys, name)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda k: k.tasks("running"), "tasks.state"),
        (lambda k: k.task("todo", "a/b"), "task_id"),
        (lambda k: k.task("todo", ""), "task_id"),
        (lambda k: k.control("stop"), "control.name"),
        (lambda k: k.trainer("a b"), "trainer_id"),
        (lambda k: k.trainer("a/b"), "trainer_id"),
        (lambda k: k.ps(-1), "ps.index"),
        (lambda k: k.cursor("a/b", 0), "cursor.topic"),
        (lambda k: k.cursor("clicks", -1), "cursor.partition"),
        (lambda k: k.checkpoint("latest"), "checkpoint_id"),
        (lambda k: k.checkpoint("a/b"), "checkpoint_id"),
    ],
)
def test_bad_etcd_key_parts_raise_schema_error(call, field):
    raises_naming("EtcdKeys", field, call, EtcdKeys("ctr"))


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda k: k.dense(0, "", 0), "param"),
        (lambda k: k.dense(0, "w", -1), "block"),
        (lambda k: k.row(0, "emb", 2**64), "id"),
        (lambda k: k.row(0, "", 1), "table"),
        (lambda k: k.row(-1, "emb", 1), "shard"),
        (lambda k: k.version(True), "shard"),
    ],
)
def test_bad_redis_key_parts_raise_schema_error(call, field):
    raises_naming("RedisKeys", field, call, RedisKeys("ctr"))


def test_bad_grad_shard_raises_schema_error():
    raises_naming("Topics", "shard", Topics("ctr").grad, -1)


def test_etcd_keys_parse_back_to_their_parts():
    keys = EtcdKeys("ctr")
    assert keys.trainer_of(keys.trainer("t-0")) == "t-0"
    assert keys.ps_index_of(keys.ps(12)) == 12
    task_id = "clicks:0:00000000000000000512"
    assert all(keys.task_id_of(keys.task(state, task_id)) == task_id for state in ("todo", "pending", "done", "failed"))
    assert keys.checkpoint_path(keys.checkpoint_rolled_back("c-1", 3)) == ("c-1", "rolled", "3")
    assert keys.checkpoint_path(keys.checkpoints_latest) == ("latest",)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda k: k.trainer_of("/streamtrain/other/trainers/t-0"), "trainer_id"),
        (lambda k: k.trainer_of(k.trainers_prefix), "trainer_id"),
        (lambda k: k.trainer_of(k.trainer("t") + "/x"), "trainer_id"),
        (lambda k: k.ps_index_of(k.ps_prefix + "01"), "ps.index"),
        (lambda k: k.ps_index_of(k.ps_prefix + "x"), "ps.index"),
        (lambda k: k.task_id_of(k.tasks_prefix + "lost/t"), "tasks.state"),
        (lambda k: k.checkpoint_path(k.trainer("t")), "checkpoint"),
    ],
)
def test_keys_that_are_not_of_their_kind_raise_schema_error(call, field):
    raises_naming("EtcdKeys", field, call, EtcdKeys("ctr"))


@FAST
@given(st.integers(0, 2**32 - 1))
def test_ps_desired_holds_the_shard_count_in_decimal_and_reads_back(count):
    keys = EtcdKeys("ctr")
    assert keys.ps_desired_value(count) == str(count).encode()  # what masters have always written
    assert keys.ps_desired_of(keys.ps_desired_value(count)) == count


@pytest.mark.parametrize("value", [b"", b"x", b"-1", b"+2", b" 2", b"2 ", b"02", b"1_000", b"2.0", b"\xd9\xa2",
                                   b"4294967296", b"9" * 40, "2", 2, None])
def test_a_ps_desired_that_is_no_shard_count_raises_schema_error_naming_key_and_value(value):
    keys = EtcdKeys("ctr")
    raises_naming("EtcdKeys", "ps_desired", keys.ps_desired_of, value)
    with pytest.raises(SchemaError) as info:
        keys.ps_desired_of(value)
    assert keys.ps_desired in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("count", [-1, 2**32, True, 2.0, "2"])
def test_a_ps_desired_of_no_shard_count_is_not_written(count):
    raises_naming("EtcdKeys", "ps_desired", EtcdKeys("ctr").ps_desired_value, count)


topics = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True).filter(lambda s: s not in (".", ".."))


@FAST
@given(topic=topics, partition=st.integers(0, 2**31 - 1))
def test_partition_labels_parse_back_to_their_topic_and_partition(topic, partition):
    label = partition_label(topic, partition)
    assert partition_of(label) == (topic, partition)
    assert label == f"{topic}:{partition}"  # the stored form: shards' stats and checkpoints hold it


@pytest.mark.parametrize(
    "label, field",
    [("clicks", "partition"), ("clicks:", "partition"), ("clicks:01", "partition"), ("clicks:-1", "partition"),
     ("clicks:2147483648", "partition"), ("clicks:\u0662", "partition"), (3, "partition"),
     (":0", "topic"), ("cl icks:0", "topic"), ("a:b:0", "topic")],
)
def test_labels_that_name_no_partition_raise_schema_error(label, field):
    raises_naming("PartitionLabel", field, partition_of, label)

