"""Job-wide checkpoints: a cut of the whole job that `rollback` can return to, taken while the
trainers go on training.

A cut is the job's side, then the shards' side, in that order, and only the master takes one
(`streamtrain checkpoint` asks it to, with `ask`):

1. `record`: the cursors, task queues and job state, read at one etcd revision, written to
   `checkpoints/<id>/job`. Tasks then in hand are recorded as to do (as a release puts them).
2. `request`: the id goes to `control/checkpoint`. Each shard, once it sees it, reads its
   gradient topic's log end, applies everything up to it and checkpoints under that id
   (`checkpoints/<id>/<i>`).
3. `complete`, once every shard has: `checkpoints/latest` names the id.

From 1 until the request is completed or withdrawn the master slices no task. A task sliced
after the record could be trained, wholly or in part, into the shards' checkpoints while the
record does not know it: after a rollback its range would be sliced again, perhaps under the
same id and with other bounds (a cut at the stream's head), and the ledgers would drop or
double examples. Tasks already sliced go on being trained meanwhile.

Why that is consistent without a pause: a trainer completes a task only once every delta of
it is acknowledged, so every task done in the record has all its deltas below the log ends the
shards read after it, and is wholly in their checkpoints. The checkpoints may hold more: some
groups of tasks in hand or done after the record. A rollback puts those tasks back to do; when
they are trained again, each shard's dedup ledger (saved with its checkpoint) drops the groups
it already holds, so every example is applied once per shard, as after any redone task. A
shard may even have folded such a task into its ledger's watermarks; it folds only tasks whose
deltas it has all applied, so dropping the redo is again right.

The master takes one every `pservers.checkpoint_every_s` (master/checkpoint_schedule.py);
`streamtrain checkpoint` takes one on demand.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from streamtrain.jobstate import queue
from streamtrain.jobstate.etcd import (
    MAX_TXN_OPS,
    Compare,
    Entry,
    Etcd,
    Op,
    absent,
    delete_op,
    delete_prefix_op,
    put_op,
    value_is,
)
from streamtrain.schemas import (
    CheckpointRequest,
    EtcdKeys,
    JobRecord,
    KeptDocument,
    LatestCheckpoint,
    SchemaError,
    TaskRecord,
)
from streamtrain.schemas.keys import TaskState

log = logging.getLogger(__name__)

WriteIf = Callable[[list[Compare], list[Op]], bool]
"""Writes `ops` in one transaction if every `compare` holds; returns whether it did. The
master's is its lock's `write_if` (master/leader.py), fenced: it raises `NotLeaderError` once
another master leads, so a master that lost the lock names no checkpoint and prunes no
record. Others' is `plain`."""


def plain(etcd: Etcd) -> WriteIf:
    """A transaction of `etcd`'s, unfenced: for the command that asks for a checkpoint."""
    return lambda compare, ops: etcd.txn(compare, ops)[0]


def new_checkpoint_id() -> str:
    """Ids sort by time: a restarted shard loads the newest."""
    return f"{time.time_ns():020d}"


def record(etcd: Etcd, job: str, checkpoint_id: str, write_if: WriteIf) -> None:
    """Step 1: the job's side of checkpoint `checkpoint_id`, as of now."""
    keys = EtcdKeys(job)
    write_if([], [put_op(keys.checkpoint_job(checkpoint_id), job_record(etcd, keys))])


def job_record(etcd: Etcd, keys: EtcdKeys) -> bytes:
    cursors, todo, pending, done, failed, state = etcd.ranges([
        keys.cursors_prefix, keys.tasks("todo"), keys.tasks("pending"), keys.tasks("done"),
        keys.tasks("failed"), keys.state])

    def field(kept: KeptDocument, name: str) -> Any:
        """The document's field, None if absent: the key's own checks refuse what does not fit."""
        return kept.doc.get(name)

    def task_key(state: TaskState) -> Callable[[KeptDocument], str]:
        return lambda kept: keys.task(state, field(kept, "task_id"))

    # Both lanes of todo are recorded as to do: a restore writes every task to do in input order.
    retried = [e for e in todo if e.key.startswith(keys.retry_prefix)]
    fresh = [e for e in todo if not e.key.startswith(keys.retry_prefix)]
    kept_state = _kept(state, lambda kept: keys.state)
    return JobRecord(
        cursors=_kept(cursors, lambda kept: keys.cursor(field(kept, "topic"), field(kept, "partition"))),
        todo=_kept(retried, lambda kept: keys.task_back("todo", field(kept, "task_id")))
        + _kept(fresh, task_key("todo")) + _kept(pending, task_key("pending"), _released),
        done=_kept(done, task_key("done")), failed=_kept(failed, task_key("failed")),
        state=kept_state[0] if kept_state else None).to_json()


def restore_batches(keys: EtcdKeys, record: bytes) -> list[list[Op]]:
    """The writes that put the cursors, task queues and job state back as `record` (a
    `JobRecord`) has them, in transactions of at most MAX_TXN_OPS: clear, then cursors, done,
    failed and state, then the tasks to do in rounds, as the slicer writes them, so that claims
    keep to the order of the input.

    Raises:
        SchemaError: `record` is not a job record of this version.
    """
    saved = JobRecord.from_json(record)
    # JobRecord has checked that each document names its key (topic and partition, task_id).
    ops = [put_op(keys.cursor(c.doc["topic"], c.doc["partition"]), c.to_json()) for c in saved.cursors]
    readable: list[TaskRecord] = []
    for t in saved.todo:
        try:
            readable.append(TaskRecord.from_json(t.to_json()))
        except SchemaError:  # restored as it was saved, and logged wherever it is read
            ops.append(put_op(keys.task("todo", t.doc["task_id"]), t.to_json()))
    ops += [put_op(keys.task("done", t.doc["task_id"]), t.to_json()) for t in saved.done]
    ops += [put_op(keys.task("failed", t.doc["task_id"]), t.to_json()) for t in saved.failed]
    if saved.state is not None:
        ops.append(put_op(keys.state, saved.state.to_json()))
    todo = [put_op(keys.task("todo", t.task_id), t.to_json()) for round_ in queue.rounds_of(readable) for t in round_]
    clear: list[Op] = [delete_prefix_op(keys.tasks_prefix), delete_prefix_op(keys.cursors_prefix),
                       delete_op(keys.state)]
    return [clear] + [ops[i:i + MAX_TXN_OPS - 1] for i in range(0, len(ops), MAX_TXN_OPS - 1)] \
        + [todo[i:i + MAX_TXN_OPS] for i in range(0, len(todo), MAX_TXN_OPS)]


