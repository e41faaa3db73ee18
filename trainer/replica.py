"""A trainer's copy of the rows the shards' rounds streams changed, kept current by them.

Reading a row from its Redis key costs Redis a lookup and a reply and the trainer a parse,
for every row of every mini-batch (3.5 rows a record in the e2e workload), and most rows a
trainer reads have changed a moment ago. So it follows each shard's rounds stream
(params/paramstore.py): a round carries the rows it changed with their new values, and the
trainer holds every one of them. A pull reads from the keys only rows the copy does not hold.

Why the copy and the keys together are current: the keys are written by a flush every so
often, which marks its round (`FlushMark`); the copy follows each stream from such a mark on,
so it holds every row changed since, at its newest value. A row it does not hold has not
changed since the mark, and its key, written by that flush or an earlier one, is its value.
A pull reads the streams, the marks and the keys it needs in one Redis transaction and
applies the rounds first: a row a round brought meanwhile is taken from the copy, not from
its key. A key newer than the rounds read so far is harmless too: the rounds that wrote it,
applied later in order, end at the same value.

A shard's rounds are numbered within an epoch (`PublishedRound`). When one is missing
(trimmed while this trainer was away, or undecodable) or a new epoch begins (the shard
republished everything: a restart, a lost Redis, a rollback), the copy drops that shard's rows
and follows it again from its last flush. A copy that outgrows `max_bytes` starts again empty,
every shard from its last flush.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamtrain.params.paramstore import Round
from streamtrain.params.rows import IdIndex, row_view
from streamtrain.schemas import FlushMark, PublishedRound

START = b"0-0"  # a stream position before every entry


@dataclass(frozen=True)
class Position:
    epoch: int
    round: int


def follows(position: Position | None, entry: PublishedRound | None) -> bool:
    """Whether `entry` is the round right after `position` in an unbroken run, so that rows
    held of the shard stay current by applying it. Otherwise they must be dropped: nothing
    is known of a round that did not decode, and a reset round or a gap in the numbering
    means rounds were missed."""
    return (position is not None and entry is not None and not entry.reset
            and entry.epoch == position.epoch and entry.round == position.round + 1)


def _at_or_before(entry: PublishedRound | None, position: Position | None) -> bool:
    return (entry is not None and position is not None and entry.epoch == position.epoch
            and entry.round <= position.round)


class RowReplica:
    """Rows of one table (the model's `RowLayout`) by id, each with its owning shard, and
    the position in each shard's rounds stream they are current to."""

    def __init__(self, table: str, width: int, shards: int, max_bytes: int = 256 << 20,
                 capacity: int = 1 << 16) -> None:
        self.table = table
        self.width = width
        self.max_rows = max(capacity, max_bytes // (4 * max(width, 1)))
        self.after: dict[int, bytes] = {s: START for s in range(shards)}  # stream id read last
        self._positions: dict[int, Position | None] = {s: None for s in range(shards)}
        self._flushed: dict[int, FlushMark | None] = {s: None for s in range(shards)}  # last seen
        self.generation = 0  # bumped whenever rows are dropped: slots looked up before are stale
        self.drops = 0
        self.restarts = 0  # times the copy outgrew its budget
        self._clear(capacity)

    @property
    def size(self) -> int:
        return self._size

    def start(self, flushed: dict[int, FlushMark | None]) -> None:
        """Follow each shard from its last flush (`ParamClient.flushed`); a shard with none
        yet is started by the first pull that finds one."""
        for shard, mark in flushed.items():
            self._flushed[shard] = mark
            self._restart(shard)

    # -- rows ------------------------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 for ids not held."""
        return self._index.lookup(ids)

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """A fresh (len(slots), width) copy of the rows in `slots` (all held)."""
        return np.take(row_view(self._values), slots).view(np.float32).reshape(len(slots), self.width)

    def insert(self, ids: np.ndarray, owners: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Hold rows not held yet (distinct `ids`, owned by `owners`); returns their slots."""
        n = len(ids)
        if self._size + n > self.max_rows:
            self._clear(len(self._ids))
            self.generation += 1
            self.restarts += 1
            for shard in self._positions:
                self._restart(shard)
        self._reserve(self._size + n)
        start, stop = self._size, self._size + n
        slots = np.arange(start, stop, dtype=np.int64)
        self._ids[start:stop] = ids
        self._owners[start:stop] = owners
        self._values[start:stop] = values
        self._index.insert(ids, slots)
        self._size += n
        return slots

    def hold(self, ids: np.ndarray, owners: np.ndarray, values: np.ndarray) -> None:
        """Hold rows a pull read from their keys (distinct `ids` not held, owned by `owners`),
        those of shards followed only. A shard is followed from a flush on; a row read before
        the replica has seen any flush of its shard could be older than the flush it is then
        followed from, and the rounds up to that flush, passed over, would never bring it up to
        date, and a step would train on rows missing the one before it (bench/RESULTS.md,
        "the deep sync comparison's gap was a replica defect"). A row read while its shard is
        followed is no older than the flush
        its position came from, and the rounds after it bring it up to date."""
        followed = np.array([self._positions[s] is not None for s in range(len(self._positions))])
        keep = followed[owners]
        if keep.all():
            self.insert(ids, owners, values)
        elif keep.any():
            self.insert(ids[keep], owners[keep], values[keep])

    # -- rounds ----------------------------------------------------------------------------
    def apply(self, rounds: dict[int, list[Round]], flushed: dict[int, FlushMark | None]
              ) -> dict[int, dict[str, int]]:
        """Apply the rounds read after `after` ({shard: entries, oldest first}) with the
        shards' last flushes read at the same instant; returns, per shard that had any, the
        newest `applied` its rounds carried."""
        for shard, mark in flushed.items():
            if mark is not None:
                self._flushed[shard] = mark
        applied: dict[int, dict[str, int]] = {}
        restarts = self.restarts
        for shard, entries in rounds.items():
            restarted = self._positions[shard] is None  # read from where nothing was known
            if restarted:
                self._restart(shard)
            for at, entry in entries:
                if not follows(self._positions[shard], entry) and not restarted:
                    self._drop(shard)
                    self._restart(shard)
                    restarted = True
                position = self._positions[shard]
                if not follows(position, entry):
                    if _at_or_before(entry, position):
                        continue  # before the flush this shard is followed from again
                    break  # still not followed: read on from the flush next time
                assert entry is not None  # `follows` holds only of a round that decoded
                self._write(shard, entry)
                if self.restarts != restarts:  # outgrew the budget: every shard starts again
                    return applied
                self._positions[shard] = Position(entry.epoch, entry.round)
                self.after[shard] = at
                if entry.applied:
                    applied[shard] = entry.applied
        for shard, mark in flushed.items():
            position = self._positions[shard]
            # Flushed in an epoch whose rounds this copy has not seen start: it missed them.
            if mark is not None and position is not None and mark.epoch != position.epoch:
                self._drop(shard)
                self._restart(shard)
        return applied

    def _write(self, shard: int, entry: PublishedRound) -> None:
        for rows in entry.rows:
            if rows.table != self.table or rows.values.shape[1] != self.width:
                continue
            slots = self._index.lookup(rows.ids)
            held = slots >= 0
            if held.all():
                np.put(row_view(self._values), slots, row_view(np.ascontiguousarray(rows.values)))
                continue
            # `take` rather than indexing rows with a mask: a copy of whole rows at once.
            if held.any():
                at = np.flatnonzero(held)
                np.put(row_view(self._values), slots.take(at), row_view(rows.values.take(at, axis=0)))
            new = np.flatnonzero(~held)
            self.insert(rows.ids.take(new), np.full(len(new), shard, np.int32), rows.values.take(new, axis=0))

    def _restart(self, shard: int) -> None:
        mark = self._flushed[shard]
        if mark is None:
            self._positions[shard], self.after[shard] = None, START
        else:
            self._positions[shard], self.after[shard] = Position(mark.epoch, mark.round), mark.at

    def _drop(self, shard: int) -> None:
        if not self._size:
            return
        owners = self._owners[:self._size]
        if not (owners == shard).any():
            return
        keep = np.flatnonzero(owners != shard)
        ids, kept_owners, values = self._ids[keep], owners[keep], self.gather(keep)
        self._clear(len(self._ids))
        self.generation += 1
        self.drops += 1
        if len(keep):
            self.insert(ids, kept_owners, values)

    def _clear(self, capacity: int) -> None:
        self._index = IdIndex(capacity * 2)
        self._ids = np.zeros(capacity, dtype=np.uint64)
        self._owners = np.zeros(capacity, dtype=np.int32)
        self._values = np.zeros((capacity, self.width), dtype=np.float32)
        self._size = 0

    def _reserve(self, needed: int) -> None:
        capacity = len(self._ids)
        if needed <= capacity:
            return
        grown = max(needed, capacity * 2)
        self._ids = np.concatenate([self._ids, np.zeros(grown - capacity, dtype=np.uint64)])
        self._owners = np.concatenate([self._owners, np.zeros(grown - capacity, dtype=np.int32)])
        values = np.zeros((grown, self.width), dtype=np.float32)
        values[:capacity] = self._values
        self._values = values
