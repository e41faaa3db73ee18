"""Restoring the job's side of a checkpoint (`jobstate.checkpoints.restore_batches`)."""

from __future__ import annotations

import json

import pytest

from streamtrain.jobstate.checkpoints import restore_batches
from streamtrain.jobstate.etcd import MAX_TXN_OPS
from streamtrain.schemas import EtcdKeys, JobState, PartitionCursor, SchemaError, TaskRecord

KEYS = EtcdKeys("ctr")


def record(todo: list[TaskRecord], **more) -> bytes:
    cursor = PartitionCursor("clicks", 0, next=3000, trained=1000, origin=0)
    return json.dumps({"v": 1, "cursors": [json.loads(cursor.to_json())],
                       "todo": [json.loads(t.to_json()) for t in todo], "done": [], "failed": [],
                       "state": json.loads(JobState("running").to_json()), **more}).encode()


def test_a_record_is_put_back_after_clearing_the_queues_cursors_and_state() -> None:
    todo = [TaskRecord.for_range("clicks", p, s, s + 1000) for s in (1000, 2000) for p in (0, 1)]
    batches = restore_batches(KEYS, record(todo))
    clear, *writes = batches
    assert {op.key for op in clear} == {KEYS.tasks_prefix, KEYS.cursors_prefix, KEYS.state}
    puts = [op for batch in writes for op in batch]
    assert puts[0].key == KEYS.cursor("clicks", 0) and PartitionCursor.from_json(puts[0].value).next == 3000
    assert JobState.from_json(puts[1].value) == JobState("running")
    restored = [TaskRecord.from_json(op.value) for op in puts[2:]]
    assert sorted(t.task_id for t in restored) == sorted(t.task_id for t in todo)
    assert all(len(batch) <= MAX_TXN_OPS for batch in batches)


@pytest.mark.parametrize("data", [b"not json", b"[]", json.dumps({"v": 2, "cursors": []}).encode()])
def test_a_record_of_another_version_or_none_is_refused_before_anything_is_written(data) -> None:
    with pytest.raises(SchemaError) as caught:
        restore_batches(KEYS, data)
    assert caught.value.format == "JobRecord"