def _kept(entries: list[Entry], key_of: Callable[[KeptDocument], str],
          kept_as: Callable[[bytes], KeptDocument] = KeptDocument.from_json) -> tuple[KeptDocument, ...]:
    """The documents of `entries` that a rollback can write back where they were: JSON objects
    that name the key they were read from. The rest are left out, and logged: no process can use
    such a value (an unreadable task is skipped, and logged, wherever it is read), and a record
    that held one could not be restored at all (it would end the master here, or a rollback
    midway)."""
    kept = []
    for entry in entries:
        try:
            doc = kept_as(entry.value)
            if key_of(doc) == entry.key:
                kept.append(doc)
                continue
            why = f"it names the key {key_of(doc)!r}"
        except SchemaError as exc:
            why = str(exc)
        log.error("checkpoint record leaves out %s: %s", entry.key, why)
    return tuple(kept)


def _released(value: bytes) -> KeptDocument:
    """A task in hand, as `TaskClient.release` would give it back: same attempt, no holder."""
    try:
        task = TaskRecord.from_json(value)
    except SchemaError:
        return KeptDocument.from_json(value)  # restored as it was; the master moves it out of the way there
    return KeptDocument.from_json(replace(task, trainer_id=None, deadline=None).to_json())


def ask(etcd: Etcd, job: str) -> bytes | None:
    """Ask the master for a checkpoint: `control/checkpoint` without an id, unless a request
    is there already (then None: try again once it is gone). Returns the value, for `request`
    and `withdraw`."""
    value = CheckpointRequest(ask=uuid.uuid4().hex, at=time.time()).to_json()
    key = EtcdKeys(job).control("checkpoint")
    ok, _ = etcd.txn([absent(key)], [put_op(key, value)])
    return value if ok else None


def request(job: str, checkpoint_id: str, asked: bytes | None, write_if: WriteIf) -> bytes | None:
    """Step 2: ask every shard for checkpoint `checkpoint_id`, in place of the ask `asked` (its
    nonce is kept, so the asker can follow). Returns the request's value, for `withdraw`; None
    if `asked` was withdrawn meanwhile."""
    key = EtcdKeys(job).control("checkpoint")
    nonce = CheckpointRequest.from_json(asked).ask if asked is not None else None
    value = CheckpointRequest(checkpoint_id, nonce, time.time()).to_json()
    ok = write_if([value_is(key, asked) if asked is not None else absent(key)], [put_op(key, value)])
    return value if ok else None


def missing_shards(etcd: Etcd, job: str, checkpoint_id: str, shards: int) -> list[int]:
    keys = EtcdKeys(job)
    have = {e.key for e in etcd.range(keys.checkpoint(checkpoint_id), keys_only=True)}
    return [i for i in range(shards) if keys.checkpoint_shard(checkpoint_id, i) not in have]


def complete(job: str, request: bytes, shards: int, write_if: WriteIf) -> float:
    """Step 3: the checkpoint `request` asked the shards for is the newest rollback target (an
    asker knows it by its ask). Returns when it was named so."""
    asked, at = CheckpointRequest.from_json(request), time.time()
    if asked.id is None:  # an ask, not a request to the shards (LatestCheckpoint would refuse None too)
        raise SchemaError("LatestCheckpoint", "id", "the request names no checkpoint (an ask)")
    named = LatestCheckpoint(asked.id, shards, at, asked.ask).to_json()
    write_if([], [put_op(EtcdKeys(job).checkpoints_latest, named)])
    return at


def withdraw(job: str, value: bytes, write_if: WriteIf) -> None:
    """Take the request back, unless another has replaced it: a shard started later must not
    take it."""
    key = EtcdKeys(job).control("checkpoint")
    write_if([value_is(key, value)], [delete_op(key)])


def latest(etcd: Etcd, job: str) -> str | None:
    entry = etcd.get(EtcdKeys(job).checkpoints_latest)
    try:
        return LatestCheckpoint.from_json(entry.value).id if entry is not None else None
    except SchemaError:
        return None


def prune_records(etcd: Etcd, job: str, write_if: WriteIf) -> list[str]:
    """Delete the job records of checkpoints older than the latest that no shard keeps any more
    (shards prune their own); returns their ids."""
    newest = latest(etcd, job)
    if newest is None:
        return []
    keys = EtcdKeys(job)
    parts: dict[str, set[str]] = {}
    for entry in etcd.range(keys.checkpoints_prefix, keys_only=True):
        path = keys.checkpoint_path(entry.key)
        if len(path) >= 2:
            parts.setdefault(path[0], set()).add(path[1])
    gone = [cid for cid, names in parts.items() if cid < newest and names <= {"job", "rolled"}]
    ops = [delete_prefix_op(keys.checkpoint(cid)) for cid in gone]
    for i in range(0, len(ops), MAX_TXN_OPS):
        write_if([], ops[i:i + MAX_TXN_OPS])
    return sorted(gone)
