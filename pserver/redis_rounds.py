"""A shard's side of its parameters in Redis (the keys and streams: params/paramstore.py):
each round appends the rows it changed to the shard's rounds stream and writes the dense blocks;
a flush every `FLUSH_EVERY_S` (up to `FLUSH_BUSY_S` under load) writes the rows changed since
the last one to their keys, each once. Writing every round's rows to their keys would take
most of Redis's CPU, a row hot enough to change in most rounds written in each of them
(bench/RESULTS.md, "row keys flushed, not written every round")."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import redis

from streamtrain.params import resp
from streamtrain.params.paramstore import ROUNDS_FIELD, ROUNDS_KEPT, flush_mark, stream_id
from streamtrain.params.redisnodes import Client, ShardNodes, moved
from streamtrain.params.rows import distinct
from streamtrain.pserver.state import Changes, DenseBlock, ShardState
from streamtrain.schemas import (
    AppliedSteps,
    FlushMark,
    ParamBlock,
    PublishedRound,
    RedisKeys,
    RoundRows,
    encode_rows_matrix,
)

_CHUNK = 8192  # keys per MSET: large enough to amortise, small enough not to stall Redis
# How often the row keys are brought up to date. Longer writes fewer keys (a hot row once per
# flush, not once per round) and leaves key-only readers further behind.
FLUSH_EVERY_S = 0.25
# The next flush waits at least as long as the last one's keys take at FLUSH_KEYS_PER_S, and at
# most FLUSH_BUSY_S: a busy shard writes its keys once a second, a light stream's stay a quarter
# second fresh. Under load a quarter-second flush takes most of Redis's CPU, and a longer
# interval folds more of a skewed stream's repeated ids into one key write (bench/RESULTS.md,
# "row-key flushes spaced by their keys"). Keys, not row changes, are what a flush costs
# Redis, whatever the machine's speed.
FLUSH_KEYS_PER_S = 16384
FLUSH_BUSY_S = 1.0
# Rows changed since the last flush that force one early: bounds the ids kept meanwhile.
FLUSH_MAX_ROWS = 1 << 20


# Rounds after a flush that force the next: a trainer that has to follow a stream again does
# so from the last flush, which must still be in the stream.
FLUSH_MAX_ROUNDS = ROUNDS_KEPT // 4


def flush_due(since_s: float, dirty_rows: int, rounds: int, last_keys: int = 0, every_s: float = FLUSH_EVERY_S,
              keys_per_s: float = FLUSH_KEYS_PER_S, busy_s: float = FLUSH_BUSY_S, max_rows: int = FLUSH_MAX_ROWS,
              max_rounds: int = FLUSH_MAX_ROUNDS) -> bool:
    """Whether a publish round also writes the rows changed since the last flush to their
    keys: some are waiting, for long enough or enough of them; or the last flush is so many
    rounds back that it must move up, changed rows or not. Long enough is `every_s`, or as
    long as the last flush's `last_keys` take at `keys_per_s` if that is longer, up to
    `busy_s`."""
    if rounds >= max_rounds:
        return True
    if dirty_rows == 0:
        return False
    return since_s >= min(busy_s, max(every_s, last_keys / keys_per_s)) or dirty_rows >= max_rows


def flushed_through(mark: FlushMark | None, version: int, epoch: int, round_: int) -> bool:
    """Whether the row keys hold every row as of round `round_` of the rounds stream's `epoch`
    or later, by the shard's last flush `mark` and its `version` in Redis now: a flush of that
    epoch at that round or after wrote every row the rounds up to it changed, onto keys that
    held the rest, unless Redis lost them before it (its version is then below the mark's:
    it counted again from 1). Round 0 is none: nothing is known. Another epoch's mark says
    nothing: a reset (a restart that wrote everything, a rollback) began it."""
    return (round_ > 0 and mark is not None and mark.version is not None and version >= mark.version
            and mark.epoch == epoch and mark.round >= round_)


@dataclass(frozen=True)
class Snapshot:
    """Copies of changed rows and blocks: taken while the state is not being written, sent
    to Redis afterwards, so a shard can apply while the previous changes are on the wire."""

    rows: list[tuple[str, np.ndarray, np.ndarray]]  # the round's changed rows: table, ids, values (n, dim)
    # param, block, values, version (its steps), the values served (DenseBlock.served)
    blocks: list[tuple[str, int, np.ndarray, int, np.ndarray]]
    keys: Sequence[tuple[str, np.ndarray, np.ndarray]] = ()  # rows to write to their keys (a flush)
    flush: bool = False  # the keys are every row changed since the last flush

    @property
    def size(self) -> int:
        return sum(len(ids) for _, ids, _ in self.rows) + len(self.blocks)


class Publisher:
    def __init__(self, client: Client, job: str, shard: int) -> None:
        """`client`: a single Redis's or a Redis Cluster's; every key of the shard is on one
        node (schemas.RedisKeys), which gets the shard's writes (params/redisnodes.py)."""
        self._nodes = ShardNodes(client, job)
        self._keys = RedisKeys(job)
        self.shard = shard
        # The rounds stream's epoch and the last round of it sent; `send(..., reset=True)`
        # starts a new epoch. A new Publisher (a restarted shard) starts one too.
        self._epoch = secrets.randbits(64)
        self._major = 0  # the epoch's stream ids' first part (`stream_id`)
        self._round = 0
        self._announced: dict[str, int] = {}  # each trainer's step last sent to its channel
        self._dirty: dict[str, list[np.ndarray]] = {}  # per table, ids changed since the last flush
        self._dirty_rows = 0
        self._flushed_at = time.monotonic()
        self._flushed_keys = 0  # how many rows the last flush wrote
        self._flush_round = 0  # the round of the last flush
        self._dense_keys: dict[tuple[str, int], tuple[bytes, bytes]] = {}  # every round writes the blocks it changed

    @property
    def node(self) -> redis.Redis:
        """The client of the node holding this shard's keys."""
        return self._nodes.node(self.shard)

    @property
    def unflushed_rows(self) -> int:
        """Rows changed since the last flush: in rounds, not yet in their keys."""
        return self._dirty_rows

    def position(self) -> tuple[int, int]:
        """(the rounds stream's epoch, the rounds of it sent so far)."""
        return self._epoch, self._round

    def flushed_version(self, epoch: int, round_: int) -> int | None:
        """The shard's version if Redis's row keys hold every row as of round `round_` of
        `epoch` (`flushed_through`), else None."""
        raw_mark, raw_version = self.node.mget(self._keys.flushed(self.shard), self._keys.version(self.shard))
        # The stubs type replies str | bytes whatever the client's decode_responses; ours are bytes.
        if raw_version is None or not flushed_through(flush_mark(raw_mark), int(raw_version), epoch,  # type: ignore[arg-type]
                                                      round_):
            return None
        return int(raw_version)

    def flush_due(self) -> bool:
        return flush_due(time.monotonic() - self._flushed_at, self._dirty_rows, self._round - self._flush_round,
                         self._flushed_keys)

    def snapshot(self, state: ShardState, changes: Changes, flush: bool | None = None,
                 reset: bool = False) -> Snapshot:
        """Copies of the changed rows and blocks (with the state not being written). `flush`:
        also of every row changed since the last flush, for their keys (None: if
        `flush_due`). `reset`: `changes` is everything; all of it goes to the keys."""
        blocks = [_block_copy(p, b, state.dense[(p, b)]) for p, b in changes.blocks]
        if reset:
            self._dirty, self._dirty_rows, self._flushed_at = {}, 0, time.monotonic()
            return Snapshot([], blocks, _gather(state, changes.rows), flush=True)
        rows = [(table, ids, changes.values[table]) for table, ids in changes.rows.items() if table in changes.values]
        rows += _gather(state, {t: ids for t, ids in changes.rows.items() if t not in changes.values})
        for table, ids, _ in rows:
            self._dirty.setdefault(table, []).append(ids)
            self._dirty_rows += len(ids)
        if not (self.flush_due() if flush is None else flush):
            return Snapshot(rows, blocks)
        dirty = {table: parts[0] if len(parts) == 1 else distinct(np.concatenate(parts))
                 for table, parts in self._dirty.items()}
        self._dirty, self._dirty_rows, self._flushed_at = {}, 0, time.monotonic()
        self._flushed_keys = sum(map(len, dirty.values()))
        return Snapshot(rows, blocks, _gather(state, dirty), flush=True)

    def send(self, snapshot: Snapshot, applied: dict[str, int] | None = None, reset: bool = False,
             expect: int | None = None) -> int:
        """Write the snapshot's keys (a flush), then, in one transaction, its dense blocks,
        `applied` (`RedisKeys.applied`) if given, the round's `PublishedRound`, the flush's
        mark and the version bump. Returns the new version. `reset`: the round starts a new
        epoch of the stream and carries no rows (readers drop theirs). `expect`: the version
        the bump should return (`FlushMark.version`: 0 if the snapshot's keys are every row).

        A reader that reads `applied` and the values in one transaction
        (`ParamClient.send_pull`) finds a step counted as applied only once its rows and
        blocks are there: the rows go first on the same connection, and the blocks, to which
        trainers add their own unpublished pushes (trainer/own.py), change with `applied` at
        one instant. In one pipeline without a transaction, Redis runs other clients'
        commands between the round's commands, and a trainer that sees its push counted can
        pull rows without it, which costs AUC (bench/RESULTS.md, "two trainers as good as one
        process"). The rows stay outside the transaction so that a round
        of a whole shard (a republish) is not one command that blocks Redis."""
        batch = resp.Batch()
        for table, ids, values in snapshot.keys:
            prefix = self._keys.row_prefix(self.shard, table).encode()
            encoded = encode_rows_matrix(values)
            for i in range(0, len(ids), _CHUNK):
                batch.add(resp.mset(prefix, ids[i:i + _CHUNK], encoded[i:i + _CHUNK]))
        batch.multi()
        pool = self.node.connection_pool
        conn = pool.get_connection()
        try:
            for param, block, values, version, served in snapshot.blocks:
                live_key, served_key = self._dense_keys_of(param, block)
                batch.queue(resp.command(b"SET", live_key,
                                         ParamBlock.of_wire_types(param, block, version, values).to_bytes()))
                batch.queue(resp.command(b"SET", served_key,
                                         ParamBlock.of_wire_types(param, block, version, served).to_bytes()))
            if applied is not None:
                batch.queue(self._applied_command(applied))
                if reset:
                    self._announced = {}
                for trainer, step in applied.items():
                    if self._announced.get(trainer) != step:
                        batch.queue(resp.command(b"PUBLISH", self._keys.published(self.shard, trainer).encode(),
                                                 b"%d" % step))
                        self._announced[trainer] = step
            if reset:
                batch.queue(resp.command(b"DEL", self._keys.rounds(self.shard).encode()))
            batch.queue(self._round_command(snapshot, applied or {}, reset))
            if snapshot.flush:
                self._flush_round = self._round
                mark = FlushMark(stream_id(self._major, self._round), self._epoch, self._round, expect)
                batch.queue(resp.command(b"SET", self._keys.flushed(self.shard).encode(), mark.to_bytes()))
            batch.queue(resp.command(b"INCR", self._keys.version(self.shard).encode()))
            batch.exec()
            # One write, every reply counted by the batch (params/resp.py `Batch`, which says
            # why redis-py's pipeline is not used here).
            results = batch.send(conn)
            return int(results[-1])
        except BaseException as exc:
            conn.disconnect()  # a half-read reply stream must not go back to the pool
            if isinstance(exc, redis.RedisError) and moved(exc):
                self._nodes.forget()
            raise
        finally:
            pool.release(conn)

    def _dense_keys_of(self, param: str, block: int) -> tuple[bytes, bytes]:
        """The block's key trainers pull and the key of what is served (`RedisKeys.served`)."""
        keys = self._dense_keys.get((param, block))
        if keys is None:
            keys = self._dense_keys[(param, block)] = (self._keys.dense(self.shard, param, block).encode(),
                                                       self._keys.served(self.shard, param, block).encode())
        return keys

    def send_steps(self, document: bytes) -> None:
        """The barrier's steps document (sync and bounded SGD) to its key, and to the trainers
        waiting on its channel."""
        pipe = self.node.pipeline(transaction=False)
        pipe.set(self._keys.steps(self.shard), document)
        pipe.publish(self._keys.steps_written(self.shard), document)
        pipe.execute()

    def _applied_command(self, applied: dict[str, int]) -> bytes:
        return resp.command(b"SET", self._keys.applied(self.shard).encode(), AppliedSteps(applied).to_json())

    def _round_command(self, snapshot: Snapshot, applied: dict[str, int], reset: bool) -> bytes:
        if reset:
            # The stream is deleted with the reset, so a new epoch's ids need only exceed
            # its own; starting at the clock keeps them ahead of the old ones a reader holds.
            self._epoch, self._round = secrets.randbits(64), 0
            self._major = max(int(time.time() * 1000), self._major + 1)
        self._round += 1
        rows = () if reset else tuple(RoundRows(table, ids, values) for table, ids, values in snapshot.rows)
        entry = PublishedRound(self._epoch, self._round, reset, applied, rows).to_bytes()
        return resp.command(b"XADD", self._keys.rounds(self.shard).encode(), b"MAXLEN", b"~",
                            b"%d" % ROUNDS_KEPT, stream_id(self._major, self._round), ROUNDS_FIELD, entry)

    def publish(self, state: ShardState, changes: Changes) -> int:
        """Write the changed rows, to their keys too, and blocks, then bump the version.
        Returns the new version."""
        return self.send(self.snapshot(state, changes, flush=True))

    def publish_all(self, state: ShardState) -> int:
        """Everything this shard holds (after a restart or a flushed Redis)."""
        return self.send(self.snapshot(state, self.everything(state), reset=True), reset=True, expect=0)

    @staticmethod
    def everything(state: ShardState) -> Changes:
        return Changes(rows={name: t.ids[: t.size] for name, t in state.tables.items()},
                       blocks=set(state.dense))

    def unpublish_rows(self, table: str, ids: np.ndarray) -> None:
        keys = self._keys.rows(self.shard, table, ids)
        for i in range(0, len(keys), _CHUNK):
            self.node.unlink(*keys[i:i + _CHUNK])

    def unpublish_blocks(self, blocks: Iterable[tuple[str, int]]) -> None:
        keys = [key for p, b in blocks for key in (self._keys.dense(self.shard, p, b),
                                                   self._keys.served(self.shard, p, b))]
        if keys:
            self.node.unlink(*keys)

    def published(self) -> bool:
        try:
            return bool(self.node.exists(self._keys.version(self.shard)))
        except redis.RedisError as exc:
            if moved(exc):
                self._nodes.forget()
            raise


def _block_copy(param: str, block: int, dense: DenseBlock) -> tuple[str, int, np.ndarray, int, np.ndarray]:
    return param, block, dense.values[0].copy(), int(dense.steps[0]), dense.served()[0].copy()


def _gather(state: ShardState, rows: Mapping[str, np.ndarray]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    for table, ids in rows.items():
        t = state.tables.get(table)
        if t is None:
            continue
        slots = t.index.lookup(ids)
        if (slots < 0).any():  # ids of a state replaced since (a rollback): not this state's rows
            ids, slots = ids[slots >= 0], slots[slots >= 0]
        out.append((table, ids, t.gather(slots)))
    return out
