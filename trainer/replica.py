"""A trainer's copy of the rows it has read, kept current by the shards' rounds streams.

Reading a row from its Redis key costs Redis a lookup and a reply and the trainer a parse,
for every row of every mini-batch (3.5 rows a record in the e2e workload), and most rows a
trainer reads it has read before. So it keeps them, and follows each shard's rounds stream
(pserver/serving.py): a round carries the rows it changed with their new values, and the
trainer writes those it holds into its copy. A pull reads from the keys only rows the copy
does not have.

Why the copy is as current as the keys: a shard writes a round's row keys before it appends
the round to its stream, and a pull reads the streams and the keys it needs in one Redis
transaction. Applying the rounds read, then the rows read from keys, leaves every row at its
newest published value; a key may be newer than the rounds read so far, and the round that
wrote it, applied later, writes the same value.

A shard's rounds are numbered within an epoch (`PublishedRound`). When one is missing
(trimmed while this trainer was away, or undecodable) or a new epoch begins (the shard
republished everything: a restart, a lost Redis, a rollback), the copy drops that shard's rows
and reads them from the keys again. So does a copy that outgrows `max_bytes`, all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pserver.rows import IdIndex, row_view
from pserver.serving import Round
from schemas import PublishedRound

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
        self.generation = 0  # bumped whenever rows are dropped: slots looked up before are stale
        self.drops = 0
        self._clear(capacity)

    @property
    def size(self) -> int:
        return self._size

    def start(self, tails: dict[int, Round | None]) -> None:
        """Begin each shard's stream after its newest round (`ParamClient.rounds_tail`); the
        copy is empty, so nothing before matters."""
        for shard, tail in tails.items():
            if tail is not None:
                at, entry = tail
                self.after[shard] = at
                self._positions[shard] = None if entry is None else Position(entry.epoch, entry.round)

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
        self._reserve(self._size + n)
        slots = np.arange(self._size, self._size + n, dtype=np.int64)
        self._ids[slots] = ids
        self._owners[slots] = owners
        self._values[slots] = values
        self._index.insert(ids, slots)
        self._size += n
        return slots

    # -- rounds ----------------------------------------------------------------------------
    def apply(self, rounds: dict[int, list[Round]]) -> dict[int, dict[str, int]]:
        """Apply the rounds read after `after` ({shard: entries, oldest first}); returns,
        per shard that had any, the newest `applied` its rounds carried."""
        applied: dict[int, dict[str, int]] = {}
        for shard, entries in rounds.items():
            for at, entry in entries:
                if follows(self._positions[shard], entry):
                    self._write(entry)
                else:
                    self._drop(shard)
                self._positions[shard] = None if entry is None else Position(entry.epoch, entry.round)
                self.after[shard] = at
                if entry is not None and entry.applied:
                    applied[shard] = entry.applied
        return applied

    def _write(self, entry: PublishedRound) -> None:
        for rows in entry.rows:
            if rows.table != self.table or not self._size or rows.values.shape[1] != self.width:
                continue
            slots = self._index.lookup(rows.ids)
            held = slots >= 0
            if held.all():
                np.put(row_view(self._values), slots, row_view(np.ascontiguousarray(rows.values)))
            elif held.any():
                np.put(row_view(self._values), slots[held], row_view(np.ascontiguousarray(rows.values[held])))

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
