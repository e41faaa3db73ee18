"""The pserver shard process: gradient topic in, update rule applied, Redis out, checkpoints.

Start-up is recovery: take the shard index in etcd, load the newest complete checkpoint, seek
the gradient topic to the offset it saved, replay up to the last stable offset seen at start
(publishing nothing meanwhile), then publish every row and block and serve. Every row, unless
Redis's keys still hold the checkpoint's rows (its predecessor flushed them, and nothing reset
the keys since): then only the rows the replay changed (publish_thread.py `resume`). Replaying is
the same code path as serving, so a restarted shard ends where an unkilled one would: the same
deltas in the same total order (one partition per shard topic) through the same dedup ledger.

The parts: reading the gradient topic (gradlog.py), the state and its update rule (state.py),
the sync barrier (barrier.py), publishing to Redis (publish_thread.py, redis_rounds.py), checkpoints
(checkpoint_store.py, and checkpoint_registry.py registers them in etcd; storage.py makes the log and the
checkpoint store, or a caller gives its own), the control plane's requests
(control_requests.py) and the decisions about them and about when each periodic step is due
(decisions.py); this module wires them into one `ShardParts` once the shard has registered, and
runs them.
One thread does everything that changes the state (consume, apply, checkpoint, roll back), so
a checkpoint is always of a state that applied exactly the deltas before its saved offset; the
publishing thread only copies changed rows, under the same lock.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from streamtrain.infra import Endpoints
from streamtrain.infra.clients import redis_client
from streamtrain.infra.metrics import PserverMetrics
from streamtrain.jobstate.errors import CoordinationError, EtcdError
from streamtrain.jobstate.etcd import Etcd, Lease
from streamtrain.jobstate.membership import register_pserver, wait_for_job_config
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.optimizers import make_rule
from streamtrain.pserver.barrier import StepBarrier
from streamtrain.pserver.checkpoint_registry import CheckpointKeeper
from streamtrain.pserver.control_requests import ShardController
from streamtrain.pserver.decisions import Schedule, fold_ready
from streamtrain.pserver.gradlog import GradientLog
from streamtrain.pserver.publish_thread import BackgroundPublisher
from streamtrain.pserver.redis_rounds import Publisher
from streamtrain.pserver.state import BadDeltaError, ShardState
from streamtrain.pserver.storage import ShardStorage
from streamtrain.schemas import (
    BarrierStats,
    BarrierSteps,
    EtcdKeys,
    GradientDelta,
    PartitionCursor,
    RedisKeys,
    ShardStats,
    StreamtrainError,
)
from streamtrain.schemas.config import JobConfig

log = logging.getLogger(__name__)
UNPUBLISH_BATCH = 1000  # keys per SCAN page and per UNLINK when a shard that left deletes its keys


class ShardLostError(CoordinationError):
    """The shard's lease expired (frozen or cut off from etcd): another process may hold its
    index now, so this one must stop; a supervisor restarts it and it recovers."""


@dataclass(frozen=True)
class ShardOptions:
    job: str
    index: int | None = None  # None: the first free index
    lease_ttl_s: int = 10
    # A round starts as soon as something was applied; under load the rounds run back to
    # back and each carries what was applied while the one before was on the wire. This only
    # bounds how long an idle publisher sleeps between its version-key checks.
    publish_interval_s: float = 0.05
    fold_interval_s: float = 2.0
    housekeeping_s: float = 1.0  # version-key check, control key, stats
    checkpoint_every_s: float | None = None  # None: the job's pservers.checkpoint_every_s


@dataclass
class Counters:
    deltas: int = 0
    rows: int = 0
    bad: int = 0


@dataclass(frozen=True, slots=True)
class ShardParts:
    """What a registered shard builds once it knows its job's config and its index (`_assemble`),
    fixed from then to the end of its run. The state and the barrier, which a rollback
    replaces, the shard holds itself."""

    config: JobConfig
    etcd: Etcd
    redis: redis.Redis  # the shard's own unless it was given one
    metrics: PserverMetrics
    grads: GradientLog
    checkpoints: CheckpointKeeper  # the store's checkpoints, registered in etcd
    controller: ShardController
    publishing: BackgroundPublisher


class ShardLeft(StreamtrainError):  # noqa: N818  a signal to stop, not a failure
    """A resize left this shard's index outside the slot map (streamtrain/operations/resizing.py)."""


