"""A shard's checkpoints as the job sees them: each written to the store (checkpoint_store.py) and
registered in etcd as `checkpoints/<id>/<i>` (`ShardCheckpoint`), the registrations of pruned
ones deleted, the job's newest rollback target never pruned, and which requested checkpoints
this process has taken (the decision: decisions.py)."""

from __future__ import annotations

import logging
import time

from prometheus_client import Histogram

from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.pserver.checkpoint_store import CheckpointStore
from streamtrain.pserver.decisions import checkpoint_to_take
from streamtrain.pserver.state import ShardState
from streamtrain.schemas import CheckpointRequest, EtcdKeys, LatestCheckpoint, SchemaError, ShardCheckpoint

log = logging.getLogger(__name__)


class CheckpointKeeper:
    def __init__(self, store: CheckpointStore, etcd: Etcd, keys: EtcdKeys, index: int, slot_map: SlotMap,
                 seconds: Histogram) -> None:
        self.store, self.etcd, self.keys = store, etcd, keys
        self.index, self.seconds = index, seconds
        self.follow(slot_map)
        self.latest: str | None = None  # the checkpoint this shard holds (loaded or taken)
        self.count = 0  # taken by this process
        self._taken: set[str] = set()  # requested ones taken by this process

    def follow(self, slot_map: SlotMap) -> None:
        """Checkpoints from now on are of this shard's slots under `slot_map` (after a resize)."""
        self.slots, self.epoch = slot_map.slots_of(self.index), slot_map.epoch

    def take(self, state: ShardState, offsets: dict[str, int], checkpoint_id: str | None = None,
             keep_also: tuple[str, ...] = (), published: tuple[int, int] = (0, 0)) -> str:
        """Write `state` resuming at `offsets` (gradient topic -> offset) and register it;
        returns its id. `published`: where its changes are in the rounds stream
        (`BackgroundPublisher.position`)."""
        started = time.monotonic()
        manifest = self.store.save(state, offsets, state.dedup.watermarks(), self.slots, checkpoint_id,
                                   keep_also=(*keep_also, *self._rollback_target()), epoch=self.epoch,
                                   published=published)
        self.latest = manifest.checkpoint_id
        self.count += 1
        (resume,) = offsets.values()
        self.etcd.put(self.keys.checkpoint_shard(manifest.checkpoint_id, self.index), ShardCheckpoint(
            self.index, self.store.uri, resume, manifest.created_at, manifest.optimizer,
            {name: t.size for name, t in state.tables.items()}).to_json())
        self._forget_pruned()
        self.seconds.observe(time.monotonic() - started)
        log.info("shard %d: checkpoint %s at offset %d in %.2f s", self.index, manifest.checkpoint_id,
                 resume, time.monotonic() - started)
        return manifest.checkpoint_id

    def wanted(self, request: CheckpointRequest) -> str | None:
        """The id of the checkpoint `request` asks this shard to take, if any is left to take."""
        registered = request.id is not None and \
            self.etcd.get(self.keys.checkpoint_shard(request.id, self.index)) is not None
        return checkpoint_to_take(request, taken=self._taken, kept=self.store.complete_ids(), registered=registered)

    def taken(self, checkpoint_id: str) -> None:
        """A requested checkpoint is taken: it is never taken again by this process."""
        self._taken.add(checkpoint_id)

    def _rollback_target(self) -> tuple[str, ...]:
        """The job's newest job-wide checkpoint (`checkpoints/latest`): periodic checkpoints
        must not prune what `rollback --to latest` returns to."""
        entry = self.etcd.get(self.keys.checkpoints_latest)
        try:
            return (LatestCheckpoint.from_json(entry.value).id,) if entry is not None else ()
        except SchemaError:
            return ()

    def _forget_pruned(self) -> None:
        kept = set(self.store.complete_ids())
        for entry in self.etcd.range(self.keys.checkpoints_prefix, keys_only=True):
            parts = self.keys.checkpoint_path(entry.key)
            if len(parts) == 2 and parts[1] == str(self.index) and parts[0] not in kept:
                self.etcd.delete_prefix(entry.key)
