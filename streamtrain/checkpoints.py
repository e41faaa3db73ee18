"""`streamtrain checkpoint`: a job-wide checkpoint on request.

1. A new id (`pserver.checkpoint.new_checkpoint_id()`) goes to `control/checkpoint` as
   `{"id": id}`; every pserver shard polls that key (once a second) and, seeing an id it has not
   taken, publishes, checkpoints under that id and registers `checkpoints/<id>/<index>`.
2. Once every shard `0 .. ps_desired-1` has registered, `checkpoints/latest` becomes
   `{"id": id, "shards": n, "at": unix time}`: the checkpoint a rollback would name.
3. Either way the request is withdrawn afterwards (`control/checkpoint` deleted if it still holds
   this id), so a shard that starts later, or that prunes the checkpoint, does not take it again.

A shard that does not answer within `wait_s` makes the whole checkpoint incomplete: `latest`
is left as it was and `CheckpointTimeout` names the shards (and whether each one is even a live
member of the job).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from master.etcd import Etcd, delete_op, value_is
from schemas import EtcdKeys


class CheckpointError(RuntimeError):
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


def request_checkpoint(etcd: Etcd, job: str, wait_s: float = 60.0, poll_s: float = 0.2) -> Checkpoint:
    """Ask every shard of `job` for a checkpoint and record it as the latest once all have it.

    Raises:
        CheckpointError: the job has no shards.
        CheckpointTimeout: some shards did not register within `wait_s`.
    """
    from master.membership import members
    from pserver.checkpoint import new_checkpoint_id

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
        etcd.put(keys.checkpoints_latest, json.dumps({"id": checkpoint_id, "shards": n, "at": at}).encode())
        return Checkpoint(checkpoint_id, n, at, time.monotonic() - started)
    finally:
        etcd.txn([value_is(keys.control("checkpoint"), request)], [delete_op(keys.control("checkpoint"))])
