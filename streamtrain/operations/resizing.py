"""`streamtrain resize --job J --pservers N`: move a running job to N parameter-server shards.

A resize is a rollback to a resharded copy of a fresh checkpoint:

1. The trainers are paused: each finishes its task in hand and claims no other.
2. A job-wide checkpoint X is taken (`request_checkpoint`): with no task in hand, every shard
   has applied the same push groups at its log end, which `regroup` needs (a checkpoint taken
   while trainers train is not such a cut: each shard takes it at its own log end).
3. X is regrouped under the map over N shards that moves the fewest slots (`SlotMap.resized`,
   pserver/resharding.py) and written as checkpoint X' of every shard of the new map, each in
   its own checkpoint store, with X's record of the job's cursors and queues.
4. The slot map, `ps_desired`, the config's `pservers.count` and a `ResizeRecord` at
   `control/resize` change in one etcd transaction, taken only if the map is still the one X
   was cut under. Should the command stop after it, running it again finishes the resize from
   the record.
5. The job rolls back to X' (checkpoints.py `rollback`): the master puts X's
   cursors and queues back (as they are), and every shard of the new map loads its part of X'
   (a shard that joins must be running to do so; one that leaves stops). Resumed, the trainers
   switch to the new map before their next task.

So a resize pauses the trainers for the tasks in hand to finish, a checkpoint and a rollback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamtrain.jobstate import job_checkpoints as cut
from streamtrain.jobstate.etcd import Etcd, mod_revision_is, put_op
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.operations.checkpoints import Paused, request_checkpoint, rollback
from streamtrain.params.optimizers import make_rule
from streamtrain.pserver.resharding import regroup
from streamtrain.pserver.storage import ShardStorage
from streamtrain.schemas import EtcdKeys, ResizeRecord, ShardCheckpoint, StreamtrainError, Topics
from streamtrain.schemas.config import JobConfig


class ResizeError(StreamtrainError, RuntimeError):
    """The resize cannot start, or the slot map changed under it."""


@dataclass(frozen=True)
class Resized:
    shards_before: int
    shards: int
    moved_slots: int
    checkpoint: str | None  # the resharded checkpoint the job rolled back to; None: nothing moved
    took_s: float


def resize(etcd: Etcd, storage: ShardStorage, job: str, shards: int, wait_s: float = 300.0) -> Resized:
    """Move `job` to `shards` shards (see the module docstring). A resize left half done (the
    command stopped after the map changed) is finished first, whatever `shards` says. A job
    that has `shards` shards already is left alone: no pause, no checkpoint.

    Raises:
        ResizeError: no slot map or config, a shard count the slots cannot take, or the map
            changed while the checkpoint was resharded.
        CheckpointError: the checkpoint or the rollback did not complete within `wait_s`.
    """
    started = time.monotonic()
    keys = EtcdKeys(job)
    under_way = etcd.get(keys.control("resize"))
    if under_way is not None:
        record = ResizeRecord.from_json(under_way.value)
        _finish(etcd, job, record, wait_s)
        return Resized(record.shards, record.shards, 0, record.checkpoint, time.monotonic() - started)
    slots_entry, config_entry = etcd.get(keys.slots), etcd.get(keys.config)
    if slots_entry is None or config_entry is None:
        raise ResizeError(f"job {job!r} has no slot map or config in etcd: start its master first")
    old_map = SlotMap.from_json(slots_entry.value)
    if not 1 <= shards <= old_map.slots:
        raise ResizeError(f"job {job!r}: {shards} shards cannot share its {old_map.slots} slots")
    config = JobConfig.from_json(config_entry.value)
    new_map = old_map.resized(shards)
    if new_map is old_map:
        return Resized(shards, shards, 0, None, time.monotonic() - started)
    # Paused first: the checkpoint is then of every shard having applied the same push groups
    # (`regroup` refuses anything else), and nobody pushes by either map until the rollback is
    # done. Still paused if that fails (`_finish` lifts the pause).
    with Paused(etcd, job, wait_s, "resize") as paused:
        taken = request_checkpoint(etcd, job, wait_s).id
        resharded = reshard(config, old_map, new_map, taken, etcd, storage)
        record = ResizeRecord(shards, resharded, time.time())
        paused.resume = False
        changed, _ = etcd.txn([mod_revision_is(keys.slots, slots_entry.mod_revision)], [
            put_op(keys.slots, new_map.to_json()),
            put_op(keys.ps_desired, keys.ps_desired_value(shards)),
            put_op(keys.config, config.with_shards(shards).to_json()),
            put_op(keys.control("resize"), record.to_json())])
        if not changed:
            paused.resume = True
            raise ResizeError(f"job {job!r}: its slot map changed while checkpoint {taken} was resharded")
        _finish(etcd, job, record, wait_s)
    moved = sum(a != b for a, b in zip(old_map.owners, new_map.owners))
    return Resized(old_map.shards, shards, moved, resharded, time.monotonic() - started)


def _finish(etcd: Etcd, job: str, record: ResizeRecord, wait_s: float) -> None:
    """Roll the job back to the resharded checkpoint (the trainers paused); then the resize
    is done and the trainers go on."""
    keys = EtcdKeys(job)
    rollback(etcd, job, record.checkpoint, wait_s)
    etcd.delete_prefix(keys.control("resize"))
    etcd.delete_prefix(keys.control("pause"))


def reshard(config: JobConfig, old_map: SlotMap, new_map: SlotMap, checkpoint_id: str, etcd: Etcd,
            storage: ShardStorage) -> str:
    """Write job-wide checkpoint `checkpoint_id` of the shards of `old_map` again as a new
    one of the shards of `new_map`, registered in etcd with the same job record; returns its id."""
    keys, topics = EtcdKeys(config.name), Topics(config.name)
    rule = make_rule(config.pservers.optimizer, lr=config.train.learning_rate)
    loaded = {i: storage.checkpoint_store(config, i).load(checkpoint_id, rule) for i in range(old_map.shards)}
    states = regroup({i: r.state for i, r in loaded.items()}, old_map, new_map)
    record = etcd.get(keys.checkpoint_job(checkpoint_id))
    if record is None:
        raise ResizeError(f"job {config.name!r}: checkpoint {checkpoint_id} has no job record")
    resharded = cut.new_checkpoint_id()
    for i, state in states.items():
        topic = topics.grad(i)
        # A shard that stays resumes where X did (the rollback then skips what came after);
        # one that joins has a new topic, read from its start.
        offset = loaded[i].manifest.grad_offsets.get(topic, 0) if i in loaded else 0
        store = storage.checkpoint_store(config, i)
        manifest = store.save(state, {topic: offset}, state.dedup.watermarks(), new_map.slots_of(i), resharded,
                              keep_also=(checkpoint_id,), epoch=new_map.epoch)
        etcd.put(keys.checkpoint_shard(resharded, i), ShardCheckpoint(
            i, store.uri, offset, manifest.created_at, manifest.optimizer,
            {name: t.size for name, t in state.tables.items()}).to_json())
    etcd.put(keys.checkpoint_job(resharded), record.value)
    return resharded
