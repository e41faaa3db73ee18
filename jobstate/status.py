"""A job's state as an operator sees it: queue sizes, lag per partition, members, failures."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.membership import Members, members
from streamtrain.jobstate.offsets import InputOffsets, InputUnavailableError
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.schemas import EtcdKeys, Holder, JobState, PartitionCursor, ResizeRecord, SchemaError, TaskRecord
from streamtrain.schemas.keys import TaskState

STATES: tuple[TaskState, ...] = ("todo", "pending", "done", "failed")


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    pass_no: int
    sliced_to: int  # cursor: next offset not yet in a task
    trained_to: int  # watermark: every offset below is done (or failed)
    end: int | None  # last stable offset now (None if Kafka did not answer)

    @property
    def lag(self) -> int | None:
        return None if self.end is None else self.end - self.trained_to


@dataclass(frozen=True)
class JobStatus:
    job: str
    leader: Holder | None
    state: str
    queues: dict[str, int]
    partitions: list[PartitionLag]
    members: Members
    failed: list[TaskRecord]
    slots: dict[int, int]  # shard -> slots it owns, by the job's slot map (empty: no map yet)
    epoch: int | None  # the slot map's: how many times the job was resized (None: no map yet)
    resizing: ResizeRecord | None  # a resize under way: its new shard count and checkpoint

    def as_dict(self) -> dict:
        doc = asdict(self)
        doc["slots"] = {str(shard): n for shard, n in self.slots.items()}
        doc["failed"] = [json.loads(t.to_json()) for t in self.failed]
        for p, lag in zip(doc["partitions"], self.partitions):
            p["lag"] = lag.lag
        return doc


def job_status(etcd: Etcd, offsets: InputOffsets | None, job: str) -> JobStatus:
    keys = EtcdKeys(job)
    queues: dict[str, int] = {s: etcd.count(keys.tasks(s)) for s in STATES}
    cursors = [PartitionCursor.from_json(e.value) for e in etcd.range(keys.cursors_prefix)]
    ends: dict[tuple[str, int], int] = {}
    if offsets is not None and cursors:
        try:
            bounds = offsets.bounds([(c.topic, c.partition) for c in cursors], earliest=False)
            ends = {p: b.stable_end for p, b in bounds.items()}
        except InputUnavailableError:
            pass
    failed = []
    for entry in etcd.range(keys.tasks("failed")):
        try:
            failed.append(TaskRecord.from_json(entry.value))
        except SchemaError:
            continue
    leader = etcd.get(keys.master_lock)
    state = etcd.get(keys.state)
    mapped, resize = etcd.get(keys.slots), etcd.get(keys.control("resize"))
    slot_map = SlotMap.from_json(mapped.value) if mapped else None
    return JobStatus(
        job=job,
        leader=Holder.from_json(leader.value) if leader else None,
        state=JobState.from_json(state.value).state if state else "running",
        queues=queues,
        partitions=[PartitionLag(c.topic, c.partition, c.pass_no, c.next, c.trained,
                                 ends.get((c.topic, c.partition))) for c in cursors],
        members=members(etcd, job),
        failed=failed,
        slots={} if slot_map is None else {s: len(slot_map.slots_of(s)) for s in range(slot_map.shards)},
        epoch=None if slot_map is None else slot_map.epoch,
        resizing=ResizeRecord.from_json(resize.value) if resize else None,
    )
