"""Waiting for what the pserver shards announce on Redis pub/sub, instead of polling their keys:
`ChannelWatch`, the newest message of some channels, and `AppliedWatch`, a trainer's steps as
the shards publish them (`RedisKeys.published`). A message sent while no one listens is lost,
so a wait that hears nothing means "read the keys" (AppliedWatch reads them itself). The pulls
themselves are paramstore.py's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import redis
from redis.client import PubSub

from streamtrain.params.redisnodes import Client, ShardNodes, moved
from streamtrain.schemas import AppliedSteps, RedisKeys


class ChannelWatch:
    """The newest message of each of some pub/sub channels, waited for on a connection of
    their own: a waiter sleeps until Redis pushes one instead of polling keys. On a Redis
    Cluster it listens at shard 0's node: a PUBLISH reaches the subscribers of every node."""

    def __init__(self, nodes: ShardNodes, channels: Mapping[str, int]) -> None:
        self._nodes = nodes
        self._channels = {name.encode(): index for name, index in channels.items()}
        self._pubsub: PubSub | None = None

    def subscribe(self) -> None:
        """Start listening (a caller that reads the keys after this misses no change)."""
        if self._pubsub is None:
            self._pubsub = self._nodes.node(0).pubsub()
            self._pubsub.subscribe(*self._channels)

    def wait(self, timeout_s: float) -> dict[int, bytes]:
        """{channel index: newest message} of those received, waiting up to `timeout_s` for
        the first. Empty when none came, or the connection failed (then it subscribes again
        on the next call): messages sent meanwhile are lost, so an empty answer means "read
        the keys"."""
        out: dict[int, bytes] = {}
        try:
            self.subscribe()
            assert self._pubsub is not None  # subscribe made it
            # Raw replies off the subscribed connection: get_message's dispatch and retry
            # layers cost more than the rest of the wait.
            conn = self._pubsub.connection
            assert conn is not None  # subscribed: connected
            wait = timeout_s
            while conn.can_read(timeout=wait):
                reply = conn.read_response(push_request=True)  # RESP3: messages are pushes
                if reply[0] == b"message" and reply[1] in self._channels:
                    out[self._channels[reply[1]]] = reply[2]
                wait = 0
        except redis.RedisError as exc:
            self.close()
            if moved(exc):
                self._nodes.forget()
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
    streams instead would cost the trainer CPU at every wake (rows it reads at its next pull
    anyway), and polling the `applied` keys several round trips a push."""

    def __init__(self, client: Client, job: str, shards: int, trainer_id: str) -> None:
        self._nodes = ShardNodes(client, job)
        self._keys = RedisKeys(job)
        self._trainer_id = trainer_id
        self._shards = range(shards)
        self._watch = ChannelWatch(self._nodes, {self._keys.published(s, trainer_id): s for s in self._shards})

    def wait(self, timeout_s: float) -> dict[int, dict[str, int]]:
        """{shard: {trainer id: newest step}} of the rounds announced since the last call,
        waiting up to `timeout_s` for one. Messages sent while no one listened are lost
        (before the first call, across a reconnection), so a wait that times out reads the
        shards' `applied` keys instead."""
        heard = self._watch.wait(timeout_s)
        if heard:
            return {shard: {self._trainer_id: int(step)} for shard, step in heard.items()}
        try:
            raw = self._nodes.get_each({s: self._keys.applied(s) for s in self._shards})
        except redis.RedisError:
            # Redis away, or a cluster's node failing over: nothing heard this time; the
            # caller bounds how long it waits on.
            time.sleep(timeout_s)
            return {}
        return {s: AppliedSteps.from_json(v).steps for s, v in raw.items() if v}

    def close(self) -> None:
        self._watch.close()
