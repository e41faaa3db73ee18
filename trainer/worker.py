"""The trainer process: claim a task, read exactly its offsets, train, push, complete.

Per task: records are decoded (bad ones dead-lettered), cut into mini-batches of
`model.batch_size` good examples in offset order, and mini-batches into push groups of the
task's `push_every` (fixed by its first claim, trainer/policy.py `group_size`); group g
carries `(task_id, seq=g)`. The cut depends only on the records and the task, so every attempt
of a task produces the same keys and the pservers apply each group once.
A group is pulled and trained by trainer/groups.py; this module runs tasks and pushes
(`Trainer._train_group` names the push/pull path's steps in order and where each lives), with the
parts trainer/assembly.py wires once the job's config is known (`TrainerParts`). Each
group's deltas are produced as it is made (trainer/delivery.py); a background thread
(trainer/committer.py) waits for their acknowledgement and commits the task's side outputs,
and the task is completed in etcd only after that. What a pull misses of this trainer's own
pushes' dense changes is added to it (trainer/own.py).
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis
import torch

from streamtrain.infra import Endpoints
from streamtrain.infra.metrics import TrainerMetrics
from streamtrain.jobstate.errors import TaskLostError
from streamtrain.jobstate.etcd import Etcd, Lease
from streamtrain.jobstate.membership import register_trainer, wait_for_job_config
from streamtrain.jobstate.tasks import ClaimedTask
from streamtrain.schemas import DeadLetter, EtcdKeys
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.assembly import TrainerParts, assemble, resharded
from streamtrain.trainer.broker import Broker
from streamtrain.trainer.committer import Ended
from streamtrain.trainer.features import Batch, MiniBatches
from streamtrain.trainer.feed import Chunk, TaskFeed
from streamtrain.trainer.loader import BadRecord, Loaded
from streamtrain.trainer.metrics import TaskMetrics
from streamtrain.trainer.models import default_device
from streamtrain.trainer.policy import Stopped, group_size, heartbeat_due, task_end

log = logging.getLogger(__name__)


@dataclass
class TrainerStats:
    tasks: int = 0
    examples: int = 0
    bad_records: int = 0
    lost_tasks: int = 0
    failed_tasks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def ended(self, ending: str) -> None:
        """One more task ended so; the training thread and the committer's both count."""
        with self._lock:
            if ending == "done":
                self.tasks += 1
            elif ending == "lost":
                self.lost_tasks += 1
            elif ending == "failed":
                self.failed_tasks += 1


@dataclass(slots=True)
class TaskRun:
    """One task in training, made afresh for each: what the trainer knows only for its
    duration. The training thread alone touches it."""

    task: ClaimedTask  # as of its last heartbeat
    # The chunk to abandon from, should the task end early: the one being trained, or the
    # first (a heartbeat finding the task lost before its first mini-batch). A chunk of the
    # task before would leave this one's rest in the feed, to be taken for the next task's first.
    fed: Chunk
    metrics: TaskMetrics
    batcher: MiniBatches  # carries a short mini-batch from one chunk to the next
    heartbeat_at: float  # time.monotonic() of the claim or of its last heartbeat
    seq: int = 0  # push groups sent: the next group's dedup seq

    @classmethod
    def of(cls, first: Chunk, trainer_id: str, batch_size: int) -> TaskRun:
        """The run of the task `first` begins."""
        task = first.task
        return cls(task, first, TaskMetrics(task.task_id, trainer_id, task.record.attempt), MiniBatches(batch_size),
                   first.claimed_at)


