"""The trainer process: claim a task, read exactly its offsets, train, push, complete.

Per task: records are decoded (bad ones dead-lettered), cut into mini-batches of
`model.batch_size` good examples in offset order, and mini-batches into push groups of
`train.push_every`; group g carries `(task_id, seq=g)`. The cut depends only on the records,
so every attempt of a task produces the same keys and the pservers apply each group once.
A group is pulled and trained by trainer/groups.py; this module runs tasks and pushes. Each
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
from streamtrain.infra.clients import redis_client
from streamtrain.jobstate.config import JobConfig
from streamtrain.jobstate.errors import MasterError, TaskLostError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.membership import register_trainer, wait_for_job_config
from streamtrain.jobstate.observability import TrainerMetrics
from streamtrain.jobstate.optimizers import make_rule
from streamtrain.jobstate.paramstore import ParamClient
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.jobstate.tasks import ClaimedTask, TaskClient
from streamtrain.jobstate.watches import AppliedWatch
from streamtrain.schemas import DeadLetter, EtcdKeys, Topics
from streamtrain.trainer.committer import Committer, Ended
from streamtrain.trainer.broker import Broker
from streamtrain.trainer.features import Batch, MiniBatches
from streamtrain.trainer.feed import Chunk, TaskFeed
from streamtrain.trainer.groups import GroupTrainer, rows_in_flight
from streamtrain.trainer.loader import BadRecord, Loaded
from streamtrain.trainer.metrics import TaskMetrics
from streamtrain.trainer.models import build_model, default_device, model_spec, use_torch_threads
from streamtrain.trainer.own import OwnPushes, OwnRows
from streamtrain.trainer.params import DenseLayout, GradientBuffer, ParamSync, RowLayout
from streamtrain.trainer.policy import Stopped, heartbeat_due, task_end
from streamtrain.trainer.replica import RowReplica
from streamtrain.trainer.steps import InFlight, StepGate

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
        self.step = 0  # push groups sent, across tasks
        self.obs = TrainerMetrics.for_trainer(job, self.trainer_id)  # Prometheus, docs/observability.md

    @property
    def registered(self) -> bool:
        """Set up and a member of the job (its readiness): its lease held."""
        lease = getattr(self, "lease", None)
        return lease is not None and not lease.lost.is_set() and hasattr(self, "committer")

    # -- life cycle ----------------------------------------------------------------------
    def run(self, stop: threading.Event, max_tasks: int | None = None) -> None:
        self.etcd = self._given_etcd or Etcd.connect(self.endpoints)
        try:
            config = wait_for_job_config(self.etcd, self.job, stop, log)
            if config is None:
                return
            self._setup(config)
            try:
                self._loop(stop, max_tasks)
            finally:
                try:
                    self.committer.close()  # raises what stopped its thread (a broken producer)
                finally:
                    self.loader.close()
                    self.delivery.close()
                    self.applied_watch.close()
                    self.gate.close()
                    if self._given_redis is None:
                        self.redis.close()
                    self.lease.revoke()
                    gc.unfreeze()
        finally:
            if self._given_etcd is None:
                self.etcd.close()

    def _setup(self, config: JobConfig) -> None:
        self.config = config
        self.topics = Topics(config.name)
        self.lease = register_trainer(self.etcd, config.name, self.trainer_id, self.lease_ttl_s)
        self._membership_lock = threading.Lock()  # the feed's thread and the training thread renew it
        self.tasks = TaskClient.for_job(self.etcd, config.name, self.trainer_id)
        for task_id in self.tasks.requeue_predecessors():
            log.warning("trainer %s: task %s was still held under this id by a predecessor; requeued",
                        self.trainer_id, task_id)
        slots = self.etcd.get(EtcdKeys(config.name).slots)
        if slots is None:
            raise MasterError(f"job {config.name!r} has no slot map in etcd: start its master first")
        self.slot_map = SlotMap.from_json(slots.value)
        self.shards = self.slot_map.shards
        self.broker.ensure_topics(config, self.shards)
        spec = model_spec(config)
        # Started first: the child's imports overlap the rest of the start-up. Records are
        # decoded in chunks large enough to amortise the per-chunk numpy calls.
        self._chunk_records = max(config.model.batch_size, 4096)
        self.loader = self.broker.loader(config, self.trainer_id, spec.fields, spec.dense_features,
                                         self._chunk_records)
        use_torch_threads(config)
        self.model = build_model(config).to(self.device)
        self.rows = RowLayout.of(self.model.tables)
        self.layout = DenseLayout(self.model)
        self.layout.load({})
        self.redis = self._given_redis or redis_client(self.endpoints)
        client = ParamClient(self.redis, config.name, self.slot_map)
        self.sync = ParamSync(client, self.layout, replica=RowReplica(self.rows.name, self.rows.width, self.shards))
        self.buffer = GradientBuffer(self.slot_map, self.shards)
        # Read-your-writes (trainer/own.py): the dense changes of the pushes the shards have not
        # published yet are added to every pull, estimated with the job's own update rule.
        rule = make_rule(config.pservers.optimizer, lr=config.train.learning_rate)
        self.own = OwnPushes(rule, self.trainer_id, self.shards)
        # Rows are estimated when a step may train before the shards publish an earlier one:
        # within a push group, and after pushes a trainer may leave in flight.
        own_rows = OwnRows(rule, self.rows.width) if config.train.push_every > 1 or rows_in_flight(config) else None
        self.groups = GroupTrainer(config, self.model, self.layout, self.rows, self.sync, self.buffer, self.own,
                                   own_rows, self.slot_map, self.device, self.obs)
        self.gate = StepGate(self.redis, config.name, self.shards, config.train.sgd, config.train.staleness,
                             self.trainer_id, max_wait_s=max(1.0, config.tasks.timeout_s / 3))
        self.applied_watch = AppliedWatch(self.redis, config.name, self.shards, self.trainer_id)
        self.in_flight = InFlight(config.train.max_in_flight, self.applied_watch.wait, self.trainer_id,
                                  max_wait_s=max(1.0, config.tasks.timeout_s / 3)
                                  ) if config.train.sgd == "async" else None
        self.step = self.gate.first_step() if self.gate.active else self.own.first_step(client.applied())
        self.delivery = self.broker.delivery(config, self.trainer_id)
        self.committer = Committer(self.delivery, self.tasks, self._ended)
        try:
            self.loader.wait_ready()
        except BaseException:
            self.loader.close()
            raise
        # Frozen, the ~200k long-lived objects of torch and the clients are not walked again
        # at every full collection.
        gc.freeze()
        # The feed and commit threads take the interpreter lock for short spells between
        # waits; at the default 5 ms switch interval each spell can wait 5 ms for the
        # training thread to let go of it.
        sys.setswitchinterval(0.001)
        log.info("trainer %s: model %s on %s, %d shards, delivery %s", self.trainer_id,
                 config.model.factory, self.device, self.shards, config.train.delivery)

    def _loop(self, stop: threading.Event, max_tasks: int | None) -> None:
        # Claimed ahead: at least a loader chunk's worth of records (trainer/feed.py).
        feed = TaskFeed(self._next_task, self.loader, max_tasks, ahead_records=self._chunk_records,
                        heartbeat=self.tasks.heartbeat,
                        heartbeat_every_s=self.config.tasks.timeout_s / 3).start()
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
                self._quietly(lambda t=unbegun: self.tasks.release(t))

    def _train_fed(self, feed: TaskFeed, first: Chunk, stop: threading.Event) -> None:
        """Train one task from the feed and hand its end to the committer; a task lost, failed
        or given back ends here."""
        run = TaskRun.of(first, self.trainer_id, self.config.model.batch_size)
        try:
            metrics = self.train_task(run, feed, stop)
            self.committer.end(run.task, self.delivery.take(), metrics)
            return
        except Exception as exc:  # noqa: BLE001  task_end decides which errors end only the task
            end = task_end(exc)
            if end is None:
                raise
            if not isinstance(exc, Stopped):
                log.warning("trainer %s: task %s: %s%s", self.trainer_id, first.task.task_id, exc,
                            f"; {end.why}" if end.why else "")
            if end.ending == "failed":
                self._quietly(lambda t=run.task, e=exc: self.tasks.fail(t, str(e)))
            if end.wait_s:
                stop.wait(end.wait_s)
            ending = end.ending
        self.delivery.discard()
        self.committer.drop(run.task.task_id)
        self.own.forget(run.task.task_id)
        feed.abandon(run.fed)
        if ending == "released":
            self._quietly(lambda t=run.task: self.tasks.release(t))
        self.stats.ended(ending)
        self.obs.task_ended(ending)

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
        return None if self._paused() else self.tasks.claim()

    def _paused(self) -> bool:
        """`control/pause` set (a rollback): finish the task in hand, claim no other."""
        return self.etcd.get(EtcdKeys(self.config.name).control("pause")) is not None

    @staticmethod
    def _quietly(call) -> None:
        try:
            call()
        except TaskLostError:
            pass

    # -- one task ------------------------------------------------------------------------
    def train_task(self, run: TaskRun, feed: TaskFeed, stop: threading.Event) -> TaskMetrics:
        """Train the task of `run`, reading the rest of its records from `feed`; its last
        messages stay in `self.delivery` for the committer."""
        metrics = run.metrics
        if heartbeat_due(time.monotonic() - run.heartbeat_at, self.config.tasks.timeout_s):
            self._heartbeat(run)  # it waited in the feed: still ours?
        self.model.zero_grad(set_to_none=True)
        self.buffer.clear()
        group: list[Batch] = []
        for batch in self._mini_batches(run, feed, stop):
            group.append(batch)
            if len(group) == self.config.train.push_every:
                self._train_group(run, group)
                group = []
        if group:
            self._train_group(run, group)
        self.delivery.add(self.topics.metrics, metrics.report().to_json(), run.task.task_id.encode())
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
        run.metrics.bad_records += 1
        self.stats.bad_records += 1
        self.obs.bad_records.inc()
        letter = DeadLetter(bad.topic, bad.partition, bad.offset, bad.reason, bad.value,
                            self.config.name, int(time.time() * 1000))
        # Keyed by position: the DLQ is compacted, so a re-run task leaves one entry per record.
        self.delivery.add(self.topics.dlq, letter.to_json(), f"{bad.topic}:{bad.partition}:{bad.offset}".encode())

    def _train_group(self, run: TaskRun, batches: list[Batch]) -> None:
        """Train one push group (trainer/groups.py), then push it."""
        self.groups.train(batches, run.metrics)
        examples = sum(batch.size for batch in batches)
        self.stats.examples += examples
        self._push(run, examples)

    def _push(self, run: TaskRun, examples: int) -> None:
        started = time.perf_counter()
        task_id = run.task.task_id
        self.committer.raise_failed(task_id)
        for delta in self.buffer.deltas(task_id, run.seq, self.trainer_id, self.step, examples):
            self.delivery.send(self.topics.grad(delta.shard), delta.to_bytes(), task_id.encode())
        self.own.pushed(self.step, task_id)
        run.seq += 1
        pushed, self.step = self.step, self.step + 1
        # The committer waits for the push's acknowledgement; the training thread never does.
        # The task's side outputs wait for its end.
        self.committer.hand(task_id)
        if self.gate.active:
            self.step = self.gate.after_push(pushed, lambda: self.committer.raise_failed(task_id))
        elif self.in_flight is not None:
            self.in_flight.wait(self.own, pushed, lambda: self.committer.raise_failed(task_id))
        if heartbeat_due(time.monotonic() - run.heartbeat_at, self.config.tasks.timeout_s):
            self._heartbeat(run)
        elapsed = time.perf_counter() - started
        run.metrics.push_s += elapsed
        self.obs.push_seconds.observe(elapsed)

    def _heartbeat(self, run: TaskRun) -> None:
        run.task = self.tasks.heartbeat(run.task)
        run.heartbeat_at = time.monotonic()
        self._keep_membership()  # a long task must not leave it lapsed: the master requeues for that

    def _keep_membership(self) -> None:
        with self._membership_lock:
            if self.lease.lost.is_set():
                log.warning("trainer %s: membership lease lost (frozen?); registering again", self.trainer_id)
                self.lease = register_trainer(self.etcd, self.config.name, self.trainer_id, self.lease_ttl_s)
