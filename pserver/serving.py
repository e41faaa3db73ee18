"""Parameters in Redis: the shard publishes what changed, `ParamClient` pulls.

Keys (schemas.RedisKeys): one value per sparse row (`st:<job>:row:<table>:<id>`), one per dense
block (`st:<job>:dense:<param>:<block>`), and a version counter per shard
(`st:<job>:version:<shard>`) bumped after each publish. Every value is written by a single SET
inside a pipeline, so a reader sees a row or block either before or after an update, never
half of it. Redis is a cache: a shard republishes everything when its version key is gone
(FLUSHALL, a restarted Redis), and a reader that finds a shard's version missing is told to
retry rather than handed initial values.

Each round is appended, rows and values in one `PublishedRound`, to the shard's rounds stream
(`st:<job>:rounds:<shard>`, the newest `ROUNDS_KEPT` or so), and the dense blocks are written
at once. The row keys are written less often: a flush every `FLUSH_EVERY_S` writes the rows
changed since the last one, each once, and marks its round in `st:<job>:flushed:<shard>`.
Writing every round's rows to their keys was two thirds of Redis's CPU, and a row hot enough
to change in most rounds was written in each of them. A trainer follows the streams from a
flush on (trainer/replica.py): it holds every row a round changed since, so the keys it reads
are rows no round has changed since the flush, whose keys are current. Readers of the keys
alone (`streamtrain predict`, online inference) see rows up to `FLUSH_EVERY_S` old.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import redis

from pserver import resp
from pserver.rows import initial_rows
from pserver.sharding import SlotMap
from pserver.state import Changes, ShardState
from schemas import ParamBlock, PublishedRound, RedisKeys, RoundRows, SchemaError, decode_rows, encode_rows_matrix

_CHUNK = 8192  # keys per MSET: large enough to amortise, small enough not to stall Redis
# Rounds kept in a shard's stream (approximately: trimmed a node at a time). A trainer that
# falls further behind than this drops the shard's rows and reads them again (trainer/replica.py).
ROUNDS_KEPT = 512
_ROUNDS_FIELD = b"r"
# How often the row keys are brought up to date. Longer writes fewer keys (a hot row once per
# flush, not once per round) and leaves key-only readers further behind.
FLUSH_EVERY_S = 0.25
# Rows changed since the last flush that force one early: bounds the ids kept meanwhile.
FLUSH_MAX_ROWS = 1 << 20


# Rounds after a flush that force the next: a trainer that has to follow a stream again does
# so from the last flush, which must still be in the stream.
FLUSH_MAX_ROUNDS = ROUNDS_KEPT // 4


def flush_due(since_s: float, dirty_rows: int, rounds: int, every_s: float = FLUSH_EVERY_S,
              max_rows: int = FLUSH_MAX_ROWS, max_rounds: int = FLUSH_MAX_ROUNDS) -> bool:
    """Whether a publish round also writes the rows changed since the last flush to their
    keys: some are waiting, for long enough or enough of them; or the last flush is so many
    rounds back that it must move up, changed rows or not."""
    return rounds >= max_rounds or (dirty_rows > 0 and (since_s >= every_s or dirty_rows >= max_rows))


@dataclass(frozen=True)
class Flushed:
    """The round of a shard's last flush (`RedisKeys.flushed`): its rounds-stream id, and
    the epoch and number of the round. The row keys hold every row as of that round at least,
    and the rounds after it are in the stream."""

    at: bytes
    epoch: int
    round: int

    def to_bytes(self) -> bytes:
        return b"%s %d" % (self.at, self.epoch)

    @classmethod
    def from_bytes(cls, raw: bytes) -> Flushed:
        at, epoch = raw.split(b" ")
        return cls(at, int(epoch), int(at.split(b"-")[1]))


def stream_id(major: int, round_: int) -> bytes:
    """A round's id in its shard's stream: the epoch's start in ms, and the round number, so
    that a flush can name its round in the same transaction as it appends it."""
    return b"%d-%d" % (major, round_)


def _applied_json(applied: dict[str, int]) -> bytes:
    return json.dumps(applied, separators=(",", ":")).encode()


class ParamsUnavailableError(RuntimeError):
    """A shard has not published (yet, or since Redis lost its data); retry after `retry_after`."""

    def __init__(self, shards: list[int], retry_after: float = 0.5) -> None:
        super().__init__(f"parameters of shard(s) {shards} are not in Redis yet; retry in {retry_after} s")
        self.shards = shards
        self.retry_after = retry_after


@dataclass(frozen=True)
class Snapshot:
    """Copies of changed rows and blocks: taken while the state is not being written, sent
    to Redis afterwards, so a shard can apply while the previous changes are on the wire."""

    rows: list[tuple[str, np.ndarray, np.ndarray]]  # the round's changed rows: table, ids, values (n, dim)
    blocks: list[tuple[str, int, np.ndarray]]  # param, block, values
    keys: list[tuple[str, np.ndarray, np.ndarray]] = ()  # rows to write to their keys (a flush)
    flush: bool = False  # the keys are every row changed since the last flush

    @property
    def size(self) -> int:
        return sum(len(ids) for _, ids, _ in self.rows) + len(self.blocks)


class Publisher:
    def __init__(self, client: redis.Redis, job: str, shard: int) -> None:
        self._redis = client
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
        self._flush_round = 0  # the round of the last flush

    @property
    def client(self) -> redis.Redis:
        return self._redis

    def flush_due(self) -> bool:
        return flush_due(time.monotonic() - self._flushed_at, self._dirty_rows, self._round - self._flush_round)

    def snapshot(self, state: ShardState, changes: Changes, flush: bool | None = None,
                 reset: bool = False) -> Snapshot:
        """Copies of the changed rows and blocks (with the state not being written). `flush`:
        also of every row changed since the last flush, for their keys (None: if
        `flush_due`). `reset`: `changes` is everything; all of it goes to the keys."""
        blocks = [(p, b, state.dense[(p, b)].values[0].copy()) for p, b in changes.blocks]
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
        dirty = {table: parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
                 for table, parts in self._dirty.items()}
        self._dirty, self._dirty_rows, self._flushed_at = {}, 0, time.monotonic()
        return Snapshot(rows, blocks, _gather(state, dirty), flush=True)

    def send(self, snapshot: Snapshot, applied: dict[str, int] | None = None, reset: bool = False) -> int:
        """Write the snapshot's keys (a flush), then, in one transaction, its dense blocks,
        `applied` (`RedisKeys.applied`) if given, the round's `PublishedRound`, the flush's
        mark and the version bump. Returns the new version. `reset`: the snapshot is
        everything the shard holds; the round starts a new epoch of the stream and carries no
        rows (readers drop theirs).

        A reader that reads `applied` and the values in one transaction
        (`ParamClient.send_pull`) finds a step counted as applied only once its rows and
        blocks are there: the rows go first on the same connection, and the blocks, to which
        trainers add their own unpublished pushes (trainer/own.py), change with `applied` at
        one instant. With everything in one pipeline and `applied` first, Redis ran other
        clients' commands between the round's commands, and a trainer that saw its push
        counted pulled rows without it (one trainer lost 0.013 AUC to its in-process
        reference, bench/RESULTS.md). The rows stay outside the transaction so that a round
        of a whole shard (a republish) is not one command that blocks Redis."""
        chunks: list[bytes] = []
        rows = 0
        for table, ids, values in snapshot.keys:
            prefix = self._keys.row(table, 0)[:-1].encode()
            encoded = encode_rows_matrix(values)
            for i in range(0, len(ids), _CHUNK):
                chunks.append(resp.mset(prefix, ids[i:i + _CHUNK], encoded[i:i + _CHUNK]))
                rows += 1
        chunks.append(resp.command(b"MULTI"))
        queued = 1  # the INCR
        conn = self._redis.connection_pool.get_connection()
        try:
            for param, block, values in snapshot.blocks:
                chunks += conn.pack_command("SET", self._keys.dense(param, block),
                                            ParamBlock(param, block, 0, values).to_bytes())
                queued += 1
            if applied is not None:
                chunks.append(self._applied_command(applied))
                queued += 1
                if reset:
                    self._announced = {}
                for trainer, step in applied.items():
                    if self._announced.get(trainer) != step:
                        chunks.append(resp.command(b"PUBLISH", self._keys.published(self.shard, trainer).encode(),
                                                   b"%d" % step))
                        self._announced[trainer] = step
                        queued += 1
            if reset:
                chunks.append(resp.command(b"DEL", self._keys.rounds(self.shard).encode()))
                queued += 1
            chunks.append(self._round_command(snapshot, applied or {}, reset))
            queued += 1
            if snapshot.flush:
                self._flush_round = self._round
                mark = Flushed(stream_id(self._major, self._round), self._epoch, self._round)
                chunks.append(resp.command(b"SET", self._keys.flushed(self.shard).encode(), mark.to_bytes()))
                queued += 1
            chunks += conn.pack_command("INCR", self._keys.version(self.shard))
            chunks.append(resp.command(b"EXEC"))
            conn.send_packed_command(chunks)
            # The MSETs' replies, MULTI's OK and a QUEUED per command, then EXEC's replies.
            for _ in range(rows + 1 + queued):
                conn.read_response()
            results = conn.read_response()
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise failed[0]
            return int(results[-1])
        except BaseException:
            conn.disconnect()  # a half-read reply stream must not go back to the pool
            raise
        finally:
            self._redis.connection_pool.release(conn)

    def send_steps(self, document: str) -> None:
        """The barrier's steps document (sync and bounded SGD) to its key, and to the trainers
        waiting on its channel."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._keys.steps(self.shard), document)
        pipe.publish(self._keys.steps_written(self.shard), document)
        pipe.execute()

    def _applied_command(self, applied: dict[str, int]) -> bytes:
        return resp.command(b"SET", self._keys.applied(self.shard).encode(), _applied_json(applied))

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
                            b"%d" % ROUNDS_KEPT, stream_id(self._major, self._round), _ROUNDS_FIELD, entry)

    def publish(self, state: ShardState, changes: Changes) -> int:
        """Write the changed rows, to their keys too, and blocks, then bump the version.
        Returns the new version."""
        return self.send(self.snapshot(state, changes, flush=True))

    def publish_all(self, state: ShardState) -> int:
        """Everything this shard holds (after a restart or a flushed Redis)."""
        return self.send(self.snapshot(state, self.everything(state), reset=True), reset=True)

    @staticmethod
    def everything(state: ShardState) -> Changes:
        return Changes(rows={name: t.ids[: t.size] for name, t in state.tables.items()},
                       blocks=set(state.dense))

    def unpublish_rows(self, table: str, ids: np.ndarray) -> None:
        keys = self._keys.rows(table, ids)
        for i in range(0, len(keys), _CHUNK):
            self._redis.unlink(*keys[i:i + _CHUNK])

    def unpublish_blocks(self, blocks: Iterable[tuple[str, int]]) -> None:
        keys = [self._keys.dense(p, b) for p, b in blocks]
        if keys:
            self._redis.unlink(*keys)

    def published(self) -> bool:
        return bool(self._redis.exists(self._keys.version(self.shard)))


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


