"""`streamtrain checkpoint` and `streamtrain rollback --to`: job-wide checkpoints.

`request_checkpoint` asks the job's master for one, taken while the trainers go on
(jobstate/job_checkpoints.py: the master records the job's cursors and queues and slices nothing
until every shard has checkpointed at its gradient topic's log end, which holds every delta of
every task the record calls done). The master takes one the same way every
`pservers.checkpoint_every_s`.

Rollback pauses the trainers (`control/pause`: each finishes the task in hand and claims no
other) until no task is pending, then `control/rollback` goes through two phases: the master
puts cursors and queues back as recorded ("master"), then every shard loads its checkpoint,
skips the gradients committed since, republishes, retires its newer checkpoints and
checkpoints the rolled-back state ("shards", each then acknowledging at
`checkpoints/<id>/rolled/<index>`), so that a restart stays on the rolled-back timeline.
The tasks trained after the checkpoint are to do again; when they are trained once more, the
groups a shard's checkpoint already holds are dropped by its dedup ledger and the rest
applied: exactly what came after the checkpoint is replayed, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamtrain.jobstate import job_checkpoints as cut
from streamtrain.jobstate.etcd import Etcd
from streamtrain.schemas import (
    ROLLBACK_PAUSE,
    CheckpointRequest,
    EtcdKeys,
    LatestCheckpoint,
    PauseRequest,
    RollbackRequest,
    StreamtrainError,
)


class CheckpointError(StreamtrainError, RuntimeError):
    """The checkpoint cannot be requested (the job has no shards in etcd)."""


class CheckpointTimeout(CheckpointError):
    def __init__(self, job: str, why: str, wait_s: float, checkpoint_id: str | None = None,
                 missing: list[int] | None = None, down: list[int] | None = None) -> None:
        super().__init__(f"job {job!r}: no checkpoint within {wait_s:g} s: {why}")
        self.checkpoint_id = checkpoint_id
        self.missing = missing or []
        self.down = down or []


@dataclass(frozen=True)
class Checkpoint:
    id: str
    shards: int
    at: float
    took_s: float

    def as_dict(self) -> dict:
        return {"id": self.id, "shards": self.shards, "at": self.at, "took_s": round(self.took_s, 3)}


def shard_count(etcd: Etcd, job: str) -> int:
    """The job's shard count as its master wrote it (`ps_desired`).

    Raises:
        CheckpointError: no master wrote it yet.
        SchemaError: it holds no shard count.
    """
    keys = EtcdKeys(job)
    entry = etcd.get(keys.ps_desired)
    if entry is None:
        raise CheckpointError(f"job {job!r} has no ps_desired in etcd: start its master first")
    return keys.ps_desired_of(entry.value)


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
            self.etcd.put(key, PauseRequest(self.why, time.time()).to_json())
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


def request_checkpoint(etcd: Etcd, job: str, wait_s: float = 60.0, poll_s: float = 0.2) -> Checkpoint:
    """Ask the job's master for a job-wide checkpoint (jobstate/job_checkpoints.py), taken while
    the trainers go on, and wait until it is named the latest: `rollback` can return to it.

    Raises:
        CheckpointError: the job has no shards, or the master withdrew the request (a rollback
            began, or a shard did not take it in time).
        CheckpointTimeout: not done within `wait_s` (no master, or shards missing).
    """
    from streamtrain.jobstate.membership import members

    n = shard_count(etcd, job)
    if n < 1:
        raise CheckpointError(f"job {job!r} has no pserver shards (ps_desired = {n})")
    key, started = EtcdKeys(job).control("checkpoint"), time.monotonic()
    deadline = started + wait_s
    while (asked := cut.ask(etcd, job)) is None:  # one is under way: ours comes after it
        if time.monotonic() >= deadline:
            raise CheckpointTimeout(job, "another checkpoint request stayed outstanding", wait_s)
        time.sleep(poll_s)
    current: bytes | None
    nonce, current = CheckpointRequest.from_json(asked).ask, asked
    checkpoint_id: str | None = None
    try:
        while True:
            named, entry = etcd.ranges([EtcdKeys(job).checkpoints_latest, key])
            if named and (doc := LatestCheckpoint.from_json(named[0].value)).ask == nonce:
                current = None  # the master withdrew it when it named it
                return Checkpoint(doc.id, n, doc.at, time.monotonic() - started)
            current = entry[0].value if entry else None
            request = CheckpointRequest.from_json(current) if current is not None else None
            if request is None or request.ask != nonce:
                raise CheckpointError(f"job {job!r}: the master withdrew the checkpoint request (a "
                                      "rollback began, or a shard did not take it in time; "
                                      "see the master's log)")
            checkpoint_id = request.id
            if time.monotonic() >= deadline:
                if checkpoint_id is None:
                    raise CheckpointTimeout(job, "the master did not take the request (is it running?)", wait_s)
                missing = cut.missing_shards(etcd, job, checkpoint_id, n)
                down = [i for i in missing if i not in members(etcd, job).pservers]
                why = f"pserver shard(s) {missing} did not register checkpoint {checkpoint_id}"
                raise CheckpointTimeout(job, why + (f"; not running (no ps/<i> lease): {down}" if down else ""),
                                        wait_s, checkpoint_id, missing, down)
            time.sleep(poll_s)
    finally:
        if current is not None:
            cut.withdraw(job, current, cut.plain(etcd))


class RollbackError(CheckpointError):
    """The rollback cannot start (unknown or incomplete checkpoint) or did not finish in time."""


def rollback(etcd: Etcd, job: str, checkpoint_id: str, wait_s: float = 120.0, resume: bool = True) -> None:
    """Return the whole job to a job-wide checkpoint (see the module docstring). With
    `resume=False` trainers stay paused afterwards (to inspect the parameters first)."""
    keys = EtcdKeys(job)
    n = shard_count(etcd, job)
    if etcd.get(keys.checkpoint_job(checkpoint_id)) is None:
        raise RollbackError(f"job {job!r}: {checkpoint_id} is not a job-wide checkpoint of this job "
                            "(no checkpoints/<id>/job; take one with `streamtrain checkpoint`)")
    missing = [i for i in range(n) if etcd.get(keys.checkpoint_shard(checkpoint_id, i)) is None]
    if missing:
        raise RollbackError(f"job {job!r}: shard(s) {missing} no longer keep checkpoint {checkpoint_id}")
    with Paused(etcd, job, wait_s, ROLLBACK_PAUSE) as paused:
        paused.resume = resume
        control = keys.control("rollback")
        # A checkpoint requested before the pause is of the timeline being abandoned: a shard
        # must not take it after rolling back (the master withdraws its own too).
        etcd.delete_prefix(keys.control("checkpoint"))
        # Acks left by an earlier rollback to the same checkpoint that did not clean up would
        # make shards skip this one (a shard rolling back twice while paused ends the same).
        etcd.delete_prefix(keys.checkpoint(checkpoint_id) + "rolled/")
        etcd.put(control, RollbackRequest(checkpoint_id, "master", time.time()).to_json())
        deadline = time.monotonic() + wait_s
        while True:
            entry = etcd.get(control)
            phase = RollbackRequest.from_json(entry.value).phase if entry else None
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
        etcd.put(keys.checkpoints_latest, LatestCheckpoint(checkpoint_id, n, time.time()).to_json())
        etcd.delete_prefix(keys.checkpoint(checkpoint_id) + "rolled/")
