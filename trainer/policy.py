"""A trainer's decisions about a task, as pure functions: how many mini-batches a push of it
holds, how a task whose training raised ends, and when the trainer heartbeats it. The worker
(worker.py) does what they say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis
from confluent_kafka import KafkaException

from streamtrain.infra.schema_registry import RegistryUnavailableError
from streamtrain.jobstate.errors import EtcdError, TaskLostError
from streamtrain.params.paramstore import ParamsUnavailableError
from streamtrain.schemas import StreamtrainError
from streamtrain.trainer.delivery import DeliveryError
from streamtrain.trainer.loader import LoaderDiedTwiceError
from streamtrain.trainer.reader import RangeReadError

REGISTRY_AWAY_S = 5.0  # a schema registry that did not answer is asked again after this
ETCD_AWAY_S = 1.0  # etcd did not answer in time: the next claim waits this long
# A task's completion that etcd did not answer is tried again after each of these: its outputs
# are committed, and dropping it waited out the task's timeout (30 s by default) before a
# redo, the longest stall of a job whose etcd leader died (its members elect another in
# seconds).
COMPLETE_RETRY_S = (0.5, 1.0, 2.0)
KAFKA_AWAY_S = 2.0  # the broker did not answer for 30 s: the next claim waits this long

Ending = Literal["released", "lost", "failed"]

# `train.push_every = "auto"`: about this many mini-batches of all live trainers in flight at
# once, and at most AUTO_GROUP_MAX in one push. Two trainers at 4 keep the AUC of 2 at less
# CPU a record; four trainers lose AUC at 4, none at 2 (bench/RESULTS.md, "larger push groups
# while few trainers share the model").
AUTO_IN_FLIGHT = 8
AUTO_GROUP_MAX = 4


def group_size(push_every: int | str, live_trainers: int) -> int:
    """Mini-batches a push of a task claimed now holds: `push_every` as set, or for "auto"
    AUTO_IN_FLIGHT shared among the live trainers (this one counted even if its registration
    is not seen yet), within 1..AUTO_GROUP_MAX."""
    if push_every != "auto":
        return int(push_every)
    return max(1, min(AUTO_GROUP_MAX, AUTO_IN_FLIGHT // max(1, live_trainers)))


class Stopped(StreamtrainError):  # noqa: N818  a signal to unwind, not a failure
    """The trainer was asked to stop in the middle of a task: it gives the task back."""


@dataclass(frozen=True)
class TaskEnd:
    """`ending`: the task goes back to the queue at once ("released": no attempt counted),
    waits out its timeout ("lost": no longer ours, or maybe not), or is failed ("failed":
    an attempt counted, with the reason). `wait_s`: before the trainer claims again. `why`:
    the log line's ending (empty: the error says it all). `behind`: a task given back goes
    behind the tasks waiting. `stops`: the trainer stops after the task ended so."""

    ending: Ending
    wait_s: float = 0.0
    why: str = ""
    behind: bool = False  # released behind the tasks waiting, not first in line (the retry lane)
    stops: bool = False  # then the trainer stops, with the error


def task_end(exc: BaseException) -> TaskEnd | None:
    """How a task whose training raised `exc` ends; None: `exc` is about the trainer or its
    services, not the task (a broken producer, a client error), and stops the trainer, its task
    left to be requeued without an attempt counted."""
    if isinstance(exc, Stopped):
        return TaskEnd("released")
    if isinstance(exc, ParamsUnavailableError):
        return TaskEnd("released", exc.retry_after, "giving the task back")
    if isinstance(exc, RegistryUnavailableError):
        # Its records are not bad, only unreadable for now: the task waits for the registry.
        return TaskEnd("released", REGISTRY_AWAY_S, "giving the task back")
    if isinstance(exc, TaskLostError):
        return TaskEnd("lost")
    if isinstance(exc, EtcdError):
        # etcd unreachable for a moment (or this process was frozen past a call's deadline):
        # drop the task; it times out and is requeued if it was still ours.
        return TaskEnd("lost", ETCD_AWAY_S, "dropping the task in hand")
    if isinstance(exc, DeliveryError) and exc.refused or isinstance(exc, LoaderDiedTwiceError):
        # Every attempt would meet it again: an attempt counted, so it ends in failed.
        return TaskEnd("failed", 0.0, "failing the task")
    if isinstance(exc, (RangeReadError, DeliveryError)):
        # The broker away (or only this partition's leader): no fault of the task's, whose
        # attempts a broker restarting now and then would otherwise use up (its records then
        # dropped as failed). Behind the tasks waiting: first in line, every trainer in turn
        # would spend 30 s on it while its partition is away.
        return TaskEnd("released", KAFKA_AWAY_S, "giving the task back", behind=True)
    if isinstance(exc, (StreamtrainError, redis.RedisError, KafkaException, OSError)):
        return None
    # Raised by training this task (the model on its records, its size): an attempt counted,
    # so a task that keeps raising ends in failed; the trainer stops, as after any error.
    return TaskEnd("failed", 0.0, "failing the task; the trainer stops", stops=True)


def heartbeat_due(since_s: float, timeout_s: float) -> bool:
    """Whether a task last heartbeaten `since_s` ago must be heartbeaten now: every third of
    its timeout, so two heartbeats can be late before the master requeues it."""
    return since_s > timeout_s / 3