@dataclass(frozen=True)
class Pulled:
    values: np.ndarray  # (n, dim) float32
    versions: dict[int, int]  # shard -> version read


@dataclass(frozen=True)
class Pull:
    """What one `ParamClient.pull` read, all at one instant (a Redis transaction)."""

    rows: dict[str, np.ndarray]  # table -> (n, dim) values
    blocks: dict[tuple[str, int], np.ndarray]  # blocks found; one never trained is absent
    versions: dict[int, int]  # shard -> version
    applied: dict[int, dict[str, int]]  # shard -> {trainer id: newest step its values include}
    rounds: dict[int, list[Round]]  # shard -> its rounds after the positions asked for, oldest first
    flushed: dict[int, Flushed | None]  # shard -> its last flush, of the shards whose rounds were read


# A rounds-stream entry: its stream id, and the round (None: it did not decode).
Round = tuple[bytes, PublishedRound | None]


class ParamClient:
    """Pulls rows and blocks for trainers and online inference, one round trip per call."""

    def __init__(self, client: redis.Redis, job: str, slot_map: SlotMap, init_scale: float = 0.01) -> None:
        self._redis = client
        self._keys = RedisKeys(job)
        self.slot_map = slot_map
        self.init_scale = init_scale
        self._block_shards: dict[tuple[str, int], int] = {}  # a model's blocks, pulled again and again
        # The last value of each block pulled, by its bytes: a block changes only when its
        # shard applies a push, so most pulls return the bytes of the pull before.
        self._block_values: dict[tuple[str, int], tuple[bytes, np.ndarray]] = {}

    def _block_shard(self, block: tuple[str, int]) -> int:
        shard = self._block_shards.get(block)
        if shard is None:
            shard = self._block_shards[block] = self.slot_map.shard_of_block(*block)
        return shard

    def pull_rows(self, table: str, ids: np.ndarray, dim: int) -> Pulled:
        """Rows for `ids` (distinct or not); rows never trained come back as their initial
        values, exactly as the owning shard would create them.

        Raises:
            ParamsUnavailableError: an owning shard has no version in Redis.
        """
        pull = self.pull({table: (ids, dim)}, [])
        return Pulled(pull.rows[table], pull.versions)

    def pull_blocks(self, blocks: Iterable[tuple[str, int]]) -> tuple[dict[tuple[str, int], np.ndarray], dict[int, int]]:
        """Dense blocks by (param, block); a block never trained is absent from the result."""
        pull = self.pull({}, list(blocks))
        return pull.blocks, pull.versions

    def pull(self, rows: Mapping[str, tuple[np.ndarray, int]], blocks: Sequence[tuple[str, int]]) -> Pull:
        """Rows of several tables ({table: (ids, dim)}) and dense blocks in one round trip,
        as `pull_rows` and `pull_blocks` read them, with the owning shards' versions and
        applied steps."""
        return self.send_pull(rows, blocks).result()

    def applied(self) -> dict[int, dict[str, int]]:
        """Every shard's `RedisKeys.applied`: {shard: {trainer id: newest step published}}."""
        raw = self._redis.mget([self._keys.applied(s) for s in range(self.slot_map.shards)])
        return {s: json.loads(v) if v else {} for s, v in enumerate(raw)}

    def flushed(self, shards: Iterable[int]) -> dict[int, Flushed | None]:
        """Each shard's last flush (None: it has not published)."""
        shards = list(shards)
        raw = self._redis.mget([self._keys.flushed(s) for s in shards]) if shards else []
        return {s: _flushed(v) for s, v in zip(shards, raw)}

    def _rounds(self, after: Mapping[int, bytes], reply) -> dict[int, list[Round]]:
        by_key = {self._keys.rounds(s).encode(): s for s in after}
        out: dict[int, list[Round]] = {}
        if isinstance(reply, dict):  # how the reply reads inside a transaction
            reply = reply.items()
        for key, entries in reply or []:
            out[by_key[key]] = [_round(at, fields) for at, fields in entries]
        return out

    def send_pull(self, rows: Mapping[str, tuple[np.ndarray, int]], blocks: Sequence[tuple[str, int]],
                  row_shards: Mapping[str, np.ndarray] | None = None,
                  rounds: Mapping[int, bytes] | None = None, rounds_count: int = 128) -> PendingPull:
        """Send `pull`'s requests now and read the replies later (`PendingPull.result`): the
        caller computes while Redis answers, without a thread to hand the work over.
        `row_shards`: per table, each id's `SlotMap.shard_of_rows`, if the caller has them.
        `rounds`: also read the shards' rounds after these stream ids ({shard: id}), at most
        `rounds_count` each, in the same transaction (`Pull.rounds`)."""
        rows = {table: (np.asarray(ids, dtype=np.uint64), dim) for table, (ids, dim) in rows.items()}
        shards = set()
        for table, (ids, _) in rows.items():
            owners = row_shards.get(table) if row_shards is not None else None
            if owners is None:
                owners = self.slot_map.shard_of_rows(table, ids)
            shards.update(np.flatnonzero(np.bincount(owners)).tolist())
        shards.update(map(self._block_shard, blocks))
        shards = sorted(shards)
        pool = self._redis.connection_pool
        conn = pool.get_connection()
        try:
            # In a transaction: the values and the applied steps that describe them are read
            # at one instant (a publish lands before or after, never in between).
            packed = conn.pack_command("MULTI")
            # An empty MGET is a syntax error: a placeholder key keeps one reply per request.
            packed += conn.pack_command("MGET", *([self._keys.version(s) for s in shards]
                                                  + [self._keys.applied(s) for s in shards]
                                                  + [self._keys.flushed(s) for s in rounds or ()] or ["-"]))
            if blocks:
                packed += conn.pack_command("MGET", *[self._keys.dense(p, b) for p, b in blocks])
            for table, (ids, _) in rows.items():
                packed.append(resp.mget(self._keys.row(table, 0)[:-1].encode(), ids) if len(ids)
                              else b"".join(conn.pack_command("MGET", "-")))
            if rounds:
                packed += conn.pack_command("XREAD", "COUNT", rounds_count, "STREAMS",
                                            *[self._keys.rounds(s) for s in rounds], *rounds.values())
            packed += conn.pack_command("EXEC")
            # One write: redis-py writes each piece with its own sendall.
            conn.send_packed_command([b"".join(packed)])
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return PendingPull(self, pool, conn, shards, rows, list(blocks), dict(rounds or {}))

    def _decode(self, shards: list[int], rows: dict[str, tuple[np.ndarray, int]], blocks: list[tuple[str, int]],
                rounds: dict[int, bytes], replies: list) -> Pull:
        versions = self._versions(shards, replies[0][:len(shards)])
        applied = {s: json.loads(raw) if raw else {} for s, raw in zip(shards, replies[0][len(shards):2 * len(shards)])}
        flushed = {s: _flushed(raw) for s, raw in zip(rounds, replies[0][2 * len(shards):])}
        found = {}
        if blocks:
            for key, raw in zip(blocks, replies[1]):
                if raw is not None:
                    last = self._block_values.get(key)
                    if last is None or last[0] != raw:
                        last = self._block_values[key] = (raw, ParamBlock.from_bytes(raw).values)
                    found[key] = last[1]
        values = {}
        for (table, (ids, dim)), raw in zip(rows.items(), replies[1 + bool(blocks):]):
            got, present = decode_rows(raw if len(ids) else [], dim)
            if not present.all():
                got[~present] = initial_rows(table, ids[~present], dim, self.init_scale)
            values[table] = got
        return Pull(values, found, versions, applied, self._rounds(rounds, replies[-1]) if rounds else {}, flushed)

    @staticmethod
    def _versions(shards: list[int], raw: list[bytes | None]) -> dict[int, int]:
        missing = [s for s, v in zip(shards, raw) if v is None]
        if missing:
            raise ParamsUnavailableError(missing)
        return {s: int(v) for s, v in zip(shards, raw)}


