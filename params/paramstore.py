"""Parameters in Redis: what a shard publishes there (pserver/redis_rounds.py) and `ParamClient`,
which pulls them for trainers and online inference.

Keys (schemas.RedisKeys): one value per sparse row (`st:{<job>:<shard>}:row:<table>:<id>`), two per dense
block (`st:{<job>:<shard>}:dense:<param>:<block>`, as trained, and `...:served:<param>:<block>`, as
scored: `train.average_steps`), and a version counter per shard
(`st:{<job>:<shard>}:version`) bumped after each publish. Every value is written by a single SET
inside a pipeline, so a reader sees a row or block either before or after an update, never
half of it. Redis is a cache: a shard republishes everything when its version key is gone
(FLUSHALL, a restarted Redis), and a reader that finds a shard's version missing is told to
retry rather than handed initial values.

Each round is appended, rows and values in one `PublishedRound`, to the shard's rounds stream
(`st:{<job>:<shard>}:rounds`, the newest `ROUNDS_KEPT` or so), and the dense blocks are written
at once. The row keys are written less often: a flush every so often
(`pserver.redis_rounds.flush_due`) writes the rows changed since the last one, each once, and
marks its round in `st:{<job>:<shard>}:flushed`. A trainer follows the streams from a
flush on (trainer/replica.py): it holds every row a round changed since, so the keys it reads
are rows no round has changed since the flush, whose keys are current. Readers of the keys
alone (`streamtrain predict`, online inference) see rows up to a flush interval old.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import redis

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params import resp
from streamtrain.params.redisnodes import Client, ShardNodes, moved
from streamtrain.params.rows import initial_rows, row_view
from streamtrain.schemas import (
    AppliedSteps,
    FlushMark,
    ParamBlock,
    PublishedRound,
    RedisKeys,
    SchemaError,
    StreamtrainError,
    decode_rows,
)

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
    # block -> the steps of the update rule its values include (`ParamBlock.version`), of the blocks found
    block_versions: dict[tuple[str, int], int] = field(default_factory=dict)


# A rounds-stream entry: its stream id, and the round (None: it did not decode).
Round = tuple[bytes, PublishedRound | None]


class ParamClient:
    """Pulls rows and blocks for trainers and online inference, one round trip per call."""

    def __init__(self, client: Client, job: str, slot_map: SlotMap, init_scale: float = 0.01,
                 served: bool = False) -> None:
        """`client`: a single Redis's or a Redis Cluster's (params/redisnodes.py). `served`:
        dense blocks as scored (`RedisKeys.served`, for inference), not as trained."""
        self.nodes = ShardNodes(client, job)
        self._keys = RedisKeys(job)
        self._block_key = self._keys.served if served else self._keys.dense
        self.slot_map = slot_map
        self.init_scale = init_scale
        self._block_shards: dict[tuple[str, int], int] = {}  # a model's blocks, pulled again and again
        # The last value of each block pulled, by its bytes: a block changes only when its
        # shard applies a push, so most pulls return the bytes of the pull before.
        self._block_values: dict[tuple[str, int], tuple[bytes, np.ndarray, int]] = {}
        # Keys a pull names every time, made once.
        self._keys_of: dict[int, _ShardKeys] = {}
        self._dense_keys: dict[tuple[int, tuple[str, int]], bytes] = {}
        # A connection per node kept between pulls: the pool's checkout checks each one for
        # unread data and counts it, a cost at every pull, which comes every mini-batch. One
        # that went bad meanwhile (a restarted Redis) fails its pull, which is retried.
        self._idle: dict[int, tuple[redis.ConnectionPool, redis.Connection]] = {}

    def _checkout(self, pool: redis.ConnectionPool):
        kept = self._idle.pop(id(pool), None)  # the pool is held there: its id is not reused
        return pool.get_connection() if kept is None else kept[1]

    def _checkin(self, pool: redis.ConnectionPool, conn) -> None:
        kept = self._idle.setdefault(id(pool), (pool, conn))
        if kept[1] is not conn:
            pool.release(conn)

    def _forget_idle(self) -> None:
        """A node moved or went away: the connections kept for its old pools go back."""
        idle, self._idle = self._idle, {}
        for pool, conn in idle.values():
            conn.disconnect()
            pool.release(conn)

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

    def pull_blocks(self,
                    blocks: Iterable[tuple[str, int]]) -> tuple[dict[tuple[str, int], np.ndarray], dict[int, int]]:
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
        raw = self.nodes.get_each({s: self._keys.applied(s) for s in range(self.slot_map.shards)})
        return {s: AppliedSteps.from_json(v).steps if v else {} for s, v in raw.items()}

    def flushed(self, shards: Iterable[int]) -> dict[int, FlushMark | None]:
        """Each shard's last flush (None: it has not published)."""
        raw = self.nodes.get_each({s: self._keys.flushed(s) for s in shards})
        return {s: flush_mark(v) for s, v in raw.items()}

    def _rounds(self, after: Mapping[int, bytes], reply) -> dict[int, list[Round]]:
        by_key = {self._shard_keys(s).rounds: s for s in after}
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
        `rounds_count` each, in the same transaction (`Pull.rounds`).

        Each shard's part is one transaction (its keys share a slot), so its values and the
        applied steps that describe them are read at one instant: a publish lands before or
        after, never in between. The transactions of the shards a node holds go to it in one
        write; a single Redis is one node."""
        rows = {table: (np.asarray(ids, dtype=np.uint64), dim) for table, (ids, dim) in rows.items()}
        plans: dict[int, _ShardRead] = {}

        def plan(shard: int) -> _ShardRead:
            found = plans.get(shard)
            if found is None:
                found = plans[shard] = _ShardRead(shard)
            return found

        for table, (ids, _) in rows.items():
            owners = row_shards.get(table) if row_shards is not None else None
            if owners is None:
                owners = self.slot_map.shard_of_rows(table, ids)
            owners = np.asarray(owners)
            present = np.flatnonzero(np.bincount(owners)).tolist() if len(owners) else []
            if len(present) == 1:
                plan(present[0]).rows.append((table, slice(None)))
            else:
                for shard in present:
                    plan(shard).rows.append((table, np.flatnonzero(owners == shard)))
        for i, block in enumerate(blocks):
            plan(self._block_shard(block)).blocks.append(i)
        for shard in plans:
            plans[shard].values = True
        for shard in rounds or ():
            plan(shard).rounds = True
        return PendingPull(self, rows, list(blocks), dict(rounds or {}), rounds_count,
                           [plans[s] for s in sorted(plans)])

    def _request(self, read: _ShardRead, rows: dict[str, tuple[np.ndarray, int]], blocks: list[tuple[str, int]],
                 rounds: dict[int, bytes], rounds_count: int) -> tuple[bytes, int]:
        """One shard's transaction in RESP, and how many commands it queues."""
        shard = read.shard
        keys = self._shard_keys(shard)
        head = ([keys.version, keys.applied] if read.values else []) + ([keys.flushed] if read.rounds else [])
        packed = [b"*1\r\n$5\r\nMULTI\r\n", resp.command(b"MGET", *head)]
        if read.blocks:
            packed.append(resp.command(b"MGET", *[self._dense_key(shard, blocks[i]) for i in read.blocks]))
        for table, at in read.rows:
            packed.append(resp.mget(keys.row_prefix(table), rows[table][0][at]))
        if read.rounds:
            packed.append(resp.command(b"XREAD", b"COUNT", b"%d" % rounds_count, b"STREAMS", keys.rounds,
                                       rounds[shard]))
        packed.append(b"*1\r\n$4\r\nEXEC\r\n")
        return b"".join(packed), 1 + bool(read.blocks) + len(read.rows) + read.rounds

    def _shard_keys(self, shard: int) -> _ShardKeys:
        found = self._keys_of.get(shard)
        if found is None:
            found = self._keys_of[shard] = _ShardKeys(self._keys, shard)
        return found

    def _dense_key(self, shard: int, block: tuple[str, int]) -> bytes:
        key = self._dense_keys.get((shard, block))
        if key is None:
            key = self._dense_keys[(shard, block)] = self._block_key(shard, *block).encode()
        return key

    def _decode(self, rows: dict[str, tuple[np.ndarray, int]], blocks: list[tuple[str, int]],
                reads: list[_ShardRead], replies: list[list]) -> Pull:
        shards = [r.shard for r in reads if r.values]
        versions = self._versions(shards, [reply[0][0] for r, reply in zip(reads, replies) if r.values])
        applied: dict[int, dict[str, int]] = {}
        flushed: dict[int, FlushMark | None] = {}
        got_rounds: dict[int, list[Round]] = {}
        found: dict[tuple[str, int], np.ndarray] = {}
        block_versions: dict[tuple[str, int], int] = {}
        values = {table: np.empty((len(ids), dim), dtype=np.float32) for table, (ids, dim) in rows.items()}
        present = {table: np.zeros(len(ids), dtype=bool) for table, (ids, _) in rows.items()}
        for read, reply in zip(reads, replies):
            head, at = reply[0], 1
            if read.values:
                applied[read.shard] = AppliedSteps.from_json(head[1]).steps if head[1] else {}
            if read.rounds:
                flushed[read.shard] = flush_mark(head[-1])
            if read.blocks:
                for i, raw in zip(read.blocks, reply[at]):
                    if raw is not None:
                        key = blocks[i]
                        last = self._block_values.get(key)
                        if last is None or last[0] != raw:
                            block = ParamBlock.from_bytes(raw)
                            last = self._block_values[key] = (raw, block.values, block.version)
                        found[key] = last[1]
                        block_versions[key] = last[2]
                at += 1
            for table, where in read.rows:
                got, ok = decode_rows(reply[at], rows[table][1])
                if isinstance(where, slice):
                    values[table][where] = got
                else:  # whole rows by put: indexing rows with an array copied at half the speed
                    np.put(row_view(values[table]), where, row_view(got))
                present[table][where] = ok
                at += 1
            if read.rounds:
                got_rounds.update(self._rounds({read.shard: b""}, reply[at]))
        for table, (ids, dim) in rows.items():
            missing = np.flatnonzero(~present[table])
            if len(missing):
                np.put(row_view(values[table]), missing,
                       row_view(initial_rows(table, ids.take(missing), dim, self.init_scale)))
        return Pull(values, found, versions, applied, got_rounds, flushed, block_versions)

    @staticmethod
    def _versions(shards: list[int], raw: list[bytes | None]) -> dict[int, int]:
        missing = [s for s, v in zip(shards, raw) if v is None]
        if missing:
            raise ParamsUnavailableError(missing)
        return {s: int(v) for s, v in zip(shards, raw) if v is not None}  # every one (`missing`)


