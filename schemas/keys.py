"""Names every process must agree on: etcd keys, Redis keys and Kafka topics of one job, and
the label of an input partition in the documents that count by partition. Each name that is
read back has its parser here, next to the function that makes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._check import U32_MAX, U64_MAX, Check

TaskState = Literal["todo", "pending", "done", "failed"]
Control = Literal["pause", "checkpoint", "rollback", "resize"]
TASK_STATES: tuple[TaskState, ...] = ("todo", "pending", "done", "failed")
CONTROLS: tuple[Control, ...] = ("pause", "checkpoint", "rollback", "resize")

_job_check = Check("Job")
_etcd_check = Check("EtcdKeys")
_redis_check = Check("RedisKeys")
_topic_check = Check("Topics")
_partition_check = Check("PartitionLabel")
# Loose on purpose (trainer ids are often host-pid-uuid); only what would break the key layout.
_SEGMENT_MAX = 1024


def validate_job_name(name: str) -> str:
    """Return ``name`` if it can prefix Kafka topics and etcd and Redis keys.

    Raises: SchemaError (field ``job.name``) unless it is ``[A-Za-z0-9._-]{1,100}``.
    """
    return _job_check.job("job.name", name)


@dataclass(frozen=True)
class EtcdKeys:
    """The keys under ``/streamtrain/<job>/``; ``*_prefix`` and ``tasks()`` end in '/' for range reads.

    Raises: SchemaError for a bad job name, or for a key part that would change the layout.
    """

    job: str

    def __post_init__(self) -> None:
        validate_job_name(self.job)

    @property
    def prefix(self) -> str:
        return f"/streamtrain/{self.job}/"

    @property
    def master_lock(self) -> str:
        return f"{self.prefix}master/lock"

    @property
    def config(self) -> str:
        return f"{self.prefix}config"

    @property
    def state(self) -> str:
        """`JobState`: a bounded job is finished after its last pass."""
        return f"{self.prefix}state"

    @property
    def ps_desired(self) -> str:
        """The number of shards the master wants (`pservers.count`), in decimal: its value is
        made by `ps_desired_value` and read by `ps_desired_of`."""
        return f"{self.prefix}ps_desired"

    def ps_desired_value(self, count: int) -> bytes:
        """What `ps_desired` holds for `count` shards: the decimal integer, in ASCII."""
        return str(_etcd_check.integer("ps_desired", count, hi=U32_MAX)).encode()

    def ps_desired_of(self, value: object) -> int:
        """The shard count `ps_desired` holds.

        Raises: SchemaError (field ``ps_desired``), naming the key and the value, unless
        `value` is bytes in canonical decimal (no sign, spaces or leading zeros) up to 2**32-1.
        """
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else ""
        if not (text.isascii() and text.isdigit() and len(text) <= 10 and str(int(text)) == text
                and int(text) <= U32_MAX):
            raise _etcd_check.error("ps_desired", f"{value!r} at {self.ps_desired} is not a decimal shard count")
        return int(text)

    @property
    def ps_prefix(self) -> str:
        return f"{self.prefix}ps/"

    def ps(self, index: int) -> str:
        return f"{self.ps_prefix}{_etcd_check.integer('ps.index', index, hi=U32_MAX)}"

    def ps_index_of(self, key: str) -> int:
        """The shard index of a key under `ps_prefix`."""
        index = self._below(self.ps_prefix, key, "ps.index")
        if not index.isdigit() or self.ps(int(index)) != key:
            raise _etcd_check.error("ps.index", f"{key!r} is not a pserver key")
        return int(index)

    @property
    def trainers_prefix(self) -> str:
        return f"{self.prefix}trainers/"

    def trainer(self, trainer_id: str) -> str:
        return f"{self.trainers_prefix}{_segment('trainer_id', trainer_id)}"

    def trainer_of(self, key: str) -> str:
        """The trainer id of a key under `trainers_prefix`."""
        return _segment("trainer_id", self._below(self.trainers_prefix, key, "trainer_id"))

    @property
    def cursors_prefix(self) -> str:
        return f"{self.prefix}cursor/"

    def cursor(self, topic: str, partition: int) -> str:
        topic = _etcd_check.topic("cursor.topic", topic)
        partition = _etcd_check.integer("cursor.partition", partition, hi=2**31 - 1)
        return f"{self.cursors_prefix}{topic}/{partition}"

    @property
    def tasks_prefix(self) -> str:
        return f"{self.prefix}tasks/"

    def tasks(self, state: TaskState) -> str:
        if state not in TASK_STATES:
            raise _etcd_check.error("tasks.state", f"{state!r} is not one of {TASK_STATES}")
        return f"{self.prefix}tasks/{state}/"

    def task(self, state: TaskState, task_id: str) -> str:
        return f"{self.tasks(state)}{_segment('task_id', task_id)}"

    @property
    def retry_prefix(self) -> str:
        """todo's retry lane, ``tasks/todo/retry/``: tasks given back, claimed before the rest of
        todo (docs/master.md). Inside ``tasks("todo")``, so every count and read of todo holds
        them; no task id has a '/', so none of the rest is under it."""
        return f"{self.tasks('todo')}retry/"

    def task_back(self, state: TaskState, task_id: str) -> str:
        """Where a task whose attempt ended goes in `state`: to do again is the retry lane."""
        return f"{self.retry_prefix}{_segment('task_id', task_id)}" if state == "todo" else self.task(state, task_id)

    def task_id_of(self, key: str) -> str:
        """The task id of a key under `tasks(state)`, whichever the state or lane."""
        state, _, task_id = self._below(self.tasks_prefix, key, "task_id").partition("/")
        if state not in TASK_STATES:
            raise _etcd_check.error("tasks.state", f"{key!r} is not a task key")
        if state == "todo" and task_id.startswith("retry/"):
            task_id = task_id[len("retry/"):]
        return _segment("task_id", task_id)

    @property
    def slots(self) -> str:
        return f"{self.prefix}slots"

    @property
    def checkpoints_prefix(self) -> str:
        return f"{self.prefix}checkpoints/"

    @property
    def checkpoints_latest(self) -> str:
        return f"{self.prefix}checkpoints/latest"

    def checkpoint(self, checkpoint_id: str) -> str:
        """The prefix under which one checkpoint's per-shard entries live."""
        return f"{self.prefix}checkpoints/{_etcd_check.checkpoint_id('checkpoint_id', checkpoint_id)}/"

    def checkpoint_job(self, checkpoint_id: str) -> str:
        """The job's side of a job-wide checkpoint: cursors and task queues as they were."""
        return f"{self.checkpoint(checkpoint_id)}job"

    def checkpoint_rolled_back(self, checkpoint_id: str, shard: int) -> str:
        """A shard's acknowledgement that it rolled back to the checkpoint."""
        return f"{self.checkpoint(checkpoint_id)}rolled/{_etcd_check.integer('shard', shard, hi=U32_MAX)}"

    def checkpoint_shard(self, checkpoint_id: str, shard: int) -> str:
        return f"{self.checkpoint(checkpoint_id)}{_etcd_check.integer('shard', shard, hi=U32_MAX)}"

    def checkpoint_path(self, key: str) -> tuple[str, ...]:
        """The segments of a key under `checkpoints_prefix`: ("latest",), (id, "job"),
        (id, "<shard>") or (id, "rolled", "<shard>")."""
        return tuple(self._below(self.checkpoints_prefix, key, "checkpoint").split("/"))

    def _below(self, prefix: str, key: str, field: str) -> str:
        if not isinstance(key, str) or not key.startswith(prefix) or len(key) == len(prefix):
            raise _etcd_check.error(field, f"{key!r} is not a key under {prefix}")
        return key[len(prefix):]

    def control(self, name: Control) -> str:
        if name not in CONTROLS:
            raise _etcd_check.error("control.name", f"{name!r} is not one of {CONTROLS}")
        return f"{self.prefix}control/{name}"