class ChannelWatch:
    """The newest message of each of some pub/sub channels, waited for on a connection of
    their own: a waiter sleeps until Redis pushes one instead of polling keys."""

    def __init__(self, client: redis.Redis, channels: Mapping[str, int]) -> None:
        self._redis = client
        self._channels = {name.encode(): index for name, index in channels.items()}
        self._pubsub = None

    def subscribe(self) -> None:
        """Start listening (a caller that reads the keys after this misses no change)."""
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub()
            self._pubsub.subscribe(*self._channels)

    def wait(self, timeout_s: float) -> dict[int, bytes]:
        """{channel index: newest message} of those received, waiting up to `timeout_s` for
        the first. Empty when none came, or the connection failed (then it subscribes again
        on the next call): messages sent meanwhile are lost, so an empty answer means "read
        the keys"."""
        out: dict[int, bytes] = {}
        try:
            self.subscribe()
            # Raw replies off the subscribed connection: get_message's dispatch and retry
            # layers cost more than the rest of the wait.
            conn = self._pubsub.connection
            wait = timeout_s
            while conn.can_read(timeout=wait):
                reply = conn.read_response(push_request=True)  # RESP3: messages are pushes
                if reply[0] == b"message" and reply[1] in self._channels:
                    out[self._channels[reply[1]]] = reply[2]
                wait = 0
        except redis.RedisError:
            self.close()
        return out

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            finally:
                self._pubsub = None


