"""The master's job-wide checkpoints: one every `pservers.checkpoint_every_s`, and one whenever
`streamtrain checkpoint` asks, taken while the trainers train (jobstate/job_checkpoints.py), named
the latest once every shard has it.
Each is a rollback target; the shards keep the newest `keep_checkpoints` and never prune the
latest, and the job records of the ones they pruned go here.

The decision is `next_move`, a pure function; `PeriodicCheckpoints` does the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from streamtrain.jobstate import job_checkpoints as cut
from streamtrain.jobstate.etcd import Etcd
from streamtrain.schemas import CheckpointRequest, SchemaError

log = logging.getLogger(__name__)

# While a checkpoint is outstanding the master slices nothing (jobstate/job_checkpoints.py); one
# that some shard cannot take (it is restarting, or down) is withdrawn after this long, so that
# the trainers do not run dry, and tried afresh at the next turn.
PATIENCE_S = 15.0

Move = Literal["begin", "check", "abandon", "wait"]


def next_move(now: float, *, every_s: float, last_began: float, outstanding_since: float | None,
              asked: bool, busy: bool) -> Move:
    """What the master does about checkpoints at `now`.

    `outstanding_since`: when the checkpoint in progress was requested (None: none is);
    `asked`: `streamtrain checkpoint` asks for one; `busy`: a rollback is under way (its pause or its request):
    none begins meanwhile, and the one in progress, or asked for, is withdrawn (its record is of
    the timeline a rollback abandons; a shard that took it after rolling back would pair that
    record with the rolled-back parameters)."""
    if outstanding_since is not None:
        return "abandon" if busy or now - outstanding_since >= PATIENCE_S else "check"
    if asked:
        return "abandon" if busy else "begin"
    if busy or now - last_began < every_s:
        return "wait"
    return "begin"


@dataclass
class _Outstanding:
    checkpoint_id: str | None  # None: asked for, not yet begun
    request: bytes
    since: float


class PeriodicCheckpoints:
    def __init__(self, etcd: Etcd, job: str, every_s: float, shards: int, clock: Callable[[], float],
                 write_if: cut.WriteIf) -> None:
        """`shards`: the job's shard count, until `step` says otherwise (a resize); `write_if`:
        the master's lock's, so that every write here is fenced on it."""
        self.etcd, self.job, self.every_s, self.shards, self.clock = etcd, job, every_s, shards, clock
        self.write_if = write_if
        self.last_began = clock()  # the first one after an interval, as a shard's own
        self._outstanding: _Outstanding | None = None

    def step(self, *, request: bytes | None, busy: bool, shards: int | None = None) -> bool:
        """One turn. `request`: the value of `control/checkpoint` now (None: unset); `busy`:
        a rollback is under way (its pause or its request); `shards`: the job's shard count now, if known.
        Returns whether a checkpoint is outstanding: the master slices nothing then."""
        now = self.clock()
        if shards is not None:
            self.shards = shards
        mine = self._outstanding
        if mine is not None and request != mine.request:
            self._outstanding = mine = None  # replaced or withdrawn by someone else
        if mine is None and request is not None:
            # An ask, or a predecessor's request: seen through like one of ours, so that a
            # request whose taker died is withdrawn in the end.
            try:
                checkpoint_id = CheckpointRequest.from_json(request).id
            except SchemaError as exc:
                log.warning("withdrawing %s", exc)
                cut.withdraw(self.job, request, self.write_if)
                return False
            self._outstanding = mine = _Outstanding(checkpoint_id, request, now)
        asked = mine is not None and mine.checkpoint_id is None
        move = next_move(now, every_s=self.every_s, last_began=self.last_began,
                         outstanding_since=mine.since if mine and not asked else None, asked=asked, busy=busy)
        if move == "begin":
            self._begin(mine.request if mine else None, now)
        elif move == "check" and mine is not None and mine.checkpoint_id is not None:
            if not cut.missing_shards(self.etcd, self.job, mine.checkpoint_id, self.shards):
                cut.complete(self.job, mine.request, self.shards, self.write_if)
                cut.withdraw(self.job, mine.request, self.write_if)
                self._outstanding = None
                pruned = cut.prune_records(self.etcd, self.job, self.write_if)
                log.info("checkpoint %s taken in %.1f s (%d old records pruned)", mine.checkpoint_id,
                         now - mine.since, len(pruned))
        elif move == "abandon" and mine is not None:
            missing = cut.missing_shards(self.etcd, self.job, mine.checkpoint_id, self.shards) \
                if mine.checkpoint_id else "all"
            log.warning("checkpoint request %r withdrawn after %.1f s (%s); shard(s) %s had not taken it",
                        mine.request, now - mine.since, "a rollback" if busy else "too long", missing)
            cut.withdraw(self.job, mine.request, self.write_if)
            self._outstanding = None
        return self._outstanding is not None and self._outstanding.checkpoint_id is not None

    def _begin(self, asked: bytes | None, now: float) -> None:
        checkpoint_id = cut.new_checkpoint_id()
        cut.record(self.etcd, self.job, checkpoint_id, self.write_if)
        value = cut.request(self.job, checkpoint_id, asked, self.write_if)
        # None: the ask was withdrawn, or one came in meanwhile; the record is pruned later.
        self._outstanding = _Outstanding(checkpoint_id, value, now) if value is not None else None
        self.last_began = now