@dataclass(frozen=True)
class RedisKeys:
    """A job's keys and channels in Redis, every one a shard's, under ``st:{<job>:<shard>}:``.

    The braces are a Redis Cluster hash tag: all of a shard's keys (its rows, blocks, rounds
    stream, applied steps, flush mark, version) hash to one slot, so a shard's publish is one
    single-slot transaction and a pull one transaction per shard, on whichever node holds it.
    On a single Redis the braces are only part of the name. Ids and blocks are decimal and
    always last, so a param or table name containing ':' still splits unambiguously from the
    right.

    Raises: SchemaError for a bad job name, or an empty name or out-of-range id.
    """

    job: str

    def __post_init__(self) -> None:
        validate_job_name(self.job)

    def prefix(self, shard: int) -> str:
        """Every key of `shard` starts with this; its hash tag is the job and the shard."""
        return f"st:{{{self.job}:{_redis_check.integer('shard', shard, hi=U32_MAX)}}}:"

    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every key of the job (and no other job's)."""
        return f"st:{{{self.job}:*"

    def dense(self, shard: int, param: str, block: int) -> str:
        param = _redis_check.name("param", param)
        return f"{self.prefix(shard)}dense:{param}:{_redis_check.integer('block', block, hi=U32_MAX)}"

    def served(self, shard: int, param: str, block: int) -> str:
        """The block as scored (`train.average_steps`: an average of its recent values);
        written with `dense` in each round."""
        param = _redis_check.name("param", param)
        return f"{self.prefix(shard)}served:{param}:{_redis_check.integer('block', block, hi=U32_MAX)}"

    def row(self, shard: int, table: str, row_id: int) -> str:
        return f"{self.row_prefix(shard, table)}{_redis_check.integer('id', row_id, hi=U64_MAX)}"

    def rows(self, shard: int, table: str, ids: np.ndarray) -> list[str]:
        """``row(shard, table, id)`` for each id, in order; validated as one array, formatted
        in C loops."""
        if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise _redis_check.error("ids", "expected a 1-D integer numpy array")
        if ids.dtype.kind == "i" and ids.size and ids.min() < 0:
            raise _redis_check.error(f"ids[{int(np.argmax(ids < 0))}]", "negative id")
        return list(map(self.row_prefix(shard, table).__add__, map(str, ids.tolist())))

    def row_prefix(self, shard: int, table: str) -> str:
        """A row's key without its id."""
        return f"{self.prefix(shard)}row:{_redis_check.name('table', table)}:"

    def version(self, shard: int) -> str:
        return f"{self.prefix(shard)}version"

    def steps(self, shard: int) -> str:
        """Sync/bounded SGD: {"next": first step not yet released, "trainers": {id: newest step}}."""
        return f"{self.prefix(shard)}steps"

    def steps_written(self, shard: int) -> str:
        """A pub/sub channel: the shard's `steps` document each time it is written, so a
        trainer waiting at the sync or bounded gate wakes when it changes instead of polling."""
        return f"{self.prefix(shard)}steps-written"

    def applied(self, shard: int) -> str:
        """Per trainer, the newest step of it this shard has applied (or dropped as a
        duplicate) and published (`AppliedSteps`). Written with the values it describes, so a
        trainer can tell which of its own pushes a pull already includes."""
        return f"{self.prefix(shard)}applied"

    def published(self, shard: int, trainer_id: str) -> str:
        """A pub/sub channel: each publish round that carries a newer step of `trainer_id`
        than the round before sends the step here, so that trainer, waiting for its pushes,
        wakes when one is published instead of polling `applied(shard)`."""
        return f"{self.prefix(shard)}published:{_redis_check.text('trainer_id', trainer_id)}"

    def rounds(self, shard: int) -> str:
        """A stream of the shard's publish rounds (`PublishedRound`, field ``r``), newest few
        hundred kept: trainers follow it to keep the rows they hold current."""
        return f"{self.prefix(shard)}rounds"

    def flushed(self, shard: int) -> str:
        """The round of the shard's last flush of its row keys: its stream id in `rounds` and
        its epoch (`FlushMark`)."""
        return f"{self.prefix(shard)}flushed"

    def stats(self, shard: int) -> str:
        """A shard's counters (`ShardStats`: applied, dropped duplicates, bad deltas, examples)."""
        return f"{self.prefix(shard)}stats"


@dataclass(frozen=True)
class Topics:
    """The job's own Kafka topics (input topics are named in the job file)."""

    job: str

    def __post_init__(self) -> None:
        validate_job_name(self.job)

    @property
    def examples(self) -> str:
        return f"{self.job}.examples"

    def grad(self, shard: int) -> str:
        """One partition per shard topic: the total order pservers replay in."""
        return f"{self.job}.grad.{_topic_check.integer('shard', shard, hi=U32_MAX)}"

    @property
    def dlq(self) -> str:
        return f"{self.job}.dlq"

    @property
    def metrics(self) -> str:
        return f"{self.job}.metrics"


def partition_label(topic: str, partition: int) -> str:
    """`<topic>:<partition>`: an input partition as a key of the JSON maps that count by
    partition (a shard's `ShardStats.examples_by_partition`, a checkpoint's
    `input_watermarks`, the live view's lag). A topic name has no ':', so it splits back."""
    return f"{topic}:{partition}"


def partition_of(label: object) -> tuple[str, int]:
    """The (topic, partition) a `partition_label` names.

    Raises: SchemaError unless `label` is a topic name, ':', and a partition in canonical
    decimal below 2**31 (as Kafka numbers them)."""
    topic, sep, partition = label.rpartition(":") if isinstance(label, str) else ("", "", "")
    if not (sep and partition.isascii() and partition.isdigit() and len(partition) <= 10
            and str(int(partition)) == partition and int(partition) < 2**31):
        raise _partition_check.error("partition", f"{label!r} is not '<topic>:<partition>'")
    return _partition_check.topic("topic", topic), int(partition)


def _segment(field: str, value: object) -> str:
    """One etcd key segment: a '/' or whitespace inside would move the key elsewhere."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _SEGMENT_MAX
        or "/" in value
        or not value.isprintable()
        or any(c.isspace() for c in value)
    ):
        raise _etcd_check.error(field, f"{value!r} is not a key segment (printable, no '/' or spaces)")
    return value