class AppliedWatch:
    """One trainer's steps as the shards' publish rounds carry them (`RedisKeys.published`,
    pub/sub), so a trainer waiting for its pushes to be published sleeps until one is: a
    message a shard per push, pushed by Redis, so waiting costs no request. Reading the rounds
    streams instead cost the trainer about 250 µs of CPU a wake (rows it reads at its next
    pull anyway), and polling the `applied` keys every millisecond four or five round trips a
    push."""

    def __init__(self, client: redis.Redis, job: str, shards: int, trainer_id: str) -> None:
        self._redis = client
        self._keys = RedisKeys(job)
        self._trainer_id = trainer_id
        self._shards = range(shards)
        self._watch = ChannelWatch(client, {self._keys.published(s, trainer_id): s for s in self._shards})

    def wait(self, timeout_s: float) -> dict[int, dict[str, int]]:
        """{shard: {trainer id: newest step}} of the rounds announced since the last call,
        waiting up to `timeout_s` for one. Messages sent while no one listened are lost
        (before the first call, across a reconnection), so a wait that times out reads the
        shards' `applied` keys instead."""
        heard = self._watch.wait(timeout_s)
        if heard:
            return {shard: {self._trainer_id: int(step)} for shard, step in heard.items()}
        raw = self._redis.mget([self._keys.applied(s) for s in self._shards])
        return {s: json.loads(v) for s, v in zip(self._shards, raw) if v}

    def close(self) -> None:
        self._watch.close()


