"""`streamtrain checkpoint` and `streamtrain rollback --to`: job-wide, quiescent checkpoints.

A checkpoint a rollback can return to must say exactly which examples its parameters hold.
So it is taken at a quiet moment:

1. `control/pause`: trainers finish the task in hand and claim no other. Once no task is
   pending, every gradient of every finished task is committed.
2. A new id goes to `control/checkpoint`; each shard consumes its gradient topic up to the
   log end (deltas are produced without transactions), checkpoints under that id and registers `checkpoints/<id>/<index>`.
3. The job's side, `checkpoints/<id>/job`: the cursors, task queues and job state, read at one
   etcd revision. Then `checkpoints/latest`, and the pause is lifted.

Rollback to such a checkpoint pauses the same way, then `control/rollback` goes through two
phases: the master puts cursors and queues back as recorded ("master"), then every shard
loads its checkpoint, skips the gradients committed since, republishes, retires its newer
checkpoints and checkpoints the rolled-back state ("shards", each then acknowledging at
`checkpoints/<id>/rolled/<index>`), so that a restart stays on the rolled-back timeline.
The tasks trained after the checkpoint are in todo again, and the dedup ledgers in the
shards' checkpoints do not know them, so they are trained and applied once more: exactly
what came after the checkpoint is replayed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from streamtrain.jobstate.etcd import Etcd, delete_op, value_is
from streamtrain.schemas import EtcdKeys, StreamtrainError


class CheckpointError(StreamtrainError, RuntimeError):
    """The checkpoint cannot be requested (the job has no shards in etcd)."""


class CheckpointTimeout(CheckpointError):
    def __init__(self, job: str, checkpoint_id: str, missing: list[int], down: list[int], wait_s: float) -> None:
        why = f"; not running (no ps/<i> lease): {down}" if down else ""
        super().__init__(f"job {job!r}: checkpoint {checkpoint_id}: pserver shard(s) {missing} did not "
                         f"register within {wait_s:g} s{why}")
        self.checkpoint_id = checkpoint_id
        self.missing = missing
        self.down = down


@dataclass(frozen=True)
class Checkpoint:
    id: str
    shards: int
    at: float
    took_s: float

    def as_dict(self) -> dict:
        return {"id": self.id, "shards": self.shards, "at": self.at, "took_s": round(self.took_s, 3)}


def shard_count(etcd: Etcd, job: str) -> int:
    entry = etcd.get(EtcdKeys(job).ps_desired)
    if entry is None:
        raise CheckpointError(f"job {job!r} has no ps_desired in etcd: start its master first")
    return int(entry.value)


class Paused:
    """`control/pause` for the duration, then no task pending; lifted on exit unless it was
    already set by someone else."""

    def __init__(self, etcd: Etcd, job: str, wait_s: float, why: str) -> None:
        self.etcd, self.keys, self.wait_s, self.why = etcd, EtcdKeys(job), wait_s, why
        self.job = job
        self.resume = True

    def __enter__(self) -> Paused:
        key = self.keys.control("pause")
        self._ours = self.etcd.get(key) is None
        if self._ours:
            self.etcd.put(key, json.dumps({"by": self.why, "at": time.time()}).encode())
        deadline = time.monotonic() + self.wait_s
        while self.etcd.count(self.keys.tasks("pending")):
            if time.monotonic() >= deadline:
                self.__exit__(None, None, None)
                raise CheckpointError(f"job {self.job!r}: tasks still pending {self.wait_s:g} s after pausing")
            time.sleep(0.2)
        return self

    def __exit__(self, *_: object) -> None:
        if self._ours and self.resume:
            self.etcd.delete_prefix(self.keys.control("pause"))


def request_checkpoint(etcd: Etcd, job: str, wait_s: float = 60.0, poll_s: float = 0.2,
                       quiesce: bool = True) -> Checkpoint:
    """Ask every shard of `job` for a checkpoint and record it as the latest once all have it.
    With `quiesce` (the default) trainers are paused around it and the job's cursors and queues
    are recorded, so `rollback` can return to it.

    Raises:
        CheckpointError: the job has no shards, or tasks stayed pending.
        CheckpointTimeout: some shards did not register within `wait_s`.
    """
    if not quiesce:
        return _request(etcd, job, wait_s, poll_s)
    with Paused(etcd, job, wait_s, "checkpoint"):
        return _request(etcd, job, wait_s, poll_s, record_job=True)


def _request(etcd: Etcd, job: str, wait_s: float, poll_s: float, record_job: bool = False) -> Checkpoint:
    from streamtrain.jobstate.membership import members
    from streamtrain.pserver.checkpoint import new_checkpoint_id

    keys = EtcdKeys(job)
    n = shard_count(etcd, job)
    if n < 1:
        raise CheckpointError(f"job {job!r} has no pserver shards (ps_desired = {n})")
    started = time.monotonic()
    checkpoint_id = new_checkpoint_id()
    request = json.dumps({"id": checkpoint_id}).encode()
    etcd.put(keys.control("checkpoint"), request)
    try:
        deadline = started + wait_s
        missing = list(range(n))
        while True:
            missing = [i for i in missing if etcd.get(keys.checkpoint_shard(checkpoint_id, i)) is None]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
        if missing:
            live = members(etcd, job).pservers
            raise CheckpointTimeout(job, checkpoint_id, missing, [i for i in missing if i not in live], wait_s)
        at = time.time()
        if record_job:
            etcd.put(keys.checkpoint_job(checkpoint_id), _job_side(etcd, keys))
        etcd.put(keys.checkpoints_latest, json.dumps({"id": checkpoint_id, "shards": n, "at": at}).encode())
        return Checkpoint(checkpoint_id, n, at, time.monotonic() - started)
    finally:
        etcd.txn([value_is(keys.control("checkpoint"), request)], [delete_op(keys.control("checkpoint"))])


def _job_side(etcd: Etcd, keys: EtcdKeys) -> bytes:
    cursors, todo, done, failed, state = etcd.ranges([
        keys.cursors_prefix, keys.tasks("todo"), keys.tasks("done"), keys.tasks("failed"), keys.state])
    return json.dumps({
        "v": 1, "cursors": [json.loads(e.value) for e in cursors],
        "todo": [json.loads(e.value) for e in todo], "done": [json.loads(e.value) for e in done],
        "failed": [json.loads(e.value) for e in failed],
        "state": json.loads(state[0].value) if state else None,
    }).encode()


class RollbackError(CheckpointError):
    """The rollback cannot start (unknown or incomplete checkpoint) or did not finish in time."""


def rollback(etcd: Etcd, job: str, checkpoint_id: str, wait_s: float = 120.0, resume: bool = True) -> None:
    """Return the whole job to a quiescent checkpoint (see the module docstring). With
    `resume=False` trainers stay paused afterwards (to inspect the parameters first)."""
    keys = EtcdKeys(job)
    n = shard_count(etcd, job)
    if etcd.get(keys.checkpoint_job(checkpoint_id)) is None:
        raise RollbackError(f"job {job!r}: {checkpoint_id} is not a quiescent checkpoint of this job "
                            "(no checkpoints/<id>/job; take one with `streamtrain checkpoint`)")
    missing = [i for i in range(n) if etcd.get(keys.checkpoint_shard(checkpoint_id, i)) is None]
    if missing:
        raise RollbackError(f"job {job!r}: shard(s) {missing} no longer keep checkpoint {checkpoint_id}")
    with Paused(etcd, job, wait_s, "rollback") as paused:
        paused.resume = resume
        control = keys.control("rollback")
        # Acks left by an earlier rollback to the same checkpoint that did not clean up would
        # make shards skip this one (a shard rolling back twice while paused ends the same).
        etcd.delete_prefix(keys.checkpoint(checkpoint_id) + "rolled/")
        etcd.put(control, json.dumps({"to": checkpoint_id, "phase": "master", "at": time.time()}).encode())
        deadline = time.monotonic() + wait_s
        while True:
            entry = etcd.get(control)
            phase = json.loads(entry.value).get("phase") if entry else None
            acked = [i for i in range(n) if etcd.get(keys.checkpoint_rolled_back(checkpoint_id, i))]
            if phase == "shards" and len(acked) == n:
                break
            if time.monotonic() >= deadline:
                # Half done is worse than late: the request and the pause stay, and the master and
                # shards finish it when they are back (running rollback again also resumes it).
                paused.resume = False
                raise RollbackError(f"job {job!r}: rollback to {checkpoint_id} not finished after {wait_s:g} s "
                                    f"(phase {phase!r}, shards done: {acked} of {n}); trainers stay paused "
                                    "until it finishes")
            time.sleep(0.2)
        etcd.delete_prefix(control)
        # The shards retired every checkpoint after the target: it is the newest rollback target.
        etcd.put(keys.checkpoints_latest, json.dumps({"id": checkpoint_id, "shards": n, "at": time.time()}).encode())
        etcd.delete_prefix(keys.checkpoint(checkpoint_id) + "rolled/")
