"""How long a trainer waits after a push: `train.sgd = "sync"` and `"bounded"` (see
pserver/barrier.py), and async mode's `train.max_in_flight`.

async: after handing pushes to the committer, wait while more than `max_in_flight` (default
0) of this trainer's own pushes are not yet published by every shard (`InFlight`). It never
waits for another trainer, so a trainer with no work (a live stream between records) holds
nobody back; and since every trainer keeps its own pushes close, each also trains on
parameters missing only the last push or two of the others.

sync: after pushing step k, wait until every shard has released step k, so the next
mini-batch trains on parameters that include every live trainer's step k. bounded (stale synchronous parallel):
before going on, wait while this
trainer's own step is not yet visible at every shard, or while it is more than `staleness`
steps ahead of the slowest trainer's visible step (`next_step`). Its own step is what bounds
staleness under load: without it a trainer whose shards lag behind trains on parameters
missing its own updates, and loses AUC against the single-process run, the more the busier
the machine (bench/RESULTS.md, "From docs/trainer.md").
Waits are capped (`max_wait_s`): a shard that is down must not stall training forever; the
cap is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from streamtrain.params.redisnodes import Client, ShardNodes
from streamtrain.params.watches import ChannelWatch
from streamtrain.schemas import BarrierSteps, RedisKeys
from streamtrain.schemas.config import SgdMode
from streamtrain.trainer.own import OwnPushes

log = logging.getLogger(__name__)


class StepGate:
    def __init__(self, client: Client, job: str, shards: int, mode: SgdMode, staleness: int,
                 trainer_id: str, max_wait_s: float) -> None:
        self._nodes = ShardNodes(client, job)
        keys = RedisKeys(job)
        self._keys = {s: keys.steps(s) for s in range(shards)}
        self._written = ChannelWatch(self._nodes, {keys.steps_written(s): s for s in range(shards)})
        self.mode = mode
        self.staleness = staleness
        self.trainer_id = trainer_id
        self.max_wait_s = max_wait_s
        self.waited_s = 0.0

    @property
    def active(self) -> bool:
        return self.mode.waits_on_steps

    def _read(self) -> list[BarrierSteps]:
        return [s or BarrierSteps() for s in self._read_each()]

    def _read_each(self) -> list[BarrierSteps | None]:
        raw = self._nodes.get_each(self._keys)
        return [BarrierSteps.from_json(value) if (value := raw[s]) else None for s in self._keys]

    def _read_if_up(self) -> list[BarrierSteps | None]:
        """As `_read_each`; none read while Redis is away (it may be restarting)."""
        try:
            return self._read_each()
        except (redis.ConnectionError, redis.TimeoutError):
            return [None] * len(self._keys)

    def first_step(self, wait_s: float = 10.0) -> int:
        """A trainer joins at the step the barrier is at (`joining_step`), read once every
        shard has written its steps document, for up to `wait_s`. Shards write theirs at every
        round and every housekeeping (a second), so only a job whose shards are not up yet, or
        a Redis just restarted empty, has none. Joining at 0 there would be wrong: the shards
        still remember this trainer's predecessor's newer step, so in bounded mode its own
        steps would read as visible at once and it would train on rows missing its own pushes
        until it passed that step. Redis away counts as no document yet."""
        deadline = time.monotonic() + wait_s
        steps = self._read_if_up()
        while any(s is None for s in steps) and time.monotonic() < deadline:
            time.sleep(0.1)
            steps = self._read_if_up()
        missing = [shard for shard, s in zip(self._keys, steps) if s is None]
        if missing:
            log.warning("trainer %s: no steps document from shard(s) %s after %.0f s; joining at the others'",
                        self.trainer_id, missing, wait_s)
        return joining_step(self.mode, [s for s in steps if s is not None], self.trainer_id)

    def after_push(self, step: int, check: Callable[[], None] = lambda: None) -> int:
        """Wait as the mode says after handing `step` to the committer; returns the step to
        use next. `check` runs between polls and raises if the step can no longer land (its
        commit failed)."""
        if not self.active:
            return step + 1
        began = time.monotonic()
        self._written.subscribe()  # before reading the keys: no change between is missed
        steps = self._read()
        while True:
            go_on = next_step(self.mode, step, steps, self.trainer_id, self.staleness)
            if go_on is not None:
                return go_on
            if time.monotonic() - began > self.max_wait_s:
                log.warning("trainer %s: step %d still held after %.0f s; going on", self.trainer_id,
                            step, self.max_wait_s)
                return step + 1
            check()
            # Asleep until a shard writes its steps: polling the keys every millisecond costs
            # bounded mode noticeably more CPU a record than async (bench/RESULTS.md, "claims in
            # arrival order; bounded mode waits for a trainer's own step"). Nothing
            # heard for a while (a lost message, a reconnection): the keys are read again.
            heard = self._written.wait(0.05)
            if heard:
                for shard, document in heard.items():
                    steps[shard] = BarrierSteps.from_json(document)
            else:
                steps = self._read()
            self.waited_s = time.monotonic() - began

    def close(self) -> None:
        self._written.close()


def joining_step(mode: SgdMode, steps: list[BarrierSteps], trainer_id: str) -> int:
    """The first step of trainer `trainer_id` joining (or coming back) given the shards'
    `BarrierSteps`: sync, the step the barrier releases next; bounded, the slowest trainer's
    step, which would otherwise wait for the newcomer to catch up, and past every step the
    shards remember of this trainer's predecessor (a step at or below it would read as visible
    at once, `next_step`)."""
    if mode.holds_at_barrier:
        return min((s.next for s in steps), default=0)
    slowest = min((v for s in steps for v in s.trainers.values()), default=-1)
    own = max((s.trainers.get(trainer_id, -1) for s in steps), default=-1)
    return max(slowest, own) + 1


def next_step(mode: SgdMode, step: int, steps: list[BarrierSteps], trainer_id: str, staleness: int) -> int | None:
    """The step to go on with after pushing `step`, or None to wait, given each shard's
    `BarrierSteps` (`next`, the step it releases next, and `trainers`, each trainer's newest
    step it has made visible).

    sync: once every shard has released `step`. bounded: once every shard shows this trainer's
    own `step` and the slowest trainer is at most `staleness` steps behind it. Waiting for its
    own step is what keeps a trainer from training on rows that miss its own last pushes
    (only the steps of the push being made are estimated, trainer/own.py): trainers allowed
    own pushes unseen fall behind one process in AUC (bench/RESULTS.md, "claims in arrival
    order; bounded mode waits for a trainer's own step").
    """
    if mode.holds_at_barrier:
        released = min(s.next for s in steps)
        return max(step + 1, released) if released > step else None
    own = min(s.trainers.get(trainer_id, -1) for s in steps)
    slowest = min((v for s in steps for v in s.trainers.values()), default=own)
    return step + 1 if own >= step and step - slowest <= staleness else None


class InFlight:
    """Async mode's bound on a trainer's own pushes not yet visible (`train.max_in_flight`).

    `await_applied(timeout_s)` waits up to `timeout_s` for the shards' next publish rounds and
    returns the newest `applied` ({shard: {trainer id: step}}) they announced
    (`params.watches.AppliedWatch.wait`): the trainer sleeps until a round lands instead of
    polling."""

    def __init__(self, limit: int, await_applied: Callable[[float], dict[int, dict[str, int]]],
                 trainer_id: str, max_wait_s: float) -> None:
        self.limit = limit
        self.await_applied = await_applied
        self.trainer_id = trainer_id
        self.max_wait_s = max_wait_s
        self.waited_s = 0.0  # the last wait
        self._given_up = -1  # pushes up to this step timed out once: not waited for again

    def wait(self, own: OwnPushes, through: int, check: Callable[[], None] = lambda: None) -> None:
        """Wait until at most `limit` of `own`'s pushes up to step `through` are unpublished.
        `check` runs between polls and raises if they can no longer land (a failed commit).
        After `max_wait_s` it goes on and never waits for those pushes again: a shard that is
        down slows each push by one wait, not by one wait per push."""
        began = time.monotonic()
        while own.lagging(self._given_up, through, self.limit):
            if time.monotonic() - began > self.max_wait_s:
                log.warning("trainer %s: %d pushes still unpublished after %.0f s; going on", self.trainer_id,
                            own.in_flight(through), self.max_wait_s)
                self._given_up = through
                break
            check()
            own.published(self.await_applied(0.05))
        self.waited_s = time.monotonic() - began
