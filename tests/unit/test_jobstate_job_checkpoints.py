"""Restoring the job's side of a checkpoint (`jobstate.job_checkpoints.restore_batches`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from streamtrain.jobstate.etcd import MAX_TXN_OPS, Entry
from streamtrain.jobstate.job_checkpoints import job_record, restore_batches
from streamtrain.schemas import EtcdKeys, JobRecord, JobState, PartitionCursor, SchemaError, TaskRecord

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


class RangesOnly:
    """What job_record reads of etcd: several prefixes at one revision."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def ranges(self, prefixes: list[str]) -> list[list[Entry]]:
        return [[Entry(k, v, 1, 1) for k, v in sorted(self.values.items()) if k.startswith(p)] for p in prefixes]


def test_a_record_holds_what_etcd_held_releases_tasks_in_hand_and_restores_it() -> None:
    cursor = PartitionCursor("clicks", 0, next=3000, trained=1000, origin=0)
    todo, held, done = (TaskRecord.for_range("clicks", 0, s, s + 1000) for s in (2000, 1000, 0))
    held = replace(held, trainer_id="t-1", deadline=5.0, claim=1)
    newer = b'{"v":2,"task_id":"clicks:1:00000000000000000000","shape":"new"}'
    etcd = RangesOnly({
        KEYS.cursor("clicks", 0): cursor.to_json(),
        KEYS.task("todo", todo.task_id): todo.to_json(),
        KEYS.task("todo", "clicks:1:00000000000000000000"): newer,
        KEYS.task("pending", held.task_id): held.to_json(),
        KEYS.task("done", done.task_id): done.to_json(),
        KEYS.state: JobState("running", 1.0).to_json(),
    })
    saved = JobRecord.from_json(job_record(etcd, KEYS))
    assert [PartitionCursor.from_json(c.to_json()) for c in saved.cursors] == [cursor]
    released = TaskRecord.from_json(saved.todo[-1].to_json())
    assert (released.task_id, released.trainer_id, released.deadline, released.claim) == (held.task_id, None, None, 1)
    puts = {op.key: op.value for batch in restore_batches(KEYS, job_record(etcd, KEYS))[1:] for op in batch}
    assert puts[KEYS.task("todo", "clicks:1:00000000000000000000")] == newer  # kept as it was, unknown to us
    assert set(puts) == set(etcd.values) - {KEYS.task("pending", held.task_id)} | {KEYS.task("todo", held.task_id)}


def test_a_task_in_the_retry_lane_is_recorded_as_to_do_and_restored_in_input_order() -> None:
    given_back, first, second = (TaskRecord.for_range("clicks", 0, s, s + 1000) for s in (0, 1000, 2000))
    etcd = RangesOnly({
        KEYS.task_back("todo", replace(given_back, attempt=1).task_id): replace(given_back, attempt=1).to_json(),
        KEYS.task("todo", first.task_id): first.to_json(),
        KEYS.task("todo", second.task_id): second.to_json(),
    })
    batches = restore_batches(KEYS, job_record(etcd, KEYS))
    todo = [op.key for op in batches[-1]]
    assert todo == [KEYS.task("todo", t.task_id) for t in (given_back, first, second)]


def test_values_that_cannot_be_written_back_are_left_out_of_the_record(caplog) -> None:
    task = TaskRecord.for_range("clicks", 0, 0, 1000)
    etcd = RangesOnly({
        KEYS.task("done", task.task_id): task.to_json(),
        KEYS.task("done", "garbage"): b"not json",
        KEYS.task("done", "elsewhere"): task.to_json(),  # names another key
        KEYS.task("failed", "no-id"): b'{"v":1}',
        KEYS.cursor("clicks", 1): b"[]",
    })
    saved = JobRecord.from_json(job_record(etcd, KEYS))
    assert [t.doc["task_id"] for t in saved.done] == [task.task_id]
    assert saved.failed == saved.cursors == () and saved.state is None
    assert len([r for r in caplog.records if "leaves out" in r.getMessage()]) == 4


def test_a_record_whose_tasks_do_not_name_their_keys_is_refused_before_anything_is_written() -> None:
    data = json.dumps({"v": 1, "cursors": [], "todo": [], "done": [{"v": 1}], "failed": []}).encode()
    with pytest.raises(SchemaError) as caught:
        restore_batches(KEYS, data)
    assert (caught.value.format, caught.value.field) == ("JobRecord", "done[0].task_id")
