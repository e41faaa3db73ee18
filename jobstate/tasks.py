"""The trainers' side of the task queue: claim, heartbeat, complete, fail, release.

Every call is one etcd transaction on the task's keys; none goes through the master, so a
master restart never stalls training. A claim moves todo → pending if the todo key is still
the version this trainer saw; every later call compares the pending value to the exact bytes
this attempt wrote, so an attempt that timed out and was requeued (a zombie) is refused.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace

from streamtrain.jobstate import queue
from streamtrain.jobstate.errors import TaskLostError
from streamtrain.jobstate.etcd import (
    MAX_TXN_OPS,
    Entry,
    Etcd,
    delete_op,
    mod_revision_is,
    nested_succeeded,
    put_op,
    txn_op,
    value_is,
)
from streamtrain.schemas import EtcdKeys, PartitionCursor, SchemaError, TaskRecord

# Trainers pick at random among the first todo tasks in claim order they last listed, so that
# many trainers claiming at once rarely race for one key, while old tasks still go first. A
# listing holds more than one master transaction's tasks, so its oldest revision is whole.
_SPREAD = 32
_CANDIDATES = MAX_TXN_OPS + 8
_MAX_TRIES = 16


@dataclass(frozen=True)
class ClaimedTask:
    """A task this trainer holds; `value` is what it wrote to the pending key."""

    record: TaskRecord
    value: bytes

    @property
    def task_id(self) -> str:
        return self.record.task_id


class TaskClient:
    def __init__(self, etcd: Etcd, job: str, trainer_id: str, timeout_s: float,
                 max_attempts: int) -> None:
        self._etcd = etcd
        self.keys = EtcdKeys(job)
        self.trainer_id = trainer_id
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self._candidates: list[Entry] = []
        self._rng = random.Random()

    @classmethod
    def for_job(cls, etcd: Etcd, job: str, trainer_id: str) -> TaskClient:
        """A client with the timeout and attempt limit of the job's stored config."""
        from streamtrain.jobstate.membership import read_job_config

        config = read_job_config(etcd, job)
        return cls(etcd, job, trainer_id, config.tasks.timeout_s, config.tasks.max_attempts)

    def claim(self, push_every: int = 1) -> ClaimedTask | None:
        """The next task, or None when todo is empty. A task claimed for the first time keeps
        `push_every` mini-batches a push for good; a task claimed before keeps its own."""
        for _ in range(_MAX_TRIES):
            candidate = self._candidate(push_every)
            if candidate is None:
                return None
            entry, held = candidate
            ok, _ = self._etcd.txn([mod_revision_is(entry.key, entry.mod_revision)],
                                   self._claim_ops(entry, held))
            if ok:
                return held
            self._candidates = []  # another trainer was faster: what we listed is stale
        return None

    def _candidate(self, push_every: int) -> tuple[Entry, ClaimedTask] | None:
        """A todo task this trainer may try to claim, with the record it would write: the retry
        lane's first in input order, else one of the rest. The lane is read at every claim: a
        task given back is older input than the tasks still to do, and claimed by creation
        order it would be trained after them, the last input the model saw on a bounded job:
        on a drifting stream, the wrong one to end on."""
        listed = self._etcd.range(self.keys.retry_prefix, limit=_CANDIDATES)
        retried = [listed[i] for i in queue.input_order([self.keys.task_id_of(e.key) for e in listed])]
        # In input order, not at random: the lane is short, and the loser of a race for its first
        # task reads it again.
        for entry in retried:
            if (held := self._held(entry, push_every)) is not None:
                return entry, held
        while True:
            if not self._candidates:
                listed = self._etcd.range(self.keys.tasks("todo"), limit=_CANDIDATES, oldest_first=True)
                if not listed:
                    return None
                order = queue.claim_order([(e.create_revision, self.keys.task_id_of(e.key)) for e in listed],
                                         truncated=len(listed) == _CANDIDATES)
                self._candidates = [listed[i] for i in order]
            # Random among the first few: trainers claiming at once rarely race for one key.
            entry = self._candidates.pop(self._rng.randrange(min(_SPREAD, len(self._candidates))))
            if (held := self._held(entry, push_every)) is not None:
                return entry, held

    def _held(self, entry: Entry, push_every: int) -> ClaimedTask | None:
        """The record a claim of `entry` writes; None if it is unreadable (skipped; no process
        can train it, and a rollback's record leaves it out and logs it)."""
        try:
            task = TaskRecord.from_json(entry.value)
        except SchemaError:
            return None
        held = replace(task, trainer_id=self.trainer_id, claim=task.claim + 1,
                       deadline=time.time() + self.timeout_s, push_every=task.push_every or push_every)
        return ClaimedTask(held, held.to_json())

    def _claim_ops(self, entry: Entry, held: ClaimedTask) -> list:
        return [delete_op(entry.key), put_op(self.keys.task("pending", held.task_id), held.value)]

    def requeue_predecessors(self) -> list[str]:
        """Put back the tasks still pending under this trainer's id, as attempts that ended:
        called before the first claim, they are a predecessor's (a process of the same id that
        died holding them), whose membership key this one took over, so neither its lease nor
        anything but the task timeout would free them. Returns their ids."""
        requeued = []
        for entry in self._etcd.range(self.keys.tasks("pending")):
            try:
                task = TaskRecord.from_json(entry.value)
            except SchemaError:
                continue  # as a claim skips it
            if task.trainer_id != self.trainer_id:
                continue
            back = queue.requeue_lost(task, f"trainer {self.trainer_id} restarted")
            ok, _ = self._etcd.txn([mod_revision_is(entry.key, entry.mod_revision)],
                                   [delete_op(entry.key),
                                    put_op(self.keys.task_back("todo", task.task_id), back.to_json())])
            if ok:
                requeued.append(task.task_id)
        return requeued

    def heartbeat(self, task: ClaimedTask) -> ClaimedTask:
        """Restart the task's timeout. Raises TaskLostError if it is no longer ours."""
        held = replace(task.record, deadline=time.time() + self.timeout_s)
        value = held.to_json()
        key = self.keys.task("pending", task.task_id)
        self._require(self._etcd.txn([value_is(key, task.value)], [put_op(key, value)])[0], task)
        return ClaimedTask(held, value)

    def complete(self, task: ClaimedTask, claim_next: bool = False, push_every: int = 1) -> ClaimedTask | None:
        """pending → done. With `claim_next`, the next task is claimed in the same round trip
        (a nested transaction that runs only if the completion holds) and returned, so a busy
        trainer pays one etcd transaction per task instead of two; `push_every` as for `claim`.

        Raises:
            TaskLostError: the task is no longer held by this attempt; nothing was written.
        """
        done = replace(task.record, deadline=None)
        key = self.keys.task("pending", task.task_id)
        ops = [delete_op(key), put_op(self.keys.task("done", task.task_id), done.to_json())]
        candidate = self._candidate(push_every) if claim_next else None
        if candidate is not None:
            entry, held = candidate
            ops.append(txn_op([mod_revision_is(entry.key, entry.mod_revision)],
                              self._claim_ops(entry, held)))
        ok, responses = self._etcd.txn([value_is(key, task.value)], ops)
        self._require(ok, task)
        if candidate is not None:
            if nested_succeeded(responses[-1]):
                return candidate[1]
            self._candidates = []
        return self.claim(push_every) if claim_next else None

    def completed(self, task: ClaimedTask) -> bool:
        """Whether the task is done by this attempt, as far as etcd can tell: a `complete`
        whose reply was lost (etcd's leader died under it) may have applied. Its done key, or
        once the master has folded that into the partition's cursor (within a poll, at the
        head of a partition), the cursor past it and no failed key; a task another attempt
        completed and the master folded counts too."""
        record = task.record
        done = self._etcd.get(self.keys.task("done", task.task_id))
        if done is not None:
            return done.value == replace(record, deadline=None).to_json()
        if self._etcd.get(self.keys.task("failed", task.task_id)) is not None:
            return False
        cursor = self._etcd.get(self.keys.cursor(record.topic, record.partition))
        return cursor is not None and queue.folded(PartitionCursor.from_json(cursor.value), record)

    def fail(self, task: ClaimedTask, reason: str) -> str:
        """This attempt failed: back to todo with attempt + 1, or failed after the last
        attempt. Returns the state it went to. Raises TaskLostError if it is no longer ours."""
        state, retried = queue.retry_or_fail(task.record, self.max_attempts,
                                            f"{reason} (trainer {self.trainer_id})")
        key = self.keys.task("pending", task.task_id)
        ok, _ = self._etcd.txn(
            [value_is(key, task.value)],
            [delete_op(key), put_op(self.keys.task_back(state, task.task_id), retried.to_json())],
        )
        self._require(ok, task)
        return state

    def release(self, task: ClaimedTask, behind: bool = False) -> None:
        """Give the task back untouched (shutting down, a service away): same attempt, no
        failure counted. To the retry lane, first in line; `behind`: behind every task
        waiting instead, for a task only its own partition may hold up."""
        back = replace(task.record, trainer_id=None, deadline=None)
        key = self.keys.task("pending", task.task_id)
        to = self.keys.task("todo", task.task_id) if behind else self.keys.task_back("todo", task.task_id)
        ok, _ = self._etcd.txn([value_is(key, task.value)], [delete_op(key), put_op(to, back.to_json())])
        self._require(ok, task)

    @staticmethod
    def _require(ok: bool, task: ClaimedTask) -> None:
        if not ok:
            raise TaskLostError(f"task {task.task_id} is no longer held by this attempt "
                                "(it timed out and was requeued, or another attempt finished it)")
