"""What a pserver shard keeps outside etcd and Redis: its gradient log (the topic it replays)
and its checkpoint store (the snapshots it recovers from).

The shard learns the job's config and its own index only once it has registered, so these
parts are made then, by a `ShardStorage` the shard is given or builds from its endpoints (as
the trainer's parts that talk to Kafka are made by its `Broker`, trainer/broker.py). A caller
gives its own to put something else in their place: a checkpoint store that refuses a write,
say, or a gradient log that counts what it hands on.
"""

from __future__ import annotations

from streamtrain.infra import Endpoints
from streamtrain.pserver.checkpoint_store import CheckpointStore
from streamtrain.pserver.gradlog import GradientLog
from streamtrain.schemas.config import JobConfig


class ShardStorage:
    """The job's Kafka at `endpoints` and the checkpoint store the job's config names."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints

    def gradient_log(self, config: JobConfig, shard: int) -> GradientLog:
        """Shard `shard`'s gradient topic (created if missing), not yet positioned: the shard
        starts it at the offset its checkpoint saved."""
        return GradientLog(self.endpoints, config, shard)

    def checkpoint_store(self, config: JobConfig, shard: int) -> CheckpointStore:
        """Shard `shard`'s checkpoints under `pservers.checkpoint_uri`, the newest
        `pservers.keep_checkpoints` kept."""
        uri = config.pservers.checkpoint_uri
        assert uri is not None  # JobConfig fills in the default (schemas/config.py)
        return CheckpointStore(uri, config.name, shard, config.pservers.keep_checkpoints)
