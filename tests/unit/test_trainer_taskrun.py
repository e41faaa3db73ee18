"""A task's run: what the trainer knows of a task only while training it, made afresh per task."""

from __future__ import annotations

from streamtrain.jobstate.tasks import ClaimedTask
from streamtrain.schemas import TaskRecord
from streamtrain.trainer.feed import Chunk
from streamtrain.trainer.worker import TaskRun


def test_a_run_begins_at_its_first_chunk_and_shares_nothing_with_the_run_before() -> None:
    record = TaskRecord.for_range("clicks", 3, 100, 200)
    first = Chunk(ClaimedTask(record, b"v"), claimed_at=12.5)
    run = TaskRun.of(first, "t-1", batch_size=64)
    assert (run.task, run.fed, run.heartbeat_at, run.seq, run.batcher.size) == (first.task, first, 12.5, 0, 64)
    assert (run.metrics.task_id, run.metrics.trainer_id, run.metrics.attempt) == (record.task_id, "t-1", record.attempt)
    run.seq, run.metrics.bad_records = 4, 2
    again = TaskRun.of(first, "t-1", batch_size=64)
    assert again.seq == 0 and again.metrics is not run.metrics and again.batcher is not run.batcher
    assert again.metrics.bad_records == 0
