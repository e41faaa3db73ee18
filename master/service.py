"""The master process: slices input partitions into tasks, expires and folds them, advances
passes, watches membership, takes the job-wide checkpoints. Stateless: everything it needs is
in etcd, so a standby that takes the lock continues exactly where the last leader's last
committed transaction left off.

The parts: the decisions, what to cut, fold, requeue, how a cut is packed into transactions,
when a pass ends, are pure functions in plan.py; the lock and the writes fenced on it are
leader.py's; the job-wide checkpoints are checkpoint_schedule.py's. This module reads etcd and Kafka
each round and applies the decisions.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from streamtrain.infra.metrics import MasterMetrics
from streamtrain.jobstate import queue
from streamtrain.jobstate.errors import EtcdError, LayoutChangedError
from streamtrain.jobstate.etcd import MAX_TXN_OPS, Entry, Etcd, Op, absent, delete_op, mod_revision_is, put_op
from streamtrain.jobstate.job_checkpoints import restore_batches
from streamtrain.jobstate.offsets import InputOffsets, InputUnavailableError, Partition
from streamtrain.jobstate.predecessors import this_holder
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.master import plan
from streamtrain.master.checkpoint_schedule import PeriodicCheckpoints
from streamtrain.master.leader import LeaderLock
from streamtrain.schemas import (
    ROLLBACK_PAUSE,
    EtcdKeys,
    JobState,
    PartitionCursor,
    PauseRequest,
    RollbackRequest,
    SchemaError,
    TaskRecord,
)
from streamtrain.schemas.config import JobConfig

log = logging.getLogger(__name__)

PARTITION_SCAN_S = 1.0
ETCD_AWAY_S = 1.0


@dataclass
class _Observed:
    """A pending task as this master last saw it; its deadline runs on this master's clock,
    restarted by every write to the key (claim, heartbeat), so trainers' clocks never matter."""

    mod_revision: int
    deadline: float



def _rollback_pause(pause: list[Entry]) -> bool:
    """Whether `control/pause` is a rollback's: a checkpoint then would be of the timeline it
    abandons. A resize pauses to take one (streamtrain/operations/resizing.py), and a pause left
    after a rollback (`--stay-paused`) is of the timeline kept."""
    if not pause:
        return False
    try:
        return PauseRequest.from_json(pause[0].value).by == ROLLBACK_PAUSE
    except SchemaError:
        return True

def settled_config(config: JobConfig, slot_map: SlotMap | None) -> JobConfig:
    """`config` with the shard count of the job's slot map (a job resized by `streamtrain
    resize` has its new count there); a job without a map yet keeps the file's. Raises
    LayoutChangedError if the job file's shards or slots are refused (`plan.layout_refused`)."""
    if slot_map is None:
        return config
    refused = plan.layout_refused(config.name, config.pservers.slots, config.pservers.count, slot_map)
    if refused:
        raise LayoutChangedError(refused)
    return config.with_shards(slot_map.shards)


def resized_note(job: str, slot_map: SlotMap, file_count: int) -> str:
    """What a master or `job run` says when a resized job's file gives another shard count."""
    return (f"job {job} was resized to {slot_map.shards} shards (slot map epoch {slot_map.epoch}): the job "
            f"file's pservers.count = {file_count} only set the count it began with; `streamtrain resize` "
            f"changes it")


def read_slot_map(etcd: Etcd, job: str) -> tuple[SlotMap | None, int]:
    """The job's slot map and its etcd mod revision, or (None, 0) before its master wrote one."""
    entry = etcd.get(EtcdKeys(job).slots)
    return (None, 0) if entry is None else (SlotMap.from_json(entry.value), entry.mod_revision)


