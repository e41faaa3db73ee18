"""What a trainer builds once it knows its job's config: `TrainerParts`, made in one place by
`assemble`, so the trainer (worker.py) declares everything it holds in its `__init__` and
adds nothing later.

(These are the trainer process's parts as one job's run wires them; the pieces themselves,
decoders, features, models, are tested without services in tests/unit/test_trainer_parts.py.)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import torch

from streamtrain.infra import Endpoints
from streamtrain.infra.clients import redis_client
from streamtrain.infra.metrics import TrainerMetrics
from streamtrain.jobstate.errors import CoordinationError
from streamtrain.jobstate.etcd import Etcd
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.jobstate.tasks import TaskClient
from streamtrain.params.optimizers import make_rule
from streamtrain.params.paramstore import ParamClient
from streamtrain.params.watches import AppliedWatch
from streamtrain.schemas import EtcdKeys, Topics
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.broker import Broker
from streamtrain.trainer.committer import Committer, Ended
from streamtrain.trainer.delivery import Delivery
from streamtrain.trainer.groups import GroupTrainer, rows_in_flight
from streamtrain.trainer.loader import RecordLoader
from streamtrain.trainer.models import SparseModel, build_model, model_spec, use_torch_threads
from streamtrain.trainer.own import OwnPushes, OwnRows, clock_floor
from streamtrain.trainer.params import DenseLayout, GradientBuffer, ParamSync, RowLayout
from streamtrain.trainer.replica import RowReplica
from streamtrain.trainer.steps import InFlight, StepGate

log = logging.getLogger(__name__)

REDIS_AWAY_MAX_S = 5.0  # the longest wait between asking a Redis away at start-up again


@dataclass(frozen=True, slots=True)
class ShardedParts:
    """The parts of a trainer's run that route by shard, made again when the job is resized."""

    slot_map: SlotMap
    revision: int  # the etcd revision the slot map was written at
    buffer: GradientBuffer
    own: OwnPushes
    groups: GroupTrainer
    gate: StepGate
    applied_watch: AppliedWatch
    in_flight: InFlight | None  # async SGD only
    first_step: int  # the step of the trainer's first push under this map

    def close(self) -> None:
        self.applied_watch.close()
        self.gate.close()


@dataclass(frozen=True, slots=True)
class TrainerParts:
    """One job's run of a trainer, wired: fixed from its start to its end, but for the parts
    that route by shard (`sharded`), made again if the job is resized. The parts keep their
    own state (the buffer its deltas, the committer its thread). What does change, the
    membership lease and the step, the trainer holds itself."""

    config: JobConfig
    etcd: Etcd
    redis: redis.Redis  # the trainer's own unless it was given one
    topics: Topics
    tasks: TaskClient
    chunk_records: int  # records the loader decodes at a time
    loader: RecordLoader  # started, maybe not ready yet
    model: SparseModel  # built by `build_model`
    layout: DenseLayout  # the model's dense parameters as blocks, with their initial values
    delivery: Delivery
    committer: Committer
    sharded: ShardedParts

def assemble(config: JobConfig, trainer_id: str, *, etcd: Etcd, redis_conn: redis.Redis | None,
             endpoints: Endpoints, broker: Broker, device: torch.device, obs: TrainerMetrics,
             ended: Callable[[Ended], None]) -> TrainerParts:
    """The parts of `trainer_id`'s run of the job `config` (a registered trainer's): the tasks a
    predecessor under the same id still held are requeued, the job's topics made sure of and
    the record loader started. `redis_conn`: the client to use instead of connecting to
    `endpoints`; `ended`: called on the committer's thread as each task ends.

    Raises:
        CoordinationError: the job has no slot map (its master never started).
    """
    topics = Topics(config.name)
    tasks = TaskClient.for_job(etcd, config.name, trainer_id)
    for task_id in tasks.requeue_predecessors():
        log.warning("trainer %s: task %s was still held under this id by a predecessor; requeued",
                    trainer_id, task_id)
    slot_map, revision = slot_map_of(etcd, config.name)
    broker.ensure_topics(config, slot_map.shards)
    spec = model_spec(config)
    # Started first: the child's imports overlap the rest of the start-up. Records are
    # decoded in chunks large enough to amortise the per-chunk numpy calls.
    chunk_records = max(config.model.batch_size, 4096)
    loader = broker.loader(config, trainer_id, spec.fields, spec.dense_features, chunk_records)
    use_torch_threads(config)
    model = build_model(config).to(device)
    # The dense blocks' initial values are the model's as built: taken once, never from a
    # model that has trained (the shards hold only what training added, trainer/params.py).
    layout = DenseLayout(model)
    layout.load({})
    redis_conn = redis_conn or redis_client(endpoints)
    wait_for_redis(redis_conn, trainer_id)
    sharded = _sharded(config, trainer_id, slot_map, revision, model, layout, redis_conn, device, obs)
    delivery = broker.delivery(config, trainer_id)
    committer = Committer(delivery, tasks, ended)
    return TrainerParts(config=config, etcd=etcd, redis=redis_conn, topics=topics, tasks=tasks,
                        chunk_records=chunk_records, loader=loader, model=model, layout=layout, delivery=delivery,
                        committer=committer, sharded=sharded)