class PserverShard:
    def __init__(self, endpoints: Endpoints, options: ShardOptions, *, etcd: Etcd | None = None,
                 redis_conn: redis.Redis | None = None, storage: ShardStorage | None = None) -> None:
        """`etcd` and `redis_conn`: clients to use instead of connecting to `endpoints` (the
        caller keeps and closes them); `storage`: what makes the gradient log and the
        checkpoint store (pserver/storage.py), instead of the job's Kafka at `endpoints` and
        its `pservers.checkpoint_uri`."""
        self.endpoints = endpoints
        self.options = options
        self._given_etcd, self._given_redis = etcd, redis_conn
        self.storage = storage or ShardStorage(endpoints)
        self.keys = EtcdKeys(options.job)
        self.redis_keys = RedisKeys(options.job)
        self.counters = Counters()
        self.lock = threading.Lock()  # held while applying and while the publisher copies
        # Set once registered (`run`), and only read after: the index and its lease, then the
        # run's parts; the state, the barrier (both replaced by a rollback) and the schedule of
        # periodic steps. Declared, not set to None, so the type checker holds them set.
        self.index: int
        self.lease: Lease
        self.parts: ShardParts
        self.state: ShardState
        self.barrier: StepBarrier
        self.schedule: Schedule
        self.serving = False
        self._fold: tuple[dict, int] | None = None  # watermarks read, LSO to pass before folding
        self.fold_checks = 0  # times the shard looked at whether it could fold

    # -- life cycle ----------------------------------------------------------------------
    def run(self, stop: threading.Event, ready: threading.Event | None = None) -> None:
        """Recover, then serve until `stop`. Raises ShardLostError if the lease is lost."""
        etcd = self._given_etcd or Etcd.connect(self.endpoints)
        try:
            config = wait_for_job_config(etcd, self.options.job, stop, log)
            if config is None:
                return
            self.index, self.lease = register_pserver(
                etcd, self.options.job, f"{socket.gethostname()}:{os.getpid()}",
                self.options.lease_ttl_s, wait_s=3 * self.options.lease_ttl_s, index=self.options.index)
            log.info("shard %d of job %s registered", self.index, self.options.job)
            try:
                self._serve(etcd, config, stop, ready)
            except ShardLeft as exc:
                log.info("%s; stopping", exc)
                self._unpublish_all()
            finally:
                self.lease.revoke()
        finally:
            if self._given_etcd is None:
                etcd.close()

    def _unpublish_all(self) -> None:
        """Delete every key of this shard from Redis once the job was resized without it: its
        slots' rows are the new owners' now, under their keys, and nobody reads these again.
        Best effort: with Redis away they stay behind (only memory is lost)."""
        conn = self._given_redis or redis_client(self.endpoints)
        removed = 0
        try:
            batch: list[bytes] = []
            # One hash tag: every key of the shard lives in one cluster slot, so each UNLINK is one node's.
            for key in conn.scan_iter(match=self.redis_keys.prefix(self.index) + "*", count=UNPUBLISH_BATCH):
                batch.append(key)
                if len(batch) == UNPUBLISH_BATCH:
                    removed += conn.unlink(*batch)
                    batch = []
            if batch:
                removed += conn.unlink(*batch)
            log.info("shard %d: deleted its %d keys from Redis", self.index, removed)
        except redis.RedisError as exc:
            log.warning("shard %d: could not delete its keys from Redis (%s); they stay behind", self.index, exc)
        finally:
            if self._given_redis is None:
                conn.close()

    def _assemble(self, etcd: Etcd, config: JobConfig) -> int:
        """Make the run's parts (`self.parts`) and its state, loaded from the newest checkpoint
        if there is one; returns the gradient offset that checkpoint saved (0 without)."""
        index = self.index
        metrics = PserverMetrics.for_shard(config.name, index)
        # Sync mode waits at a step barrier; bounded mode only reports trainers' steps.
        self.barrier = StepBarrier(sync=config.train.sgd.holds_at_barrier)
        grads = self.storage.gradient_log(config, index)
        slots_entry = etcd.get(self.keys.slots)
        if slots_entry is None:
            raise CoordinationError(f"job {config.name!r} has no slot map in etcd: start its master first")
        slot_map = SlotMap.from_json(slots_entry.value)
        rule = make_rule(config.pservers.optimizer, lr=config.train.learning_rate)
        store = self.storage.checkpoint_store(config, index)
        checkpoints = CheckpointKeeper(store, etcd, self.keys, index, slot_map, metrics.checkpoint_seconds)
        controller = ShardController(etcd, self.keys, index, store, checkpoints, self)
        restored = store.load_latest(rule, checkpoints.slots)
        resume = 0
        if restored is None:
            self.state = ShardState(rule)
        else:
            self.state = restored.state
            resume = restored.manifest.grad_offsets.get(grads.topic, 0)
            checkpoints.latest = restored.manifest.checkpoint_id
            log.info("shard %d: loaded checkpoint %s, replaying %s from offset %d", index,
                     checkpoints.latest, grads.topic, resume)
        self.state.damp_stale = config.train.damp_stale
        self.state.average_steps = config.train.average_steps
        redis_conn = self._given_redis or redis_client(self.endpoints)
        publishing = BackgroundPublisher(Publisher(redis_conn, config.name, index), self.state,
                                         self.lock, self.options.publish_interval_s,
                                         self.options.housekeeping_s, metrics.publish_seconds)
        if restored is not None:
            publishing.resume(restored.manifest.published_epoch, restored.manifest.published_round)
        self.parts = ShardParts(config=config, etcd=etcd, redis=redis_conn, metrics=metrics, grads=grads,
                                checkpoints=checkpoints, controller=controller, publishing=publishing)
        return resume

    def _serve(self, etcd: Etcd, config: JobConfig, stop: threading.Event, ready: threading.Event | None) -> None:
        resume = self._assemble(etcd, config)
        parts = self.parts
        grads, publishing = parts.grads, parts.publishing
        every = self.options.checkpoint_every_s or config.pservers.checkpoint_every_s
        try:
            grads.start(resume)
            self._replay(stop)
            publishing.round()  # everything, once, before serving
            self.serving = True
            log.info("shard %d serving at version %s after replaying to offset %d", self.index,
                     publishing.version, grads.next_offset)
            if ready is not None:
                ready.set()
            # Frozen, the ~60k long-lived objects of the modules, clients and state are not
            # walked again at every full collection (as in the trainer).
            gc.freeze()
            publishing.start()
            try:
                self._loop(stop, every)
            finally:
                publishing.stop()
                gc.unfreeze()
        finally:
            grads.close()
            if self._given_redis is None:
                parts.redis.close()

    def _replay(self, stop: threading.Event) -> None:
        """Apply everything committed before start-up without publishing row by row: the
        shard publishes everything once replay is done."""
        grads = self.parts.grads
        end = grads.stable_end()
        started, first = time.monotonic(), grads.next_offset
        while grads.next_offset < end and not stop.is_set():
            self._consume(timeout=0.2)
        log.info("shard %d: replayed offsets [%d, %d) in %.1f s", self.index, first,
                 grads.next_offset, time.monotonic() - started)

    def _loop(self, stop: threading.Event, checkpoint_every_s: float) -> None:
        lease, publishing = self.lease, self.parts.publishing
        schedule = self.schedule = Schedule.starting(time.monotonic(), self.options.fold_interval_s,
                                                     self.options.housekeeping_s, checkpoint_every_s)
        while not stop.is_set():
            if lease.lost.is_set():
                raise ShardLostError(f"shard {self.index}: lease lost; stopping so a restart recovers")
            if publishing.error is not None:
                raise publishing.error
            self._consume(timeout=0.05)
            for step in schedule.due(time.monotonic()):
                if step == "fold":
                    ok = self._waiting_out(self._fold_dedup)
                elif step == "housekeeping":
                    self._release()
                    ok = self._waiting_out(self._housekeeping)
                else:
                    ok = self._waiting_out(self.checkpoint)
                schedule.done(step, time.monotonic(), ok)

    def _waiting_out(self, step: Callable[[], object]) -> bool:
        """Run a periodic step; etcd or Redis away fails it, to be tried again at its next
        turn, instead of stopping the shard (it goes on applying what the broker brings)."""
        try:
            step()
            return True
        except (EtcdError, redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("shard %d: %s; trying again later", self.index, exc)
            return False

    # -- applying ------------------------------------------------------------------------
    # The parts are bound to locals once per read of the log, not looked up through
    # `self.parts` per delta. The state and the barrier are read per delta, as a rollback
    # (between two reads) replaces them.
    def _consume(self, timeout: float) -> None:
        parts = self.parts
        publishing = parts.publishing
        note_steps = parts.config.train.sgd.waits_on_steps
        for delta, offset in parts.grads.read(self.state.check, timeout=timeout):
            for ready in self.barrier.offer(delta, offset):
                self._apply_delta(ready, publishing)
            if note_steps:
                self._note_steps(publishing)

    def _note_steps(self, publishing: BackgroundPublisher) -> None:
        """Hand the barrier's position to the publisher: it is written to Redis after the
        round that publishes the steps' changes, so a trainer that sees its step released
        pulls parameters that include it."""
        note = BarrierSteps(self.barrier.next_step, self.barrier.steps()).to_json()
        with self.lock:
            publishing.note(note)

    def _apply_delta(self, delta: GradientDelta, publishing: BackgroundPublisher) -> None:
        try:
            with self.lock:
                changes = self.state.apply(delta)
                publishing.add(changes, delta.trainer_id, delta.step)
        except BadDeltaError as exc:  # fitted when it arrived, not after waiting at a barrier
            self.counters.bad += 1
            log.warning("shard %d: delta %s/%d no longer fits: %s", self.index, delta.task_id, delta.seq, exc)
            return
        if changes is None:
            return  # a duplicate: counted by the dedup ledger
        self.counters.deltas += 1
        self.counters.rows += sum(len(ids) for ids in changes.rows.values())

    def _release(self) -> None:
        """Barrier housekeeping: who is still a live trainer, and what that releases."""
        parts = self.parts
        if not parts.config.train.sgd.waits_on_steps:  # the barrier holds (sync) or reports (bounded)
            return
        self.barrier.live = {self.keys.trainer_of(e.key)
                             for e in parts.etcd.range(self.keys.trainers_prefix, keys_only=True)}
        for ready in self.barrier.release():
            self._apply_delta(ready, parts.publishing)
        self._note_steps(parts.publishing)

    # -- serving -------------------------------------------------------------------------
    def _housekeeping(self) -> None:
        parts = self.parts
        done = parts.controller.poll()
        if done == "leave":
            raise ShardLeft(f"shard {self.index}: the job was resized below it; its slots are others' now")
        if done == "checkpoint":
            self.schedule.requested(time.monotonic())
        stats = self.stats()
        parts.metrics.observe_stats(stats)
        parts.redis.set(self.redis_keys.stats(self.index), stats.to_json())

    def stats(self) -> ShardStats:
        state, parts = self.state, self.parts
        publishing, checkpoints = parts.publishing, parts.checkpoints
        by_partition = state.examples_by_partition()
        assert publishing.version is not None  # taken while serving: after the first round
        return ShardStats(
            shard=self.index, pid=os.getpid(), serving=self.serving, at=time.time(),
            version=publishing.version, offset=parts.grads.next_offset, deltas=self.counters.deltas,
            rows=self.counters.rows, dropped=state.dedup.dropped, bad=self.counters.bad + parts.grads.bad,
            publishes=publishing.publishes, republished=publishing.republished,
            rows_published=publishing.rows, checkpoints=checkpoints.count,
            dedup_entries=state.dedup.entries, fold_checks=self.fold_checks, examples=sum(by_partition.values()),
            damped=state.damped,
            checkpoint=checkpoints.latest,
            barrier=BarrierStats(self.barrier.next_step, self.barrier.waiting, sorted(self.barrier.participants()))
            if self.barrier.sync else None,
            examples_by_partition=dict(by_partition),
            table_rows={name: t.size for name, t in state.tables.items()},
            settled=self.serving and publishing.settled(),
        )

    # -- dedup folding -------------------------------------------------------------------
    def _fold_dedup(self) -> None:
        """Two steps, never in one call: read the master's watermarks, then the topic's log
        end; fold once everything before that end is applied (`fold_ready`), so no delta
        committed before the watermark was read can still be in flight."""
        grads = self.parts.grads
        self.fold_checks += 1
        if self._fold is not None and fold_ready(self._fold[1], self.barrier.applied_below(grads.next_offset)):
            self.state.fold(self._fold[0])
            self._fold = None
        if self._fold is None:
            watermarks = {}
            for entry in self.parts.etcd.range(self.keys.cursors_prefix):
                cursor = PartitionCursor.from_json(entry.value)
                watermarks[(cursor.topic, cursor.partition)] = (cursor.pass_no, cursor.trained)
            if watermarks:
                self._fold = (watermarks, grads.log_end())

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: str | None = None, keep_also: tuple[str, ...] = ()) -> str:
        # Deltas waiting at the sync barrier are consumed but not applied: resume before them.
        grads = self.parts.grads
        resume = self.barrier.applied_below(grads.next_offset)
        return self.parts.checkpoints.take(self.state, {grads.topic: resume}, checkpoint_id, keep_also,
                                           published=self.parts.publishing.position())

    def catch_up(self) -> None:
        """Apply every delta written before now (a requested checkpoint must hold them)."""
        grads = self.parts.grads
        end = grads.log_end()
        while grads.next_offset < end:
            self._consume(timeout=0.2)

    def adopt(self, state: ShardState) -> int:
        """Serve `state` (a rolled-back one) from now on: republished in place of the current
        one (rows it lacks deleted from Redis), the barrier and a pending fold forgotten, and
        every gradient written so far skipped. Returns the offset the skipping ends at."""
        grads, publishing = self.parts.grads, self.parts.publishing
        end = grads.log_end()  # every gradient written before the rollback request is from before
        state.damp_stale, state.average_steps = self.state.damp_stale, self.state.average_steps
        with publishing.round_lock, self.lock:
            publishing.unpublish_missing(self.state, state)
            self.state = publishing.state = state
            publishing.republish()
        self.barrier = StepBarrier(sync=self.barrier.sync)
        self._fold = None  # watermarks read before the rollback would drop the replayed tasks
        grads.seek(end)
        return end