class Master:
    def __init__(self, etcd: Etcd, offsets: InputOffsets, config: JobConfig,
                 identity: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`etcd`: the job's coordination store; `offsets`: what the input topics hold (the
        job's Kafka, `InputOffsets(endpoints)`). Both are given, so a caller can put its own in
        their place (a flaky etcd, offsets of its choosing)."""
        self.etcd = etcd
        self.config = config
        self.keys = EtcdKeys(config.name)
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.lock = LeaderLock(
            etcd, self.keys.master_lock, config.master.lock_ttl_s,
            this_holder("master", self.identity).to_json(),
        )
        self.offsets = offsets
        self.clock = clock
        self.cursors: dict[Partition, PartitionCursor] = {}
        self.finished = False
        self._observed: dict[str, _Observed] = {}
        self._head_since: dict[Partition, tuple[int, float]] = {}
        self._partitions: list[Partition] = []
        self._partitions_at = float("-inf")
        self._members: dict[str, set[str]] = {"trainers": set(), "ps": set()}
        # Trainers seen as members that left, and when: their tasks go back at once. Kept for
        # a task timeout; after it, the timeout requeues whatever they held anyway.
        self._gone: dict[str, float] = {}
        self._ignored: set[Partition] = set()
        self._compact_mark: tuple[float, int] | None = None
        self.metrics = MasterMetrics.for_job(config.name)
        self.checkpoints = PeriodicCheckpoints(etcd, config.name, config.pservers.checkpoint_every_s,
                                               config.pservers.count, clock, self.lock.write_if)

    # -- life cycle ----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Wait as standby, lead until `stop`; raises NotLeaderError if the lock is lost."""
        if not self.lock.acquire(stop):
            return
        self.metrics.leader.set(1)
        try:
            self._publish_config()
            self._load()
            stale = False
            while not stop.is_set():
                try:
                    if stale:
                        self._load()
                        stale = False
                    self.step()
                except InputUnavailableError as exc:
                    log.warning("%s; retrying", exc)
                except EtcdError as exc:  # etcd away: the lock's lease decides who leads
                    # A write that failed may still have been applied (etcd killed before it
                    # answered), and a round may have stopped between two writes: the cursors
                    # held here are read again before the next write. Kept, a fold applied
                    # but not seen here left two tasks deleted with the watermark below them,
                    # and the next slice wrote that watermark back: the job never finished.
                    log.warning("%s; retrying in %.0f s", exc, ETCD_AWAY_S)
                    stale = True
                    stop.wait(ETCD_AWAY_S)
                stop.wait(self.config.master.poll_ms / 1000)
        finally:
            self.metrics.leader.set(0)
            self.lock.release()

    def _publish_config(self) -> None:
        """Raises LayoutChangedError: the job file's shards or slots are not the slot map's."""
        while True:
            # One transaction, on the map as read: a resize that lands in between is read again.
            slot_map, revision = read_slot_map(self.etcd, self.config.name)
            config = settled_config(self.config, slot_map)
            if slot_map is not None and config.pservers.count != self.config.pservers.count:
                log.warning("%s", resized_note(config.name, slot_map, self.config.pservers.count))
            current = self.etcd.get(self.keys.config)
            if current is not None and current.value != config.to_json():
                log.warning("job config in etcd differs from the job file; the job file wins")
            ops = [put_op(self.keys.config, config.to_json()),
                   put_op(self.keys.ps_desired, self.keys.ps_desired_value(config.pservers.count))]
            if slot_map is None:  # the slot map is written once; parameters then live where it says
                first = SlotMap.uniform(config.pservers.slots, config.pservers.count)
                ops.append(put_op(self.keys.slots, first.to_json()))
            if self.lock.write_if([absent(self.keys.slots) if slot_map is None
                                   else mod_revision_is(self.keys.slots, revision)], ops):
                self.config = config
                return

    def _load(self) -> None:
        self.cursors = {}
        for entry in self.etcd.range(self.keys.cursors_prefix):
            cursor = PartitionCursor.from_json(entry.value)
            self.cursors[(cursor.topic, cursor.partition)] = cursor
        state = self.etcd.get(self.keys.state)
        self.finished = state is not None and JobState.from_json(state.value).finished
        log.info("loaded %d partition cursors", len(self.cursors))

    # -- one round -----------------------------------------------------------------------
    def step(self) -> None:
        self.lock.check()
        now = self.clock()
        # The rollback request rides in the same read: the master's round trips per step are
        # what bounds how fast it folds (the 40k-task test's key count depends on it).
        pending, done, failed, trainers, ps, rollback, pause, checkpoint, desired = self.etcd.ranges([
            self.keys.tasks("pending"), self.keys.tasks("done"), self.keys.tasks("failed"),
            self.keys.trainers_prefix, self.keys.ps_prefix, self.keys.control("rollback"),
            self.keys.control("pause"), self.keys.control("checkpoint"), self.keys.ps_desired,
        ])
        if rollback and (request := self._rollback_request(rollback[0].value)) and request.phase == "master":
            self._roll_back(request)
            return
        # The shard count is the job file's until a resize changes it (streamtrain/operations/resizing.py).
        checkpointing = self.checkpoints.step(request=checkpoint[0].value if checkpoint else None,
                                              busy=bool(rollback) or _rollback_pause(pause),
                                              shards=self.keys.ps_desired_of(desired[0].value) if desired else None)
        todo = self.etcd.range(self.keys.tasks("todo"), keys_only=True)
        self.metrics.queues(todo=len(todo), pending=len(pending), done=len(done), failed=len(failed))
        self._watch_members("trainers", {self.keys.trainer_of(e.key) for e in trainers})
        self._watch_members("ps", {str(self.keys.ps_index_of(e.key)) for e in ps})
        self._expire(pending, now)
        self._fold(done, failed)
        self._compact(now)
        if self.finished or checkpointing:  # nothing sliced between a checkpoint's two sides
            return
        self._slice(len(todo), now)
        if self.config.bounded:
            self._advance_pass(todo, pending)

    # -- rollback ------------------------------------------------------------------------
    @staticmethod
    def _rollback_request(value: bytes) -> RollbackRequest | None:
        try:
            return RollbackRequest.from_json(value)
        except SchemaError as exc:
            log.error("ignoring %s", exc)
            return None

    def _roll_back(self, request: RollbackRequest) -> None:
        """Put cursors, task queues and job state back as a job-wide checkpoint recorded them
        (streamtrain/operations/checkpoints.py); then hand over to the shards. Idempotent: a
        master that dies half-way leaves the phase at "master" and the next one starts over."""
        manifest = self.etcd.get(self.keys.checkpoint_job(request.to))
        if manifest is None:
            log.error("rollback to %s: no job manifest in etcd; ignoring the request", request.to)
            return
        try:
            batches = restore_batches(self.keys, manifest.value)
        except SchemaError as exc:
            log.error("rollback to %s: %s; ignoring the request", request.to, exc)
            return
        for ops in batches:
            self.lock.write(ops)
        self.lock.write([put_op(self.keys.control("rollback"), request.next_phase().to_json())])
        self._observed.clear()
        self._head_since.clear()
        self._load()
        log.warning("rolled back cursors and tasks to checkpoint %s; shards next", request.to)

    # -- slicing -------------------------------------------------------------------------
    def _slice(self, todo_count: int, now: float) -> None:
        if now - self._partitions_at >= PARTITION_SCAN_S:
            self._partitions = self.offsets.partitions(self.config.input.topics)
            self._partitions_at = now
        fresh = [p for p in self._partitions if p not in self.cursors and p not in self._ignored]
        bounds = self.offsets.bounds(self._partitions, earliest=bool(fresh))
        started: dict[Partition, PartitionCursor] = {}
        for p in fresh:
            if self.config.bounded and self.cursors:
                # A bounded job trains what existed when it started; a partition added later
                # is not part of that data set.
                log.warning("ignoring partition %s:%d added after the bounded job started", *p)
                self._ignored.add(p)
                continue
            b = bounds[p]
            origin = b.earliest if self.config.input.start_from == "earliest" else b.stable_end
            started[p] = PartitionCursor.fresh(p[0], p[1], origin,
                                               b.stable_end if self.config.bounded else None)
            log.info("following partition %s:%d from offset %d", p[0], p[1], origin)

        linger = self.config.tasks.linger_ms / 1000
        heads: list[plan.Head] = []
        for p, cursor in {**self.cursors, **started}.items():
            end = bounds[p].stable_end if p in bounds else cursor.next
            since = self._head_since.get(p)
            if end > cursor.next and (since is None or since[0] != cursor.next):
                since = self._head_since[p] = (cursor.next, now)
            heads.append(plan.Head(cursor, end, since is not None and now - since[1] >= linger))
            if p in bounds:
                self.metrics.lag(p[0], p[1], bounds[p].stable_end - cursor.trained)
        rounds, moved = plan.cut_rounds(heads, self.config.tasks.max_records,
                                        max(self.config.tasks.max_todo - todo_count, 0))
        # A new partition's cursor is stored even before it has a task.
        self._write_rounds(rounds, {(c.topic, c.partition): c for c in moved},
                           [(c.topic, c.partition) for c in started.values()])
        self.metrics.sliced.inc(sum(map(len, rounds)))

    def _write_rounds(self, rounds: list[list[TaskRecord]], moved: dict[Partition, PartitionCursor],
                      new: list[Partition]) -> None:
        """Rounds in order, each task with the cursor that covers it (`plan.transactions`);
        a new partition's cursor even when nothing was cut from it."""
        tasks = [t for round_ in rounds for t in round_]
        cut = {(t.topic, t.partition) for t in tasks}
        idle = [moved[p] for p in new if p not in cut]
        for i in range(0, len(idle), MAX_TXN_OPS):
            self.lock.write([put_op(self.keys.cursor(c.topic, c.partition), c.to_json())
                             for c in idle[i:i + MAX_TXN_OPS]])
            self._commit_cursors(idle[i:i + MAX_TXN_OPS])
        for batch, ends in plan.transactions(tasks, MAX_TXN_OPS):
            at = [replace(moved[p], next=end) for p, end in ends.items()]
            self.lock.write([put_op(self.keys.task("todo", t.task_id), t.to_json()) for t in batch]
                            + [put_op(self.keys.cursor(c.topic, c.partition), c.to_json()) for c in at])
            self._commit_cursors(at)

    def _commit_cursors(self, cursors: Iterable[PartitionCursor]) -> None:
        for c in cursors:
            self.cursors[(c.topic, c.partition)] = c

    # -- timeouts ------------------------------------------------------------------------
    def _expire(self, pending: list[Entry], now: float) -> None:
        timeout = self.config.tasks.timeout_s
        alive = set()
        for entry in pending:
            alive.add(entry.key)
            seen = self._observed.get(entry.key)
            if seen is None or seen.mod_revision != entry.mod_revision:
                seen = self._observed[entry.key] = _Observed(entry.mod_revision, now + timeout)
            if now < seen.deadline and not self._gone:
                continue
            task = self._parse(entry)
            if task is None:
                continue
            reason = plan.why_requeue(task, self._gone, seen.deadline - timeout, now >= seen.deadline, timeout)
            if reason is None:
                continue
            back = queue.requeue_lost(task, reason)
            applied = self.lock.write_if(
                [mod_revision_is(entry.key, entry.mod_revision)],
                [delete_op(entry.key), put_op(self.keys.task_back("todo", task.task_id), back.to_json())])
            if applied:
                self.metrics.requeued.inc()
                log.warning("task %s requeued: %s", task.task_id, reason)
            del self._observed[entry.key]
        for key in set(self._observed) - alive:
            del self._observed[key]

    # -- folding done tasks into the watermark --------------------------------------------
    def _fold(self, done: list[Entry], failed: list[Entry]) -> None:
        resolved: dict[Partition, list[TaskRecord]] = defaultdict(list)
        done_keys: dict[str, str] = {}
        stale: list[str] = []
        for entry in done:
            task = self._parse(entry)
            if task is None:
                continue
            done_keys[task.task_id] = entry.key
            cursor = self.cursors.get((task.topic, task.partition))
            if cursor is not None and (task.pass_no != cursor.pass_no or task.end <= cursor.trained):
                stale.append(entry.key)  # left behind by a crash between fold and delete
            resolved[(task.topic, task.partition)].append(task)
        failed_tasks = [(e, t) for e in failed if (t := self._parse(e)) is not None]
        for _, task in failed_tasks:
            resolved[(task.topic, task.partition)].append(task)

        ops: list[Op] = [delete_op(k) for k in stale]
        moved: list[PartitionCursor] = []
        for p, tasks in resolved.items():
            cursor = self.cursors.get(p)
            if cursor is None:
                continue
            new, folded = plan.fold(cursor, tasks, limit=MAX_TXN_OPS - 1)
            if not folded:
                continue
            group = [delete_op(done_keys[t.task_id]) for t in folded if t.task_id in done_keys]
            group.append(put_op(self.keys.cursor(new.topic, new.partition), new.to_json()))
            if len(ops) + len(group) > MAX_TXN_OPS:
                self.lock.write(ops)
                self._commit_cursors(moved)
                ops, moved = [], []
            ops.extend(group)
            moved.append(new)
        ops.extend(self._trim_failed(failed_tasks))
        for i in range(0, len(ops), MAX_TXN_OPS):
            self.lock.write(ops[i:i + MAX_TXN_OPS])
        self._commit_cursors(moved)

    def _trim_failed(self, failed: list[tuple[Entry, TaskRecord]]) -> list[Op]:
        """Keep the newest failed records for operators; older ones, once folded, go."""
        excess = len(failed) - self.config.tasks.max_failed_kept
        if excess <= 0:
            return []
        ops = []
        for entry, task in sorted(failed, key=lambda et: et[0].create_revision):
            cursor = self.cursors.get((task.topic, task.partition))
            if cursor is not None and (task.pass_no != cursor.pass_no or task.end <= cursor.trained):
                ops.append(delete_op(entry.key))
                if len(ops) == excess:
                    break
        return ops

    # -- passes over bounded input ---------------------------------------------------------
    def _advance_pass(self, todo: list[Entry], pending: list[Entry]) -> None:
        open_passes = set()
        for entry in (*todo, *pending):
            try:
                open_passes.add(TaskRecord.parse_id(self.keys.task_id_of(entry.key)).pass_no)
            except SchemaError:
                continue
        decision, cursors = plan.next_pass(self.cursors.values(), self.config.input.passes, open_passes)
        if decision == "finished":
            self.lock.write([put_op(self.keys.state, JobState("finished", time.time()).to_json())])
            self.finished = True
            log.info("all %d passes trained; job finished", self.config.input.passes)
        elif decision == "advance":
            ops = [put_op(self.keys.cursor(c.topic, c.partition), c.to_json()) for c in cursors]
            for i in range(0, len(ops), MAX_TXN_OPS):
                self.lock.write(ops[i:i + MAX_TXN_OPS])
            self._commit_cursors(cursors)
            log.info("pass %d begins", cursors[0].pass_no)

    # -- history ---------------------------------------------------------------------------
    def _compact(self, now: float) -> None:
        """Every task leaves tombstones under tasks/ that range reads must walk until etcd
        compacts them: compact what is older than one period, so the queues stay fast on an
        endless stream."""
        period = self.config.master.compact_history_s
        if not period:
            return
        if self._compact_mark is None:
            self._compact_mark = (now, self.etcd.revision())
            return
        marked_at, revision = self._compact_mark
        if now - marked_at >= period:
            self.etcd.compact(revision)
            self._compact_mark = (now, self.etcd.revision())

    # -- membership ----------------------------------------------------------------------
    def _watch_members(self, kind: str, now: set[str]) -> None:
        for joined in sorted(now - self._members[kind]):
            log.info("%s %s joined", kind, joined)
        for left in sorted(self._members[kind] - now):
            log.info("%s %s left", kind, left)
        if kind == "trainers":
            at = self.clock()
            self._gone.update(dict.fromkeys(self._members[kind] - now, at))
            self._gone = {t: left for t, left in self._gone.items()
                          if t not in now and at - left < self.config.tasks.timeout_s}
        self._members[kind] = now
        self.metrics.members(kind, len(now))

    @staticmethod
    def _parse(entry: Entry) -> TaskRecord | None:
        try:
            return TaskRecord.from_json(entry.value)
        except SchemaError as exc:
            log.error("unreadable task record at %s: %s", entry.key, exc)
            return None
