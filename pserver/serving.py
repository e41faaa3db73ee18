"""Parameters in Redis: the shard publishes what changed, `ParamClient` pulls.

Keys (schemas.RedisKeys): one value per sparse row (`st:<job>:row:<table>:<id>`), one per dense
block (`st:<job>:dense:<param>:<block>`), and a version counter per shard
(`st:<job>:version:<shard>`) bumped after each publish. Every value is written by a single SET
inside a pipeline, so a reader sees a row or block either before or after an update, never
half of it. Redis is a cache: a shard republishes everything when its version key is gone
(FLUSHALL, a restarted Redis), and a reader that finds a shard's version missing is told to
retry rather than handed initial values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import redis

from pserver.rows import initial_rows
from pserver.sharding import SlotMap
from pserver.state import Changes, ShardState
from schemas import ParamBlock, RedisKeys, decode_rows, encode_rows

_CHUNK = 8192  # keys per MSET: large enough to amortise, small enough not to stall Redis


class ParamsUnavailableError(RuntimeError):
    """A shard has not published (yet, or since Redis lost its data); retry after `retry_after`."""

    def __init__(self, shards: list[int], retry_after: float = 0.5) -> None:
        super().__init__(f"parameters of shard(s) {shards} are not in Redis yet; retry in {retry_after} s")
        self.shards = shards
        self.retry_after = retry_after


class Publisher:
    def __init__(self, client: redis.Redis, job: str, shard: int) -> None:
        self._redis = client
        self._keys = RedisKeys(job)
        self.shard = shard

    def publish(self, state: ShardState, changes: Changes) -> int:
        """Write the changed rows and blocks, then bump the version. Returns the new version."""
        pipe = self._redis.pipeline(transaction=False)
        for table, ids in changes.rows.items():
            rows = state.tables[table]
            self._queue_rows(pipe, table, ids, rows.values[rows.index.lookup(ids)])
        for param, block in changes.blocks:
            values = state.dense[(param, block)].values[0]
            pipe.set(self._keys.dense(param, block), ParamBlock(param, block, 0, values).to_bytes())
        pipe.incr(self._keys.version(self.shard))
        return int(pipe.execute()[-1])

    def publish_all(self, state: ShardState) -> int:
        """Everything this shard holds (after a restart or a flushed Redis)."""
        changes = Changes(
            rows={name: t.ids[: t.size] for name, t in state.tables.items()},
            blocks=set(state.dense),
        )
        return self.publish(state, changes)

    def published(self) -> bool:
        return bool(self._redis.exists(self._keys.version(self.shard)))

    def _queue_rows(self, pipe, table: str, ids: np.ndarray, values: np.ndarray) -> None:
        keys = self._keys.rows(table, ids)
        payloads = encode_rows(values)
        for i in range(0, len(keys), _CHUNK):
            pipe.mset(dict(zip(keys[i:i + _CHUNK], payloads[i:i + _CHUNK])))


@dataclass(frozen=True)
class Pulled:
    values: np.ndarray  # (n, dim) float32
    versions: dict[int, int]  # shard -> version read


class ParamClient:
    """Pulls rows and blocks for trainers and online inference, one round trip per call."""

    def __init__(self, client: redis.Redis, job: str, slot_map: SlotMap, init_scale: float = 0.01) -> None:
        self._redis = client
        self._keys = RedisKeys(job)
        self.slot_map = slot_map
        self.init_scale = init_scale

    def pull_rows(self, table: str, ids: np.ndarray, dim: int) -> Pulled:
        """Rows for `ids` (distinct or not); rows never trained come back as their initial
        values, exactly as the owning shard would create them.

        Raises:
            ParamsUnavailableError: an owning shard has no version in Redis.
        """
        ids = np.asarray(ids, dtype=np.uint64)
        shards = sorted(set(self.slot_map.shard_of_rows(table, ids).tolist()))
        pipe = self._redis.pipeline(transaction=False)
        pipe.mget([self._keys.version(s) for s in shards] or ["-"])
        pipe.mget(self._keys.rows(table, ids))
        raw_versions, raw_rows = pipe.execute()
        versions = self._versions(shards, raw_versions)
        values, present = decode_rows(raw_rows, dim)
        if not present.all():
            values[~present] = initial_rows(table, ids[~present], dim, self.init_scale)
        return Pulled(values, versions)

    def pull_blocks(self, blocks: Iterable[tuple[str, int]]) -> tuple[dict[tuple[str, int], np.ndarray], dict[int, int]]:
        """Dense blocks by (param, block); a block never trained is absent from the result."""
        blocks = list(blocks)
        shards = sorted({self.slot_map.shard_of_block(p, b) for p, b in blocks})
        pipe = self._redis.pipeline(transaction=False)
        pipe.mget([self._keys.version(s) for s in shards] or ["-"])
        pipe.mget([self._keys.dense(p, b) for p, b in blocks] or ["-"])
        raw_versions, raw_blocks = pipe.execute()
        versions = self._versions(shards, raw_versions)
        found = {}
        for key, raw in zip(blocks, raw_blocks):
            if raw is not None:
                found[key] = ParamBlock.from_bytes(raw).values
        return found, versions

    @staticmethod
    def _versions(shards: list[int], raw: list[bytes | None]) -> dict[int, int]:
        missing = [s for s, v in zip(shards, raw) if v is None]
        if missing:
            raise ParamsUnavailableError(missing)
        return {s: int(v) for s, v in zip(shards, raw)}
