"""Where each shard's keys live: the one Redis, or the node of a Redis Cluster that holds the
shard's hash-tag slot (schemas.RedisKeys puts every key of a shard in one slot).

Pulls and publishes write their commands straight onto a node's connection, laid out in
bulk (params/resp.py), so they need that node's client, not a cluster client that routes
command by command. A node that moved or died (MOVED, ASK, a failover, a refused connection)
is found again with `forget`: the next `node` reads the cluster's slots afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis
from redis.cluster import RedisCluster

from streamtrain.schemas import RedisKeys

Client = redis.Redis | RedisCluster

# What a command meets while a cluster moves a slot or fails over: worth a new look at the
# slots and another try (not the caller's or the data's fault).
NODE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
               redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
               redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)


def moved(exc: BaseException) -> bool:
    """Whether `exc` (or a reply inside a transaction's) says a key is served elsewhere."""
    return isinstance(exc, NODE_ERRORS) or (
        isinstance(exc, redis.ResponseError) and str(exc).split(" ", 1)[0] in ("MOVED", "ASK", "CLUSTERDOWN",
                                                                              "TRYAGAIN", "EXECABORT"))


class ShardNodes:
    """The node client of each shard of a job."""

    def __init__(self, client: Client, job: str) -> None:
        self.client = client
        self.keys = RedisKeys(job)
        self.cluster = isinstance(client, RedisCluster)
        self._nodes: dict[int, redis.Redis] = {}

    def node(self, shard: int) -> redis.Redis:
        """The client of the node holding `shard`'s keys (the one client of a single Redis)."""
        if not isinstance(self.client, RedisCluster):  # not self.cluster
            return self.client
        node = self._nodes.get(shard)
        if node is None:
            where = self.client.get_node_from_key(self.keys.version(shard))
            node = self._nodes[shard] = self.client.get_redis_connection(where)
        return node

    def by_node(self, shards: Iterable[int]) -> list[tuple[redis.Redis, list[int]]]:
        """`shards` grouped by the node holding them, in their order within each group."""
        groups: dict[int, tuple[redis.Redis, list[int]]] = {}
        for shard in shards:
            node = self.node(shard)
            groups.setdefault(id(node), (node, []))[1].append(shard)
        return list(groups.values())

    def forget(self) -> None:
        """A node moved or went away: read the cluster's slots again before the next use."""
        if isinstance(self.client, RedisCluster):  # self.cluster
            self._nodes.clear()
            try:
                self.client.nodes_manager.initialize()
            except redis.RedisError:
                pass  # the next `node` tries again

    def get_each(self, keys: Mapping[int, str]) -> dict[int, bytes | None]:
        """{shard: the value of its key}: one MGET on a single Redis; on a cluster a GET per
        key, pipelined per node (keys of different slots cannot share a command)."""
        if not keys:
            return {}
        if not self.cluster:
            # The stubs type replies str | bytes whatever the client's decode_responses; ours are bytes.
            return dict(zip(keys, self.client.mget(list(keys.values()))))  # type: ignore[arg-type]
        out: dict[int, bytes | None] = {}
        try:
            for node, shards in self.by_node(keys):
                pipe = node.pipeline(transaction=False)
                for shard in shards:
                    pipe.get(keys[shard])
                out.update(zip(shards, pipe.execute()))
        except redis.RedisError as exc:
            if moved(exc):
                self.forget()
            raise
        return out
