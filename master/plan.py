"""The master's decisions as pure functions of state: what to cut, fold, expire, restart.

Nothing here touches etcd or Kafka (the service applies the decisions), so every rule of the
task queue can be tested exhaustively without services. See docs/master.md for the queue's
design.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from schemas import PartitionCursor, TaskRecord


def cut(cursor: PartitionCursor, end: int, max_records: int, linger_due: bool,
        budget: int) -> tuple[list[TaskRecord], PartitionCursor]:
    """Contiguous tasks from the cursor towards `end` (the partition's last stable offset).

    Full tasks of `max_records` offsets are cut whenever there is room; the partial task at the
    head of a live stream only once `linger_due` (freshness against task overhead). Bounded
    input stops at `cursor.stop` and cuts its last partial task at once: nothing more is coming.
    At most `budget` tasks, so that a backlog waits in Kafka rather than in etcd.
    """
    limit = end if cursor.stop is None else min(end, cursor.stop)
    start = cursor.next
    tasks: list[TaskRecord] = []
    while len(tasks) < budget and limit - start >= max_records:
        tasks.append(TaskRecord.for_range(cursor.topic, cursor.partition, start,
                                          start + max_records, cursor.pass_no))
        start += max_records
    at_stop = cursor.stop is not None and limit == cursor.stop
    if len(tasks) < budget and start < limit and (linger_due or at_stop):
        tasks.append(TaskRecord.for_range(cursor.topic, cursor.partition, start, limit,
                                          cursor.pass_no))
        start = limit
    return tasks, replace(cursor, next=start)


def fold(cursor: PartitionCursor, resolved: Iterable[TaskRecord],
         limit: int | None = None) -> tuple[PartitionCursor, list[TaskRecord]]:
    """Advance `trained` over resolved (done or failed) tasks that start exactly at it.

    Returns the new cursor and the tasks folded in (at most `limit`, so the deletes fit one
    transaction). Tasks of another pass or below the watermark are ignored; ranges above a
    gap wait for the gap to resolve.
    """
    by_start = {t.start: t for t in resolved
                if t.pass_no == cursor.pass_no and t.start >= cursor.trained}
    trained = cursor.trained
    folded = []
    while (limit is None or len(folded) < limit) and (task := by_start.get(trained)) is not None:
        folded.append(task)
        trained = task.end
    return (replace(cursor, trained=trained) if folded else cursor), folded


def retry_or_fail(task: TaskRecord, max_attempts: int, reason: str) -> tuple[str, TaskRecord]:
    """A task whose attempt ended without completing: back to todo with attempt + 1, or to
    failed once `max_attempts` attempts have been used (a poison task must not crash trainers
    forever)."""
    attempts_used = task.attempt + 1
    if attempts_used >= max_attempts:
        return "failed", replace(task, reason=f"{reason} (attempt {attempts_used} of {max_attempts})",
                                 deadline=None)
    return "todo", replace(task, attempt=attempts_used, trainer_id=None, deadline=None,
                           reason=reason)


def next_pass(cursors: Iterable[PartitionCursor], passes: int,
              open_passes: Iterable[int]) -> tuple[str, list[PartitionCursor]]:
    """Bounded input: when the lowest pass is trained everywhere and none of its tasks is
    open (todo or pending), restart every partition of that pass at its origin with pass + 1.

    Returns ("running" | "advance" | "finished", cursors to write). Partitions already moved
    on (a master died halfway through an advance) are left alone, so the step is idempotent.
    """
    cursors = list(cursors)
    if not cursors or any(c.stop is None for c in cursors):
        return "running", []
    low = min(c.pass_no for c in cursors)
    lowest = [c for c in cursors if c.pass_no == low]
    if low in set(open_passes) or not all(c.complete for c in lowest):
        return "running", []
    if low + 1 >= passes:
        return "finished", []
    return "advance", [replace(c, next=c.origin, trained=c.origin, pass_no=low + 1) for c in lowest]