class _ShardKeys:
    """A shard's keys that every pull names, as bytes."""

    def __init__(self, keys: RedisKeys, shard: int) -> None:
        self._keys, self._shard = keys, shard
        self.version = keys.version(shard).encode()
        self.applied = keys.applied(shard).encode()
        self.flushed = keys.flushed(shard).encode()
        self.rounds = keys.rounds(shard).encode()
        self._row_prefixes: dict[str, bytes] = {}

    def row_prefix(self, table: str) -> bytes:
        prefix = self._row_prefixes.get(table)
        if prefix is None:
            prefix = self._row_prefixes[table] = self._keys.row_prefix(self._shard, table).encode()
        return prefix


@dataclass
class _ShardRead:
    """What a pull reads of one shard, in one transaction."""

    shard: int
    values: bool = False  # its version and applied steps (it owns rows or blocks read)
    rows: list[tuple[str, np.ndarray | slice]] = field(default_factory=list)  # table, positions of its ids
    blocks: list[int] = field(default_factory=list)  # positions in the pull's blocks
    rounds: bool = False  # its flush mark and rounds


class PendingPull:
    """A pull on the wire: its transactions written to the nodes holding its shards, the
    replies read by `result`. A connection stays out of its pool until then (and is kept by
    the client for its next pull), or `cancel` (a half-read reply stream must never be reused).

    A node that does not answer, or says a shard's keys moved, makes the pull raise
    ParamsUnavailableError after the cluster's slots are read again, so the caller's retry
    goes to the right node."""

    def __init__(self, client: ParamClient, rows: dict[str, tuple[np.ndarray, int]], blocks: list[tuple[str, int]],
                 rounds: dict[int, bytes], rounds_count: int, reads: list[_ShardRead]) -> None:
        self._client = client
        self._rows = rows
        self._blocks = blocks
        self._reads = reads
        self._sent: list[tuple[redis.ConnectionPool, redis.Connection, list[tuple[_ShardRead, int]]]] = []
        try:
            for node, shards in client.nodes.by_node([r.shard for r in reads]):
                pool = node.connection_pool
                conn = client._checkout(pool)
                self._sent.append((pool, conn, []))
                packed = []
                for read in (r for r in reads if r.shard in shards):
                    request, queued = client._request(read, rows, blocks, rounds, rounds_count)
                    packed.append(request)
                    self._sent[-1][2].append((read, queued))
                # One write a node: redis-py writes each piece with its own sendall.
                conn.send_packed_command([b"".join(packed)])
        except BaseException as exc:
            self._drop()
            raise self._unavailable(exc) from exc

    def result(self) -> Pull:
        """As `ParamClient.pull`. Raises ParamsUnavailableError like it."""
        if not self._sent:
            raise RuntimeError("this pull was already read or cancelled")
        replies: dict[int, list] = {}
        try:
            for _, conn, reads in self._sent:
                for read, queued in reads:
                    # MULTI's OK, a QUEUED per command, then EXEC's array of the replies.
                    for _ in range(1 + queued):
                        conn.read_response()
                    replies[read.shard] = conn.read_response()
        except BaseException as exc:
            self._drop()
            raise self._unavailable(exc) from exc
        for pool, conn, _ in self._sent:
            self._client._checkin(pool, conn)
        self._sent = []
        return self._client._decode(self._rows, self._blocks, self._reads, [replies[r.shard] for r in self._reads])

    def cancel(self) -> None:
        self._drop()

    def _drop(self) -> None:
        for pool, conn, _ in self._sent:
            conn.disconnect()
            pool.release(conn)
        self._sent = []

    def _unavailable(self, exc: BaseException) -> BaseException:
        if isinstance(exc, redis.RedisError) and moved(exc):
            self._client.nodes.forget()
            self._client._forget_idle()
            return ParamsUnavailableError([r.shard for r in self._reads], retry_after=0.2)
        return exc


def flush_mark(raw: bytes | None) -> FlushMark | None:
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
