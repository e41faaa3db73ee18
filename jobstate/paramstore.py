"""Parameters in Redis: what a shard publishes there (pserver/publisher.py) and `ParamClient`,
which pulls them for trainers and online inference.

Keys (schemas.RedisKeys): one value per sparse row (`st:<job>:row:<table>:<id>`), one per dense
block (`st:<job>:dense:<param>:<block>`), and a version counter per shard
(`st:<job>:version:<shard>`) bumped after each publish. Every value is written by a single SET
inside a pipeline, so a reader sees a row or block either before or after an update, never
half of it. Redis is a cache: a shard republishes everything when its version key is gone
(FLUSHALL, a restarted Redis), and a reader that finds a shard's version missing is told to
retry rather than handed initial values.

Each round is appended, rows and values in one `PublishedRound`, to the shard's rounds stream
(`st:<job>:rounds:<shard>`, the newest `ROUNDS_KEPT` or so), and the dense blocks are written
at once. The row keys are written less often: a flush every so often
(`pserver.publisher.FLUSH_EVERY_S`) writes the rows changed since the last one, each once, and
marks its round in `st:<job>:flushed:<shard>`. A trainer follows the streams from a
flush on (trainer/replica.py): it holds every row a round changed since, so the keys it reads
are rows no round has changed since the flush, whose keys are current. Readers of the keys
alone (`streamtrain predict`, online inference) see rows up to a flush interval old.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import redis

from streamtrain.jobstate import resp
from streamtrain.jobstate.rows import initial_rows
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.schemas import (AppliedSteps, FlushMark, ParamBlock, PublishedRound, RedisKeys, SchemaError,
                                StreamtrainError, decode_rows)

# Rounds kept in a shard's stream (approximately: trimmed a node at a time). A trainer that
# falls further behind than this drops the shard's rows and reads them again (trainer/replica.py).
ROUNDS_KEPT = 512
ROUNDS_FIELD = b"r"


def stream_id(major: int, round_: int) -> bytes:
    """A round's id in its shard's stream: the epoch's start in ms, and the round number, so
    that a flush can name its round in the same transaction as it appends it."""
    return b"%d-%d" % (major, round_)


class ParamsUnavailableError(StreamtrainError, RuntimeError):
    """A shard has not published (yet, or since Redis lost its data); retry after `retry_after`."""

    def __init__(self, shards: list[int], retry_after: float = 0.5) -> None:
        super().__init__(f"parameters of shard(s) {shards} are not in Redis yet; retry in {retry_after} s")
        self.shards = shards
        self.retry_after = retry_after


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
    flushed: dict[int, FlushMark | None]  # shard -> its last flush, of the shards whose rounds were read


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
        return {s: AppliedSteps.from_json(v).steps if v else {} for s, v in enumerate(raw)}

    def flushed(self, shards: Iterable[int]) -> dict[int, FlushMark | None]:
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
        applied = {s: AppliedSteps.from_json(raw).steps if raw else {}
                   for s, raw in zip(shards, replies[0][len(shards):2 * len(shards)])}
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
        return {s: AppliedSteps.from_json(v).steps for s, v in zip(self._shards, raw) if v}

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


def _flushed(raw: bytes | None) -> FlushMark | None:
    """A flush mark as read; one that does not parse counts as none (the shard's next flush
    writes a good one)."""
    try:
        return None if raw is None else FlushMark.from_bytes(raw)
    except SchemaError:
        return None


def _round(at: bytes, fields: dict | list) -> Round:
    """A rounds-stream entry as (id, round); an entry that does not decode is kept as None,
    which its reader treats as a missing round."""
    if isinstance(fields, list):  # a reply not parsed into a dict (inside MULTI)
        fields = dict(zip(fields[::2], fields[1::2]))
    raw = fields.get(ROUNDS_FIELD)
    try:
        return at, None if raw is None else PublishedRound.from_bytes(raw)
    except SchemaError:
        return at, None