class Trainer:
    def __init__(self, endpoints: Endpoints, job: str, trainer_id: str | None = None,
                 device: torch.device | None = None, lease_ttl_s: int = 10, *, etcd: Etcd | None = None,
                 redis_conn: redis.Redis | None = None, broker: Broker | None = None) -> None:
        """`etcd` and `redis_conn`: clients to use instead of connecting to `endpoints` (the
        caller keeps and closes them); `broker`: what makes the parts that talk to Kafka
        (trainer/broker.py), instead of the job's Kafka at `endpoints`."""
        self.endpoints = endpoints
        self._given_etcd, self._given_redis = etcd, redis_conn
        self.broker = broker or Broker(endpoints)
        self.job = job
        self.trainer_id = trainer_id or f"{socket.gethostname()}-{os.getpid()}"
        self.device = device or default_device()
        self.lease_ttl_s = lease_ttl_s
        self.stats = TrainerStats()
        self.obs = TrainerMetrics.for_trainer(job, self.trainer_id)  # Prometheus, docs/observability.md
        # Known once the job's config is (`run`): the run's parts (trainer/assembly.py), and the
        # membership lease, renewed by the feed's thread and the training thread alike.
        # Declared, not set to None, so the type checker holds them set where they are used.
        self.parts: TrainerParts
        self.lease: Lease
        self._membership_lock = threading.Lock()
        self.step = 0  # push groups sent, across tasks: the next push's step
        self.slots_seen = 0  # the newest etcd revision of the slot map the feed has read

    @property
    def registered(self) -> bool:
        """Set up and a member of the job (its readiness): its lease held."""
        lease = getattr(self, "lease", None)  # neither is set before `run` has
        return lease is not None and not lease.lost.is_set() and getattr(self, "parts", None) is not None

    # -- life cycle ----------------------------------------------------------------------
    def run(self, stop: threading.Event, max_tasks: int | None = None) -> None:
        etcd = self._given_etcd or Etcd.connect(self.endpoints)
        try:
            config = wait_for_job_config(etcd, self.job, stop, log)
            if config is None:
                return
            parts = self._setup(etcd, config)
            try:
                self._loop(stop, max_tasks)
            finally:
                try:
                    parts.committer.close()  # raises what stopped its thread (a broken producer)
                finally:
                    parts.loader.close()
                    parts.delivery.close()
                    self.parts.sharded.close()
                    if self._given_redis is None:
                        parts.redis.close()
                    self.lease.revoke()
                    gc.unfreeze()
        finally:
            if self._given_etcd is None:
                etcd.close()

    def _setup(self, etcd: Etcd, config: JobConfig) -> TrainerParts:
        self.lease = register_trainer(etcd, config.name, self.trainer_id, self.lease_ttl_s)
        parts = self.parts = assemble(config, self.trainer_id, etcd=etcd, redis_conn=self._given_redis,
                                      endpoints=self.endpoints, broker=self.broker, device=self.device,
                                      obs=self.obs, ended=self._ended)
        self.step = parts.sharded.first_step
        try:
            parts.loader.wait_ready()
        except BaseException:
            parts.loader.close()
            raise
        # Frozen, the ~200k long-lived objects of torch and the clients are not walked again
        # at every full collection.
        gc.freeze()
        # The feed and commit threads take the interpreter lock for short spells between
        # waits; at the default 5 ms switch interval each spell can wait 5 ms for the
        # training thread to let go of it.
        sys.setswitchinterval(0.001)
        log.info("trainer %s: model %s on %s, %d shards, delivery %s", self.trainer_id,
                 config.model.factory, self.device, parts.sharded.slot_map.shards, config.train.delivery)
        return parts

    def _loop(self, stop: threading.Event, max_tasks: int | None) -> None:
        parts = self.parts
        # Claimed ahead: at least a loader chunk's worth of records (trainer/feed.py).
        feed = TaskFeed(self._next_task, parts.loader, max_tasks, ahead_records=parts.chunk_records,
                        heartbeat=parts.tasks.heartbeat,
                        heartbeat_every_s=parts.config.tasks.timeout_s / 3).start()
        done = 0
        try:
            while not stop.is_set() and (max_tasks is None or done < max_tasks):
                chunk = feed.first(timeout=0.2)
                if chunk is None:
                    continue
                self._train_fed(feed, chunk, stop)
                done += 1
        finally:
            for unbegun in feed.close():
                self._quietly(lambda t=unbegun: parts.tasks.release(t))

    def _train_fed(self, feed: TaskFeed, first: Chunk, stop: threading.Event) -> None:
        """Train one task from the feed and hand its end to the committer; a task lost, failed
        or given back ends here."""
        if self.slots_seen > self.parts.sharded.revision:
            self._reshard()
        parts = self.parts
        run = TaskRun.of(first, self.trainer_id, parts.config.model.batch_size)
        try:
            metrics = self.train_task(run, feed, stop)
            parts.committer.end(run.task, parts.delivery.take(), metrics)
            return
        except Exception as exc:  # noqa: BLE001  task_end decides which errors end only the task
            end = task_end(exc)
            if end is None:
                raise
            if not isinstance(exc, Stopped):
                log.warning("trainer %s: task %s: %s%s", self.trainer_id, first.task.task_id, exc,
                            f"; {end.why}" if end.why else "")
            if end.ending == "failed":
                self._quietly(lambda t=run.task, e=exc: parts.tasks.fail(t, str(e)))
            if end.stops:
                raise
            if end.wait_s:
                stop.wait(end.wait_s)
        parts.delivery.discard()
        parts.committer.drop(run.task.task_id)
        parts.sharded.own.forget(run.task.task_id)
        parts.sharded.groups.given_up()
        feed.abandon(run.fed)
        if end.ending == "released":
            self._quietly(lambda t=run.task, b=end.behind: parts.tasks.release(t, behind=b))
        ending = end.ending
        self.stats.ended(ending)
        self.obs.task_ended(ending)

    def _reshard(self) -> None:
        """The job was resized (streamtrain/operations/resizing.py): push by the new slot map from the
        next task on. Its tasks claimed since were claimed after the pause the resize's
        rollback made, so no push under the old map is in flight."""
        self.parts = resharded(self.parts, self.trainer_id, self.broker, self.device, self.obs)
        sharded = self.parts.sharded
        self.step = max(self.step, sharded.first_step)
        log.info("trainer %s: the job now has %d shards (slot map of revision %d)", self.trainer_id,
                 sharded.slot_map.shards, sharded.revision)

    def _ended(self, ended: Ended) -> None:
        """A task ended in the background: runs on the committer's thread as soon as it has,
        so the metrics agree with etcd (trainer/committer.py)."""
        metrics = ended.metrics
        if ended.commit_s is not None:
            self.obs.commit_seconds.observe(ended.commit_s)
        if ended.ending == "done":
            self.obs.task_committed(metrics.loss_sum / metrics.examples if metrics.examples else None,
                                    metrics.auc(), metrics.max_event_time_ms, time.time())
        else:
            log.warning("trainer %s: task %s %s: %s", self.trainer_id, ended.task.task_id, ended.ending,
                        ended.reason)
        self.stats.ended(ended.ending)
        self.obs.task_ended(ended.ending)

    def _next_task(self) -> ClaimedTask | None:
        self._keep_membership()
        live = self._live_trainers()
        if live is None:
            return None
        return self.parts.tasks.claim(group_size(self.parts.config.train.push_every, live))

    def _live_trainers(self) -> int | None:
        """How many trainers are registered; None while `control/pause` is set (a rollback:
        finish the task in hand, claim no other). Read with the slot map's revision: a resize
        changes the map while the trainers are paused, and the training thread switches to it
        before the next task (`_train_fed`)."""
        parts = self.parts
        keys = EtcdKeys(parts.config.name)
        pause, slots, trainers = parts.etcd.ranges([keys.control("pause"), keys.slots, keys.trainers_prefix])
        if slots:
            self.slots_seen = max(self.slots_seen, slots[0].mod_revision)
        return None if pause else len(trainers)

    @staticmethod
    def _quietly(call) -> None:
        try:
            call()
        except TaskLostError:
            pass

    # -- one task ------------------------------------------------------------------------
    # The parts are bound to locals once per task or per push group, not looked up through
    # `self.parts` per mini-batch.
    def train_task(self, run: TaskRun, feed: TaskFeed, stop: threading.Event) -> TaskMetrics:
        """Train the task of `run`, reading the rest of its records from `feed`; its last
        messages stay in the parts' delivery for the committer."""
        parts = self.parts
        metrics = run.metrics
        push_every = run.task.record.push_every
        if heartbeat_due(time.monotonic() - run.heartbeat_at, parts.config.tasks.timeout_s):
            self._heartbeat(run)  # it waited in the feed: still ours?
        parts.model.zero_grad(set_to_none=True)
        parts.sharded.buffer.clear()
        group: list[Batch] = []
        for batch in self._mini_batches(run, feed, stop):
            group.append(batch)
            if len(group) == push_every:
                self._train_group(run, group)
                group = []
        if group:
            self._train_group(run, group)
        parts.delivery.add(parts.topics.metrics, metrics.report().to_json(), run.task.task_id.encode())
        return metrics

    def _mini_batches(self, run: TaskRun, feed: TaskFeed, stop: threading.Event) -> Iterator[Batch]:
        """The task's mini-batches: always `batch_size` good examples in offset order (the
        last one shorter), so push groups depend neither on chunking nor on look-ahead."""
        chunk = run.fed
        while True:
            if chunk.error is not None:
                raise chunk.error
            if stop.is_set():
                raise Stopped()
            yield from self._cut(run, chunk.records)
            if chunk.last:
                break
            chunk = run.fed = feed.more()
        last = run.batcher.rest()
        if last is not None:
            yield last

    def _cut(self, run: TaskRun, loaded: Loaded | None) -> Iterator[Batch]:
        """Dead-letter a chunk's bad records, then cut its mini-batches."""
        if loaded is None:
            return
        for bad in loaded.bad:
            self._dead_letter(run, bad)
        if loaded.block is None:
            return
        run.metrics.max_event_time_ms = max(run.metrics.max_event_time_ms, int(loaded.block.event_time_ms.max()))
        yield from run.batcher.feed(loaded.block)

    def _dead_letter(self, run: TaskRun, bad: BadRecord) -> None:
        parts = self.parts
        run.metrics.bad_records += 1
        self.stats.bad_records += 1
        self.obs.bad_records.inc()
        letter = DeadLetter(bad.topic, bad.partition, bad.offset, bad.reason, bad.value,
                            parts.config.name, int(time.time() * 1000))
        # Keyed by position: the DLQ is compacted, so a re-run task leaves one entry per record.
        parts.delivery.add(parts.topics.dlq, letter.to_json(), f"{bad.topic}:{bad.partition}:{bad.offset}".encode())

    def _train_group(self, run: TaskRun, batches: list[Batch]) -> None:
        """Train one push group, then push it: the entry of the push/pull path.

        Four settings shape it: the task's `push_every` (the group's size in mini-batches,
        fixed by its first claim, trainer/policy.py `group_size`), `train.pull_every`,
        `train.max_in_flight` and `train.sgd` (an `SgdMode`). Three threads and a process take
        part: the loader process (trainer/loader.py) reads and decodes the task's range, the
        feed thread (trainer/feed.py `TaskFeed`) claims tasks ahead and hands the chunks over,
        the committer's thread (trainer/committer.py) waits for the brokers; everything below
        runs on this, the training thread, unless it says otherwise.

        0. Cut (`train_task`, `_mini_batches`): the feed's chunks into mini-batches of
           `model.batch_size` good records and those into groups of `push_every`.
        For each mini-batch of the group (trainer/groups.py `GroupTrainer.train`):
        1. Pull (`GroupTrainer._pull`; `ParamSync.send` and `load`, trainer/params.py; the
           transaction, params/paramstore.py `ParamClient`): one Redis transaction per shard
           reads the mini-batch's rows, the dense blocks once `pull_every` mini-batches have
           trained since their last pull (or after a task given up, `given_up`), and the
           shards' `applied` steps; the rounds since the last pull go into the replica
           (trainer/replica.py), whose rows stand in for their keys. The group's first pull
           comes after step 6 of the group before, so it includes what that wait waited for.
        2. Read your writes (`OwnPushes.published`, `add_blocks`, `add_rows`, trainer/own.py):
           the pushes every shard has published are forgotten; the estimated changes of the
           others, and of the group's earlier steps, are added to what was pulled. Rows are
           estimated only when a step may train before an earlier one is published
           (`push_every` != 1, or `groups.rows_in_flight`: async with `max_in_flight` > 0).
        3. Step (`GroupTrainer._step`): forward and backward; the gradients join the push being
           built (`GradientBuffer.add_step`, a step of its own in the delta); its dense change,
           estimated with the job's update rule, goes into the model at once when a later step
           may train before the shards publish it (`groups.estimates_dense`), and its rows'
           (`OwnRows.step`) into the push's estimate (`OwnPushes.rows`).
        Then, once, `_push`:
        4. Produce: `GradientBuffer.deltas` makes one `GradientDelta` per shard, empty ones
           included, keyed `(task_id, seq)` and stamped with this trainer's step;
           `Delivery.send` (trainer/delivery.py) produces each to its shard's gradient topic at
           once, after every delta before it; `OwnPushes.pushed` files the push's estimates
           under its step.
        5. Hand (`Committer.hand`): the committer's thread waits for the acknowledgements and,
           at the task's end (`_train_fed`, `Committer.end`), commits its side outputs and
           completes it in etcd. The training thread waits only while too many groups are
           handed, and raises here a failed commit of an earlier group of the task.
        6. Wait as the mode says, for at most a third of `tasks.timeout_s` (at least 1 s). `waits_on_steps` (sync,
           bounded): `StepGate.after_push` (trainer/steps.py) sleeps on the shards' steps
           documents until `next_step` lets it go on, and says the next step (sync: the
           barrier's). `limits_in_flight` (async): `InFlight.wait` sleeps on the shards'
           publish announcements (params/watches.py `AppliedWatch`) until at most
           `max_in_flight` of its own pushes are unpublished.
        7. Heartbeat the task if due (a long task must not time out while it trains).
        """
        parts = self.parts
        parts.sharded.groups.train(batches, run.metrics)
        examples = sum(batch.size for batch in batches)
        self.stats.examples += examples
        self._push(parts, run, examples)

    def _push(self, parts: TrainerParts, run: TaskRun, examples: int) -> None:
        started = time.perf_counter()
        task_id = run.task.task_id
        committer = parts.committer
        committer.raise_failed(task_id)
        sharded = parts.sharded
        for delta in sharded.buffer.deltas(task_id, run.seq, self.trainer_id, self.step, examples):
            parts.delivery.send(parts.topics.grad(delta.shard), delta.to_bytes(), task_id.encode())
        sharded.own.pushed(self.step, task_id)
        run.seq += 1
        pushed, self.step = self.step, self.step + 1
        # The committer waits for the push's acknowledgement; the training thread never does.
        # The task's side outputs wait for its end.
        committer.hand(task_id)
        if sharded.gate.active:
            self.step = sharded.gate.after_push(pushed, lambda: committer.raise_failed(task_id))
        elif sharded.in_flight is not None:
            sharded.in_flight.wait(sharded.own, pushed, lambda: committer.raise_failed(task_id))
        if heartbeat_due(time.monotonic() - run.heartbeat_at, parts.config.tasks.timeout_s):
            self._heartbeat(run)
        elapsed = time.perf_counter() - started
        run.metrics.push_s += elapsed
        self.obs.push_seconds.observe(elapsed)

    def _heartbeat(self, run: TaskRun) -> None:
        run.task = self.parts.tasks.heartbeat(run.task)
        run.heartbeat_at = time.monotonic()
        self._keep_membership()  # a long task must not leave it lapsed: the master requeues for that

    def _keep_membership(self) -> None:
        with self._membership_lock:
            if self.lease.lost.is_set():
                log.warning("trainer %s: membership lease lost (frozen?); registering again", self.trainer_id)
                parts = self.parts
                self.lease = register_trainer(parts.etcd, parts.config.name, self.trainer_id, self.lease_ttl_s)
