"""The trainer process: claim a task, read exactly its offsets, train, push, complete.

Per task: records are decoded (bad ones dead-lettered), cut into mini-batches of
`model.batch_size` good examples in offset order, and mini-batches into push groups of
`train.push_every`; group g carries `(task_id, seq=g)`. The cut depends only on the records,
so every attempt of a task produces the same keys and the pservers apply each group once.
With exactly-once delivery the groups are committed in Kafka transactions (every
`train.commit_every` groups, or once at the end of the task when it is 0), and the task is
completed in etcd only after its last commit.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from infra import Endpoints
from infra.clients import TopicSpec, ensure_topics, redis_client
from master.config import JobConfig
from master.errors import CoordinationError, MasterError, TaskLostError
from master.etcd import Etcd
from master.membership import register_trainer, wait_for_job_config
from master.tasks import ClaimedTask, TaskClient
from pserver.serving import ParamClient, ParamsUnavailableError
from pserver.sharding import SlotMap
from schemas import DeadLetter, EtcdKeys, Topics
from streamtrain.observability import TrainerMetrics
from trainer.decoders import ChunkDecoder
from trainer.delivery import AtLeastOnceDelivery, DeliveryError, TransactionalDelivery
from trainer.features import Batch, Featurizer, MiniBatches, pool
from trainer.metrics import TaskMetrics
from trainer.models import ModelSpec
from trainer.params import DenseLayout, Fetched, GradientBuffer, ParamSync
from trainer.reader import RangeReader, RangeReadError
from trainer.steps import StepGate

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """Stop was requested mid-task: the task is released, not failed."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_model(config: JobConfig) -> torch.nn.Module:
    module_name, _, attr = config.model.factory.partition(":")
    factory: object = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    return factory(model_spec(config))


def model_spec(config: JobConfig) -> ModelSpec:
    fields = config.model.sparse_fields or tuple(
        c.name for c in config.input.csv_columns if c.kind == "sparse")
    dense = config.model.dense_features or sum(1 for c in config.input.csv_columns if c.kind == "dense")
    return ModelSpec(fields, dense, config.model.embedding_dim)


@dataclass
class TrainerStats:
    tasks: int = 0
    examples: int = 0
    bad_records: int = 0
    lost_tasks: int = 0
    failed_tasks: int = 0


