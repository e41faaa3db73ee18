"""A shard's publishing thread: applied changes go to Redis in rounds, so that applying never
waits for Redis (`BackgroundPublisher`, over `redis_rounds.Publisher`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import redis

from streamtrain.params.rows import distinct
from streamtrain.pserver.redis_rounds import Publisher, Snapshot
from streamtrain.pserver.state import Changes, ShardState, newest

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """Changes applied but not yet in Redis, coalesced across deltas."""

    rows: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    values: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    blocks: set[tuple[str, int]] = field(default_factory=set)

    def add(self, changes: Changes) -> None:
        for table, ids in changes.rows.items():
            self.rows[table].append(ids)
            self.values[table].append(changes.values[table])
        self.blocks |= changes.blocks

    def changed_rows(self) -> Changes:
        """The ids changed, without their values (a reset reads them from the state): a
        replay's pending values are every delta's rows, too many to join only to drop."""
        return Changes(rows={table: distinct(np.concatenate(parts)) for table, parts in self.rows.items()})

    def take(self) -> Changes | None:
        if not self.rows and not self.blocks:
            return None
        changes = Changes(blocks=self.blocks)
        for table, parts in self.rows.items():
            changes.rows[table], changes.values[table] = newest(parts, self.values[table])
        self.rows, self.values, self.blocks = defaultdict(list), defaultdict(list), set()
        return changes


class BackgroundPublisher:
    """Writes applied changes to Redis from its own thread, so applying never waits for Redis.

    A round starts as soon as an apply hands it changes: it takes the ids changed since the
    last round (only the newest value of a row is sent, however often it changed), copies
    their values under the state lock, then encodes and sends outside it. While one round is
    on the wire the next one's changes gather, so the rounds coalesce under load without a
    fixed delay that every update would wait out (trainers train on what is published: each
    millisecond here is staleness). Each round also writes, per trainer, the newest step whose
    changes it carries (`RedisKeys.applied`), which is how a trainer knows which of its own
    pushes a pull includes. It republishes everything when Redis lost the shard's data: the
    version key is gone, or an INCR did not return the previous version + 1.
    """

    def __init__(self, publisher: Publisher, state: ShardState, lock: threading.Lock,
                 interval_s: float, check_every_s: float, publish_seconds=None) -> None:
        self.publisher = publisher
        self.publish_seconds = publish_seconds  # a prometheus Histogram, or None
        self.state = state
        self.lock = lock
        self.interval_s = interval_s
        self.check_every_s = check_every_s
        self.version: int | None = None
        self.publishes = self.republished = self.rows = 0
        self.error: BaseException | None = None
        self._pending = _Pending()
        self._everything = True
        # A restarted shard's checkpoint position (`resume`): its first round may write only
        # the rows changed since, if the keys hold the rest.
        self._resume: tuple[int, int] | None = None
        self._applied: dict[str, int] = {}  # trainer id -> newest step applied
        self._applied_changed = False
        self._wake = threading.Event()
        self._note: bytes | None = None  # the steps document to write after the next round
        self._checked_at = time.monotonic()
        self._stop = threading.Event()
        # Held for a whole round, so no send of an older snapshot is in flight while someone
        # else (a rollback) changes what Redis should hold.
        self.round_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def add(self, changes: Changes | None, trainer_id: str, step: int) -> None:
        """Called with the state lock held, right after the apply of `trainer_id`'s `step`
        that made `changes` (None: a duplicate, which changed nothing but is done with)."""
        if changes is not None:
            self._pending.add(changes)
        if step > self._applied.get(trainer_id, -1):
            self._applied[trainer_id] = step
            self._applied_changed = True
        self._wake.set()

    def note(self, steps: bytes) -> None:
        """The barrier's steps document (`BarrierSteps`), to write after the next round's send (with the
        state lock held)."""
        self._note = steps

    def position(self) -> tuple[int, int]:
        """Where every change applied so far is, or will be, in the rounds stream: (epoch,
        round), the round numbered at most that (`CheckpointManifest.published_round`); (0, 0)
        when everything is to be written again in a new epoch. Called between applies; waits
        out a round on the wire, after which the changes not in a round sent are all in the
        next one."""
        with self.round_lock:
            if self._everything:
                return 0, 0
            epoch, sent = self.publisher.position()
            return epoch, sent + bool(self._pending.rows or self._pending.blocks)

    def resume(self, epoch: int, round_: int) -> None:
        """A restart from a checkpoint taken at `position` (epoch, round): the first round
        writes to the keys only the rows changed since start-up (by the replay) if Redis's
        keys were flushed through that round of that epoch, which holds every other row at
        its checkpointed value; otherwise every row, as without. At a million rows writing
        every key is the largest part of a shard's restart (bench/RESULTS.md, "a shard's
        restart at up to 925k rows")."""
        self._resume = (epoch, round_)

    def republish(self) -> None:
        """Everything, next round (with the state lock held)."""
        self._pending, self._everything = _Pending(), True

    def unpublish_missing(self, current: ShardState, kept: ShardState) -> None:
        """Delete from Redis the rows and blocks of `current` that `kept` does not have."""
        for name, table in current.tables.items():
            ids = table.ids[:table.size]
            other = kept.tables.get(name)
            gone = ids if other is None else ids[other.index.lookup(ids) < 0]
            self.publisher.unpublish_rows(name, gone)
        self.publisher.unpublish_blocks(set(current.dense) - set(kept.dense))

    def settled(self) -> bool:
        """Whether everything applied so far is in Redis, row keys included: no round on the
        wire, no changes waiting for one, no rows waiting for a flush."""
        with self.round_lock, self.lock:
            return (not self._everything and not self._pending.rows and not self._pending.blocks
                    and self.publisher.unflushed_rows == 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(60)
        self.round(flush=True)  # the keys current: readers of the keys alone come after

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self.round()
                if failing:
                    log.info("shard %d: publishing again", self.publisher.shard)
                failing = False
            except redis.RedisError as exc:
                if not failing:  # once, not every round until Redis (or a cluster's node) is back
                    log.warning("shard %d: publishing failed (%s); republishing everything once it can",
                                self.publisher.shard, exc)
                failing = True  # `round` has marked everything to be written again
            except BaseException as exc:  # surfaced by the serving loop, which stops the shard
                self.error = exc
                return

    def round(self, flush: bool | None = None) -> None:
        """Publish what changed; `flush`: write the row keys too (None: when due)."""
        with self.round_lock:
            try:
                self._round(flush)
            except redis.RedisError:
                # Before the lock is let go: `position` must not count on a round that failed.
                self._everything = True
                raise

    def _round(self, flush: bool | None) -> None:
        now = time.monotonic()
        if self.version is not None and now - self._checked_at >= self.check_every_s:
            self._checked_at = now
            if not self.publisher.published():
                log.warning("shard %d: version key gone from Redis; republishing everything",
                            self.publisher.shard)
                self._everything = True
        resume, self._resume = self._resume, None
        kept = None  # the version Redis had, if its keys hold the rows the replay did not change
        if resume is not None and self._everything:
            kept = self.publisher.flushed_version(*resume)
        with self.lock:
            everything = self._everything
            if not everything:
                changes = self._pending.take()
            elif kept is not None:
                changes = self._pending.changed_rows()
                changes.blocks = set(self.state.dense)
            else:
                changes = Publisher.everything(self.state)
            if everything:
                self._pending, self._everything = _Pending(), False
            note, self._note = self._note, None
            applied = dict(self._applied) if self._applied_changed or everything else None
            self._applied_changed = False
            if flush is None:
                flush = self.publisher.flush_due()
            # Rows changed earlier and not yet in their keys make a round of their own when due.
            if changes is not None or flush:
                snapshot = self.publisher.snapshot(self.state, changes or Changes(), flush, reset=everything)
            else:
                snapshot = None
        if snapshot is None:
            if applied is None:
                if note is not None:
                    self.publisher.send_steps(note)
                return
            # Only duplicates were applied: the round says so, for trainers that follow the
            # rounds stream to learn when their pushes are published.
            snapshot = Snapshot([], [])
        began = time.perf_counter()
        expect: int | None
        if everything:
            expect = 0 if kept is None else kept + 1  # 0: every row is in this round's keys
        else:
            expect = None if self.version is None else self.version + 1
        version = self.publisher.send(snapshot, applied, reset=everything, expect=expect)
        if self.publish_seconds is not None:
            self.publish_seconds.observe(time.perf_counter() - began)
        self.publishes += 1
        self.rows += snapshot.size
        if everything:
            self.republished += 1
            log.info("shard %d: wrote %d row keys of %d (%s)", self.publisher.shard,
                     sum(len(ids) for _, ids, _ in snapshot.keys),
                     sum(t.size for t in self.state.tables.values()),
                     "the rest were in Redis as of the checkpoint" if kept is not None else "all")
        if kept is not None and version != kept + 1:
            self._everything = True  # Redis lost its data since it was read: write every row
        elif not everything and self.version is not None and version != self.version + 1:
            self._everything = True  # the version restarted: Redis lost its data around this write
        self.version = version
        if note is not None:
            self.publisher.send_steps(note)