class PendingPull:
    """A pull on the wire. Its connection stays out of the pool until `result` reads the
    replies or `cancel` drops them (a half-read reply stream must never be reused)."""

    def __init__(self, client: ParamClient, pool: redis.ConnectionPool, conn, shards: list[int],
                 rows: dict[str, tuple[np.ndarray, int]], blocks: list[tuple[str, int]],
                 rounds: dict[int, bytes]) -> None:
        self._client = client
        self._pool = pool
        self._conn = conn
        self._shards = shards
        self._rows = rows
        self._blocks = blocks
        self._rounds = rounds

    def result(self) -> Pull:
        """As `ParamClient.pull`. Raises ParamsUnavailableError like it."""
        conn, self._conn = self._conn, None
        if conn is None:
            raise RuntimeError("this pull was already read or cancelled")
        try:
            # MULTI's OK, a QUEUED per command, then EXEC's array of the replies.
            for _ in range(2 + len(self._rows) + bool(self._blocks) + bool(self._rounds)):
                conn.read_response()
            replies = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._pool.release(conn)
        return self._client._decode(self._shards, self._rows, self._blocks, self._rounds, replies)

    def cancel(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            self._pool.release(conn)


def _flushed(raw: bytes | None) -> Flushed | None:
    """A flush mark as read; one that does not parse counts as none (the shard's next flush
    writes a good one)."""
    try:
        return None if raw is None else Flushed.from_bytes(raw)
    except (ValueError, IndexError):
        return None


def _round(at: bytes, fields: dict | list) -> Round:
    """A rounds-stream entry as (id, round); an entry that does not decode is kept as None,
    which its reader treats as a missing round."""
    if isinstance(fields, list):  # a reply not parsed into a dict (inside MULTI)
        fields = dict(zip(fields[::2], fields[1::2]))
    raw = fields.get(_ROUNDS_FIELD)
    try:
        return at, None if raw is None else PublishedRound.from_bytes(raw)
    except SchemaError:
        return at, None