class Trainer:
    def __init__(self, endpoints: Endpoints, job: str, trainer_id: str | None = None,
                 device: torch.device | None = None, lease_ttl_s: int = 10) -> None:
        self.endpoints = endpoints
        self.job = job
        self.trainer_id = trainer_id or f"{socket.gethostname()}-{os.getpid()}"
        self.device = device or default_device()
        self.lease_ttl_s = lease_ttl_s
        self.stats = TrainerStats()
        self.step = 0  # push groups sent, across tasks
        self._batches = 0  # mini-batches trained, across tasks
        self.obs = TrainerMetrics.for_trainer(job, self.trainer_id)  # Prometheus, docs/observability.md

    # -- life cycle ----------------------------------------------------------------------
    def run(self, stop: threading.Event, max_tasks: int | None = None) -> None:
        self.etcd = Etcd.connect(self.endpoints)
        try:
            config = wait_for_job_config(self.etcd, self.job, stop, log)
            if config is None:
                return
            self._setup(config)
            try:
                self._loop(stop, max_tasks)
            finally:
                self.reader.close()
                self._prefetcher.shutdown()
                self.delivery.close()
                self.redis.close()
                self.lease.revoke()
        finally:
            self.etcd.close()

    def _setup(self, config: JobConfig) -> None:
        self.config = config
        self.topics = Topics(config.name)
        self.lease = register_trainer(self.etcd, config.name, self.trainer_id, self.lease_ttl_s)
        self.tasks = TaskClient.for_job(self.etcd, config.name, self.trainer_id)
        slots = self.etcd.get(EtcdKeys(config.name).slots)
        if slots is None:
            raise MasterError(f"job {config.name!r} has no slot map in etcd: start its master first")
        self.slot_map = SlotMap.from_json(slots.value)
        self.shards = self.slot_map.shards
        ensure_topics(self.endpoints, [TopicSpec(self.topics.metrics), TopicSpec(self.topics.dlq, 1, {
            "cleanup.policy": "compact"})] + [TopicSpec(self.topics.grad(s)) for s in range(self.shards)])
        spec = model_spec(config)
        self.featurizer = Featurizer(spec.fields, spec.dense_features, config.model.hash_buckets)
        # Records decoded together: large enough to amortise the per-chunk numpy calls.
        self._chunk_records = max(config.model.batch_size, 2048)
        self.decoder = ChunkDecoder(config.input, spec.fields, spec.dense_features)
        self.model = build_model(config).to(self.device)
        self.layout = DenseLayout(self.model)
        self.layout.load({})
        self.redis = redis_client(self.endpoints)
        self.sync = ParamSync(ParamClient(self.redis, config.name, self.slot_map), self.layout)
        self.buffer = GradientBuffer(self.slot_map, self.shards)
        # Pull the next mini-batch's parameters while this one trains, when that loses nothing:
        # with one commit per task (async, exactly-once) a pull sees none of the task's own
        # pushes either way. In the other modes a push becomes visible before the next pull.
        self._pull_ahead = (config.train.sgd == "async" and config.train.delivery == "exactly_once"
                            and config.train.commit_every == 0)
        self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="pull-ahead")
        self.gate = StepGate(self.redis, config.name, self.shards, config.train.sgd, config.train.staleness,
                             self.trainer_id, max_wait_s=max(1.0, config.tasks.timeout_s / 3))
        self.step = self.gate.first_step()
        self.reader = RangeReader(self.endpoints, f"{config.name}.trainer.{self.trainer_id}")
        if config.train.delivery == "exactly_once":
            self.delivery = TransactionalDelivery(self.endpoints, f"{config.name}.trainer.{self.trainer_id}")
        else:
            self.delivery = AtLeastOnceDelivery(self.endpoints)
        log.info("trainer %s: model %s on %s, %d shards, delivery %s", self.trainer_id,
                 config.model.factory, self.device, self.shards, config.train.delivery)

    def _loop(self, stop: threading.Event, max_tasks: int | None) -> None:
        task: ClaimedTask | None = None
        done = 0
        while not stop.is_set() and (max_tasks is None or done < max_tasks):
            if task is None:
                try:
                    task = self._next_task()
                except CoordinationError as exc:
                    log.warning("trainer %s: %s; retrying", self.trainer_id, exc)
                    stop.wait(1.0)
                    continue
                if task is None:
                    stop.wait(0.2)
                    continue
            self._task = task
            try:
                metrics = self.train_task(task, stop)
                done += 1
                more = not stop.is_set() and (max_tasks is None or done < max_tasks) and not self._paused()
                task = self.tasks.complete(self._task, claim_next=more)
                self.stats.tasks += 1
                self.obs.task_ended("done")
                log.debug("task done: %d examples, loss %s", metrics.examples,
                          metrics.loss_sum / max(metrics.examples, 1))
            except (_Stopped, ParamsUnavailableError) as exc:
                if isinstance(exc, ParamsUnavailableError):
                    log.warning("trainer %s: %s; giving the task back", self.trainer_id, exc)
                    stop.wait(exc.retry_after)
                self.delivery.discard()
                self.obs.task_ended("released")
                self._quietly(lambda t=self._task: self.tasks.release(t))
                task = None
            except TaskLostError as exc:
                log.warning("trainer %s: %s", self.trainer_id, exc)
                self.delivery.discard()
                self.stats.lost_tasks += 1
                self.obs.task_ended("lost")
                task = None
            except CoordinationError as exc:
                # etcd unreachable for a moment (or this process was frozen past a call's
                # deadline): drop the task; it times out and is requeued if it was still ours.
                log.warning("trainer %s: %s; dropping the task in hand", self.trainer_id, exc)
                self.delivery.discard()
                self.stats.lost_tasks += 1
                task = None
                stop.wait(1.0)
            except (RangeReadError, DeliveryError) as exc:
                log.warning("trainer %s: task %s failed: %s", self.trainer_id, task.task_id, exc)
                self.delivery.discard()
                self.stats.failed_tasks += 1
                self.obs.task_ended("failed")
                self._quietly(lambda t=self._task, e=exc: self.tasks.fail(t, str(e)))
                task = None
        if task is not None:  # claimed with the last completion, then told to stop
            self._quietly(lambda t=task: self.tasks.release(t))

    def _next_task(self) -> ClaimedTask | None:
        if self.lease.lost.is_set():
            log.warning("trainer %s: membership lease lost (frozen?); registering again", self.trainer_id)
            self.lease = register_trainer(self.etcd, self.config.name, self.trainer_id, self.lease_ttl_s)
        return None if self._paused() else self.tasks.claim()

    def _paused(self) -> bool:
        """`control/pause` set (a quiescent checkpoint, a rollback): finish the task in hand,
        claim no other."""
        return self.etcd.get(EtcdKeys(self.config.name).control("pause")) is not None

    @staticmethod
    def _quietly(call) -> None:
        try:
            call()
        except TaskLostError:
            pass

    # -- one task ------------------------------------------------------------------------
    def train_task(self, task: ClaimedTask, stop: threading.Event) -> TaskMetrics:
        record = task.record
        metrics = TaskMetrics(task.task_id, self.trainer_id, record.attempt)
        self._task, self._metrics = task, metrics
        self._seq = self._group_batches = self._group_examples = self._since_commit = 0
        self._heartbeat_at = time.monotonic()
        self.model.zero_grad(set_to_none=True)
        self.buffer.clear()
        self._batcher = MiniBatches(self.config.model.batch_size)
        chunk = []
        for msg in self.reader.read(record.topic, record.partition, record.start, record.end):
            if stop.is_set():
                raise _Stopped()
            chunk.append(msg)
            if len(chunk) == self._chunk_records:
                self._train_records(chunk)
                chunk = []
        self._train_records(chunk)
        last = self._batcher.rest()
        if last is not None:
            self._train_batch(last)
        if self._group_batches:
            self._push()
        self.delivery.add(self.topics.metrics, metrics.to_json(), task.task_id.encode())
        self._commit()
        self.obs.task_committed(metrics.loss_sum / metrics.examples if metrics.examples else None,
                                metrics.auc(), metrics.max_event_time_ms, time.time())
        return metrics

    def _train_records(self, msgs: list) -> None:
        """Decode and featurize a chunk of records at once, then train its mini-batches: always
        `batch_size` good examples in offset order, so push groups do not depend on chunking."""
        if not msgs:
            return
        decoded = self.decoder.decode([m.value() for m in msgs])
        for i, reason in decoded.bad:
            self._dead_letter(msgs[i], reason)
        if not len(decoded.columns):
            return
        block = self.featurizer.featurize(decoded.columns)
        self._metrics.max_event_time_ms = max(self._metrics.max_event_time_ms, int(block.event_time_ms.max()))
        batches = list(self._batcher.feed(block))
        ahead = None
        for i, batch in enumerate(batches):
            following = batches[i + 1] if self._pull_ahead and i + 1 < len(batches) else None
            ahead = self._train_batch(batch, ahead, following)

    def _dead_letter(self, msg, reason: str) -> None:
        self._metrics.bad_records += 1
        self.stats.bad_records += 1
        self.obs.bad_records.inc()
        letter = DeadLetter(msg.topic(), msg.partition(), msg.offset(), reason, msg.value() or b"",
                            self.config.name, int(time.time() * 1000))
        # Keyed by position: the DLQ is compacted, so a re-run task leaves one entry per record.
        self.delivery.add(self.topics.dlq, letter.to_json(),
                          f"{msg.topic()}:{msg.partition()}:{msg.offset()}".encode())

    def _fetch(self, batch: Batch, number: int) -> tuple[np.ndarray, np.ndarray, Fetched]:
        unique, inverse = np.unique(batch.ids, return_inverse=True)
        fetched = self.sync.fetch(self.model.tables, unique, dense=number % self.config.train.pull_every == 0)
        return unique, inverse, fetched

    def _train_batch(self, batch: Batch, ahead: Future | None = None, following: Batch | None = None
                     ) -> Future | None:
        """Train one mini-batch; `ahead` holds its parameters if they were fetched while the
        previous one trained, and `following`'s are fetched while this one trains."""
        metrics = self._metrics
        started = time.perf_counter()
        unique, inverse, fetched = ahead.result() if ahead is not None else self._fetch(batch, self._batches)
        tables = self.sync.load(fetched)
        nxt = None if following is None else self._prefetcher.submit(self._fetch, following, self._batches + 1)
        self._batches += 1
        pulled = time.perf_counter()
        metrics.pull_s += pulled - started
        self.obs.pull_seconds.observe(pulled - started)

        inverse_t = self._to(torch.from_numpy(inverse.astype(np.int64)))
        bags_t = self._to(torch.from_numpy(batch.bags))
        rows, pooled = {}, {}
        for name, values in tables.items():
            rows[name] = self._to(torch.from_numpy(values)).requires_grad_(True)
            pooled[name] = pool(rows[name], inverse_t, bags_t, batch.size, batch.fields)
        labels = self._to(torch.from_numpy(batch.labels))
        logits = self.model(pooled, self._to(torch.from_numpy(batch.dense)))
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        with torch.no_grad():
            scores = torch.sigmoid(logits).cpu().numpy()
        metrics.observe(batch.labels, scores, float(loss.item()) * batch.size)
        for name, tensor in rows.items():
            self.buffer.add_rows(name, unique, tensor.grad.cpu().numpy())
        computed = time.perf_counter() - pulled
        metrics.compute_s += computed
        self.obs.compute_seconds.observe(computed)
        self.obs.examples.inc(batch.size)
        self._group_batches += 1
        self._group_examples += batch.size
        self.stats.examples += batch.size
        if self._group_batches == self.config.train.push_every:
            self._push()
        return nxt

    def _to(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def _push(self) -> None:
        started = time.perf_counter()
        for delta in self.buffer.deltas(self.layout, self._task.task_id, self._seq, self.trainer_id,
                                        self.step, self._group_examples):
            self.delivery.add(self.topics.grad(delta.shard), delta.to_bytes(), self._task.task_id.encode())
        self.model.zero_grad(set_to_none=True)
        self._seq += 1
        pushed, self.step = self.step, self.step + 1
        self._group_batches = self._group_examples = 0
        self._since_commit += 1
        commit_every = self.config.train.commit_every
        # Sync and bounded modes commit every push: shards only see committed steps.
        if (self.config.train.delivery == "at_least_once" or self.gate.active
                or (commit_every and self._since_commit >= commit_every)):
            self._commit()
            self.step = self.gate.after_push(pushed)
        elif time.monotonic() - self._heartbeat_at > self.config.tasks.timeout_s / 3:
            self._heartbeat()
        elapsed = time.perf_counter() - started
        self._metrics.push_s += elapsed
        self.obs.push_seconds.observe(elapsed)

    def _heartbeat(self) -> None:
        self._task = self.tasks.heartbeat(self._task)
        self._heartbeat_at = time.monotonic()

    def _commit(self) -> None:
        """Check the task is still ours (a zombie learns here that it was requeued), then commit."""
        self._heartbeat()
        started = time.perf_counter()
        self.delivery.commit()
        self._since_commit = 0
        elapsed = time.perf_counter() - started
        self._metrics.push_s += elapsed
        self.obs.commit_seconds.observe(elapsed)
