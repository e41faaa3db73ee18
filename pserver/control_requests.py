"""Carrying out the control plane's requests for one shard: a checkpoint under the master's id
(`control/checkpoint`) and a rollback (`control/rollback`). The decisions are in decisions.py;
the shard (shard.py) lends what a request needs through `Controlled`."""

from __future__ import annotations

import logging
import time
from typing import Literal, Protocol

from streamtrain.jobstate.errors import CoordinationError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.job_checkpoints import new_checkpoint_id
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.pserver.checkpoint_registry import CheckpointKeeper
from streamtrain.pserver.checkpoint_store import CheckpointStore
from streamtrain.pserver.decisions import rolled_back_id
from streamtrain.pserver.state import ShardState
from streamtrain.schemas import CheckpointRequest, EtcdKeys, RollbackAck, RollbackRequest, SchemaError

log = logging.getLogger(__name__)

Done = Literal["checkpoint", "rollback", "leave"] | None


class Controlled(Protocol):
    """What a request needs of the shard it runs in."""

    state: ShardState

    def catch_up(self) -> None:
        """Apply every delta written to the gradient topic before now."""

    def checkpoint(self, checkpoint_id: str | None = None, keep_also: tuple[str, ...] = ()) -> str:
        """Checkpoint the state at the offset everything before which is applied."""

    def adopt(self, state: ShardState) -> int:
        """Serve `state` instead (republished), skipping every delta written so far; returns
        the offset the skipping ends at."""


class ShardController:
    def __init__(self, etcd: Etcd, keys: EtcdKeys, index: int, store: CheckpointStore,
                 checkpoints: CheckpointKeeper, shard: Controlled) -> None:
        self.etcd, self.keys, self.index = etcd, keys, index
        self.store, self.checkpoints, self.shard = store, checkpoints, shard

    def poll(self) -> Done:
        """Read the requests and carry out the one there is, if any; a rollback first: no
        checkpoint meanwhile, since one requested before the rollback would pair its job record
        with parameters of the abandoned timeline (the request is withdrawn anyway)."""
        checkpoint, rollback, slots = self.etcd.ranges([self.keys.control("checkpoint"),
                                                        self.keys.control("rollback"), self.keys.slots])
        if slots and self.index >= SlotMap.from_json(slots[0].value).shards:
            return "leave"  # resized below this shard: its slots are others' now
        if rollback:
            return "rollback" if self._roll_back(rollback[0].value) else None
        if not checkpoint:
            return None
        try:
            request = CheckpointRequest.from_json(checkpoint[0].value)
        except SchemaError as exc:
            log.warning("shard %d: ignoring %s", self.index, exc)
            return None
        wanted = self.checkpoints.wanted(request)
        if wanted is None:
            return None
        # Everything written before the request is seen: that is every delta of every task
        # the checkpoint's job record calls done (jobstate/job_checkpoints.py).
        self.shard.catch_up()
        self.shard.checkpoint(wanted)
        self.checkpoints.taken(wanted)
        return "checkpoint"

    def _roll_back(self, request: bytes) -> bool:
        """Load checkpoint `to` and skip the gradients committed since (the tasks they came
        from are requeued by the master and trained again), then republish: rows this shard
        created after the checkpoint are deleted from Redis, the rest overwritten.

        Durable before acknowledged: the checkpoints newer than `to` are retired, and the
        rolled-back state is checkpointed at the offset the skipping starts from, so a restart
        loads it rather than the abandoned timeline, and does not replay the abandoned deltas
        either. A shard that dies before acknowledging rolls back again when it is back (the
        trainers stay paused until every shard has acknowledged, so the log end is the same)."""
        try:
            doc = RollbackRequest.from_json(request)
        except SchemaError as exc:
            log.warning("shard %d: ignoring %s", self.index, exc)
            return False
        if doc.phase != "shards":
            return False
        to, ack = doc.to, self.keys.checkpoint_rolled_back(doc.to, self.index)
        if self.etcd.get(ack) is not None:
            return False
        # The slots this shard owns now: a rollback after a resize (streamtrain/operations/resizing.py)
        # loads a checkpoint of the new map.
        slots = self.etcd.get(self.keys.slots)
        if slots is None:  # as the shard's start-up refuses it (PserverShard._assemble)
            raise CoordinationError(f"job {self.keys.job!r} has no slot map in etcd")
        self.checkpoints.follow(SlotMap.from_json(slots.value))
        end = self.shard.adopt(self.store.load(to, self.shard.state.rule, self.checkpoints.slots).state)
        retired = self.store.retire_after(to)
        # Never pruning `to`, which checkpoints/latest may not name yet.
        self.shard.checkpoint(rolled_back_id(to, new_checkpoint_id()), keep_also=(to,))
        log.info("shard %d: retired %d checkpoints newer than %s", self.index, len(retired), to)
        self.etcd.put(ack, RollbackAck(self.index, end, time.time()).to_json())
        log.warning("shard %d: rolled back to checkpoint %s; gradients before offset %d skipped",
                    self.index, to, end)
        return True
