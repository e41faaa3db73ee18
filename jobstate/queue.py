"""The task queue's rules that the master and every trainer's task client apply alike: the
order todo tasks are claimed in, and what becomes of a task whose attempt ended without
completing. Pure functions (docs/master.md has the queue's design)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TypeVar

from streamtrain.schemas import PartitionCursor, SchemaError, TaskId, TaskRecord
from streamtrain.schemas.keys import TaskState

T = TypeVar("T")


def rounds_of(tasks: Iterable[TaskRecord]) -> list[list[TaskRecord]]:
    """Tasks regrouped as `cut_rounds` cuts them: round k holds each partition's k-th task, in
    pass and offset order (a checkpoint's todo queue is written back this way)."""
    return _rounds((TaskId(t.topic, t.partition, t.start, t.pass_no), t) for t in tasks)


def claim_order(listed: Sequence[tuple[int, str]], truncated: bool) -> list[int]:
    """The order to claim listed todo tasks in, as indices into `listed`: (creation revision,
    task id) pairs, oldest first, as etcd lists them.

    Creation revision is write order, but the tasks of one transaction share it, and etcd
    orders those arbitrarily; within a revision they are taken in rounds (`rounds_of`), as the
    master cut them. A listing cut at its limit may hold only part of its newest revision:
    that revision waits for the next listing unless it is all there is. Ids that do not parse
    go last (the record's reader reports them).
    """
    groups: dict[int, list[tuple[TaskId, int]]] = {}
    unparsed = []
    for i, (revision, task_id) in enumerate(listed):
        try:
            groups.setdefault(revision, []).append((TaskRecord.parse_id(task_id), i))
        except SchemaError:
            unparsed.append(i)
    revisions = sorted(groups)
    if truncated and len(revisions) > 1:
        revisions.pop()
    return [i for r in revisions for round_ in _rounds(groups[r]) for i in round_] + unparsed


def input_order(task_ids: Sequence[str]) -> list[int]:
    """The order of tasks in their input, as indices into `task_ids`: rounds as the slicer cuts
    them (`rounds_of`), whatever order they were written in. Ids that do not parse go last."""
    placed, unparsed = [], []
    for i, task_id in enumerate(task_ids):
        try:
            placed.append((TaskRecord.parse_id(task_id), i))
        except SchemaError:
            unparsed.append(i)
    return [i for round_ in _rounds(placed) for i in round_] + unparsed


def _rounds(placed: Iterable[tuple[TaskId, T]]) -> list[list[T]]:
    queues: dict[tuple[str, int], list[tuple[TaskId, T]]] = {}
    for where, item in sorted(placed, key=lambda p: (p[0].pass_no, p[0].start)):
        queues.setdefault((where.topic, where.partition), []).append((where, item))
    depth = max(map(len, queues.values()), default=0)
    return [[q[k][1] for _, q in sorted(queues.items()) if k < len(q)] for k in range(depth)]


def retry_or_fail(task: TaskRecord, max_attempts: int, reason: str) -> tuple[TaskState, TaskRecord]:
    """A task whose attempt failed (its trainer said so: the range could not be trained, or
    its records kill the loader): back to todo with attempt + 1, or to failed once
    `max_attempts` attempts have been used (a poison task must not be retried forever)."""
    attempts_used = task.attempt + 1
    if attempts_used >= max_attempts:
        return "failed", replace(task, reason=f"{reason} (attempt {attempts_used} of {max_attempts})",
                                 deadline=None)
    return "todo", replace(task, attempt=attempts_used, trainer_id=None, deadline=None,
                           reason=reason)


def requeue_lost(task: TaskRecord, reason: str) -> TaskRecord:
    """A task whose holder was lost (it died, was frozen past its lease, was cut off from etcd
    or fell past the timeout): back to todo with its attempt unchanged. Losing the holder says
    nothing against the task, whose records are decoded in the loader's process (a record that
    kills it fails the task); counted, a run of SIGKILLs and service restarts uses up tasks'
    attempts and drops their records as failed."""
    return replace(task, trainer_id=None, deadline=None, reason=reason)


def folded(cursor: PartitionCursor | None, task: TaskRecord) -> bool:
    """Whether the master has folded `task` into its partition's `cursor` (and deleted its done
    key, or is about to): a task of an earlier pass, or one ending at or below what the
    cursor's pass has trained."""
    return cursor is not None and (task.pass_no < cursor.pass_no or
                                   (task.pass_no == cursor.pass_no and task.end <= cursor.trained))
