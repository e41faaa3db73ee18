"""What a shard decides about the control plane's requests (schemas/control.py), about its
own checkpoints, about folding its dedup ledger and about when its periodic steps are due, as
pure functions (the clock passed in); pserver/control_requests.py and pserver/shard.py do the work."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from streamtrain.schemas import CheckpointRequest

SERVICE_AWAY_S = 1.0  # a periodic step that failed on etcd or Redis is tried again after this

Outcome = Literal["taken", "failed", "requested"]
Step = Literal["fold", "housekeeping", "checkpoint"]


def checkpoint_to_take(request: CheckpointRequest, *, taken: Collection[str], kept: list[str],
                       registered: bool) -> str | None:
    """The id of the checkpoint `request` asks this shard for, or None if there is none to take:
    an ask of the master (no id until it has recorded the job's side), one this process took,
    one registered before a restart (`registered`), or one older than every checkpoint the
    shard keeps (`kept`, oldest first: it was taken and pruned since; ids sort by time)."""
    wanted = request.id
    if wanted is None or wanted in taken or registered or (kept and wanted < kept[0]):
        return None
    return wanted


def rolled_back_id(to: str, now_id: str) -> str:
    """The id of the checkpoint of a state rolled back to `to`: `now_id` (a new id by this
    host's clock) unless that does not sort after `to`, since a restart loads the newest id
    and must load the rolled-back state, not `to`'s timeline."""
    after = f"{int(to) + 1:020d}" if to.isdigit() else ""
    return max(now_id, after)


def fold_ready(end: int | None, applied_below: int) -> bool:
    """Whether the dedup ledger may fold at the watermarks read with gradient log end `end`
    (None: none read yet): once every delta before that end is applied. Applied, not read: a
    delta held at the sync barrier past the fold would be dropped as stale when released, and
    its examples lost (a task is done, and the watermark passes it, once its deltas are in the
    topic, not once they are applied)."""
    return end is not None and applied_below >= end


def own_checkpoint_at(now: float, every_s: float, outcome: Outcome) -> float:
    """When a shard takes its next checkpoint of its own (no rollback target: for its restarts)
    after `outcome`: one it took ("taken"), one that failed on etcd or Redis ("failed": soon
    again), or one the master requested ("requested"). The master requests one every
    `every_s`, so the shard's own waits half an interval longer: it is taken only when a
    request is late."""
    if outcome == "failed":
        return now + SERVICE_AWAY_S
    return now + (1.5 * every_s if outcome == "requested" else every_s)


@dataclass
class Schedule:
    """When a serving shard's periodic steps are next due (monotonic seconds). Between two
    reads of its gradient topic the shard runs the steps `due` returns, in that order, and
    reports each with `done`."""

    fold_every_s: float
    housekeeping_every_s: float  # the control requests, stats and barrier membership
    checkpoint_every_s: float
    next_fold: float
    next_housekeeping: float
    next_checkpoint: float

    @classmethod
    def starting(cls, now: float, fold_every_s: float, housekeeping_every_s: float,
                 checkpoint_every_s: float) -> Schedule:
        """Housekeeping at once (a request may be waiting), the rest after their interval."""
        return cls(fold_every_s, housekeeping_every_s, checkpoint_every_s,
                   now + fold_every_s, now, now + checkpoint_every_s)

    def due(self, now: float) -> list[Step]:
        steps: list[Step] = []
        if now >= self.next_fold:
            steps.append("fold")
        if now >= self.next_housekeeping:
            steps.append("housekeeping")
        if now >= self.next_checkpoint:
            steps.append("checkpoint")
        return steps

    def done(self, step: Step, now: float, ok: bool) -> None:
        """`step` ran until `now`; `ok`: it did not fail on etcd or Redis. A fold or
        housekeeping that failed is simply tried at its next turn (the next one is soon); a
        checkpoint that failed, after SERVICE_AWAY_S."""
        if step == "fold":
            self.next_fold = now + self.fold_every_s
        elif step == "housekeeping":
            self.next_housekeeping = now + self.housekeeping_every_s
        else:
            self.next_checkpoint = own_checkpoint_at(now, self.checkpoint_every_s, "taken" if ok else "failed")

    def requested(self, now: float) -> None:
        """The master's request was just taken: the shard's own checkpoint waits longer."""
        self.next_checkpoint = own_checkpoint_at(now, self.checkpoint_every_s, "requested")