def resharded(parts: TrainerParts, trainer_id: str, broker: Broker, device: torch.device,
              obs: TrainerMetrics) -> TrainerParts:
    """`parts` under the job's slot map as etcd has it now (a resize, streamtrain/operations/resizing.py):
    the parts that route by shard made again; the model, loader, delivery and committer kept.
    Call between tasks, with no push of this trainer in flight."""
    slot_map, revision = slot_map_of(parts.etcd, parts.config.name)
    broker.ensure_topics(parts.config, slot_map.shards)
    parts.sharded.close()
    sharded = _sharded(parts.config, trainer_id, slot_map, revision, parts.model, parts.layout, parts.redis,
                       device, obs)
    return dataclasses.replace(parts, sharded=sharded)


def wait_for_redis(redis_conn: redis.Redis, trainer_id: str, most_s: float = REDIS_AWAY_MAX_S) -> None:
    """Until Redis answers, waiting with backoff: a trainer started while Redis restarts
    would otherwise exit on its first read and be restarted in a loop."""
    wait_s = 0.25
    while True:
        try:
            redis_conn.ping()
            return
        except redis.RedisError as exc:
            log.warning("trainer %s: Redis did not answer (%s); asking again in %.2f s", trainer_id, exc, wait_s)
        time.sleep(wait_s)
        wait_s = min(2 * wait_s, most_s)


def slot_map_of(etcd: Etcd, job: str) -> tuple[SlotMap, int]:
    """The job's slot map and the etcd revision it was written at.

    Raises:
        CoordinationError: the job has no slot map (its master never started).
    """
    slots = etcd.get(EtcdKeys(job).slots)
    if slots is None:
        raise CoordinationError(f"job {job!r} has no slot map in etcd: start its master first")
    return SlotMap.from_json(slots.value), slots.mod_revision


def _sharded(config: JobConfig, trainer_id: str, slot_map: SlotMap, revision: int, model: SparseModel,
             layout: DenseLayout, redis_conn: redis.Redis, device: torch.device, obs: TrainerMetrics) -> ShardedParts:
    shards = slot_map.shards
    rows = RowLayout.of(model.tables)
    client = ParamClient(redis_conn, config.name, slot_map)
    sync = ParamSync(client, layout, replica=RowReplica(rows.name, rows.width, shards))
    buffer = GradientBuffer(slot_map, shards)
    # Read-your-writes (trainer/own.py): the dense changes of the pushes the shards have not
    # published yet are added to every pull, estimated with the job's own update rule.
    rule = make_rule(config.pservers.optimizer, lr=config.train.learning_rate)
    own = OwnPushes(rule, trainer_id, shards)
    # Rows are estimated when a step may train before the shards publish an earlier one:
    # within a push group, and after pushes a trainer may leave in flight.
    own_rows = OwnRows(rule, rows.width) if config.train.push_every != 1 or rows_in_flight(config) else None
    groups = GroupTrainer(config, model, layout, rows, sync, buffer, own, own_rows, slot_map, device, obs)
    gate = StepGate(redis_conn, config.name, shards, config.train.sgd, config.train.staleness,
                    trainer_id, max_wait_s=max(1.0, config.tasks.timeout_s / 3))
    applied_watch = AppliedWatch(redis_conn, config.name, shards, trainer_id)
    in_flight = InFlight(config.train.max_in_flight, applied_watch.wait, trainer_id,
                         max_wait_s=max(1.0, config.tasks.timeout_s / 3)
                         ) if config.train.sgd.limits_in_flight else None
    first_step = gate.first_step() if gate.active else own.first_step(client.applied(), clock_floor(time.time()))
    return ShardedParts(slot_map=slot_map, revision=revision, buffer=buffer, own=own, groups=groups, gate=gate,
                        applied_watch=applied_watch, in_flight=in_flight, first_step=first_step)
