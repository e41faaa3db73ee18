"""The job file's sections, one frozen dataclass per TOML table, each checking its values as it
is built (config_rules.py). Internal to schemas/config.py, which re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum

from streamtrain.schemas.config_rules import (
    _JOB,
    _REGISTERED,
    _URI,
    _URL,
    CsvColumn,
    JobConfigError,
    _bool,
    _choice,
    _csv_columns,
    _fix,
    _int,
    _positive,
    _push_every,
    _ref,
    _show,
    _topics,
)
from streamtrain.schemas.fields import DeclaredFields, FieldsError, parse_fields


@dataclass(frozen=True)
class JobSection:
    """``[job]``: the job's identity.

    Attributes:
        name: prefixes the job's Kafka topics (``<name>.grad.<i>``, ``<name>.dlq``,
            ``<name>.metrics``), etcd keys (``/streamtrain/<name>/``) and Redis keys
            (``st:{<name>:<shard>}:``); ``[A-Za-z0-9._-]{1,100}``, not ``.`` or ``..``. Required.
    """

    name: str

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not _JOB.fullmatch(name) or name in (".", ".."):
            raise JobConfigError(
                "job.name",
                f"must be 1..100 of [A-Za-z0-9._-] and not '.' or '..' (it prefixes Kafka topics, "
                f"etcd keys and Redis keys), got {_show(name)}",
            )


@dataclass(frozen=True)
class InputSection:
    """``[input]``: what the job trains on.

    Attributes:
        topics: the Kafka topics to read (required, non-empty, no duplicates).
        format: record decoding: ``json``, ``binary``, ``csv``, ``avro``, ``protobuf`` or a
            ``"module:callable"``.
        csv_columns: the CSV columns in file order; non-empty exactly when format is ``csv``.
        fields: the paths of a log's own records the model trains on (``[input.fields]``,
            schemas/fields.py): with ``json``, None means the records are streamtrain's Example
            documents; ``avro`` and ``protobuf`` require it.
        registry: with ``avro`` or ``protobuf``, the URL of Confluent's REST API on the schema registry that
            holds the records' writer schemas; empty: the local one (`streamtrain up --registry`,
            or ``STREAMTRAIN_REGISTRY``).
        passes: 0 = online input, follow the live stream forever; N >= 1 = bounded input, the
            end offsets are snapshotted at job start and that data is trained N times.
        start_from: ``earliest`` or ``latest``: where a partition's cursor starts when the
            master first sees it.
    """

    topics: tuple[str, ...]
    format: str = "json"
    csv_columns: tuple[CsvColumn, ...] = ()
    fields: DeclaredFields | None = None
    registry: str = ""
    passes: int = 0
    start_from: str = "earliest"

    def __post_init__(self) -> None:
        _fix(self, topics=_topics("input.topics", self.topics))
        fmt = _choice("input.format", self.format, ("json", "binary", "csv", "avro", "protobuf"), ref=True)
        _fix(self, csv_columns=_csv_columns("input.csv_columns", self.csv_columns, fmt))
        if fmt in _REGISTERED and self.fields is None:
            raise JobConfigError("input.fields", f"is required when input.format = {fmt!r}: the paths of the "
                                 "records' fields the model trains on (docs/your-topic.md)")
        if self.fields is not None:
            if fmt not in ("json", *_REGISTERED):
                raise JobConfigError("input.fields", f"only applies when input.format is 'json', 'avro' or "
                                     f"'protobuf' (it is {fmt!r})")
            try:
                _fix(self, fields=parse_fields("input.fields", self.fields))
            except FieldsError as exc:
                raise JobConfigError(exc.key, exc.reason) from None
        if not isinstance(self.registry, str) or (self.registry and not _URL.fullmatch(self.registry)):
            raise JobConfigError("input.registry", f"must be an http(s) URL, got {_show(self.registry)}")
        if self.registry and fmt not in _REGISTERED:
            raise JobConfigError("input.registry", f"only applies when input.format is 'avro' or 'protobuf' (it is "
                                 f"{fmt!r}); remove it")
        passes = _int("input.passes", self.passes, 0)
        start_from = _choice("input.start_from", self.start_from, ("earliest", "latest"))
        # Bounded input is "the records up to the end offsets snapshotted at start": starting
        # at the latest offset would make that an empty data set, silently.
        if passes >= 1 and start_from == "latest":
            raise JobConfigError(
                "input.start_from",
                "must be 'earliest' when input.passes >= 1 (bounded input starting at the latest "
                "offset holds no records), got 'latest'",
            )


@dataclass(frozen=True)
class TasksSection:
    """``[tasks]``: how the master slices partitions into tasks and retries them.

    Attributes:
        max_records: a task never spans more records (offsets) than this.
        linger_ms: at the head of a live stream, cut a partial task after this long.
        timeout_s: a claimed task not heartbeaten within this is requeued (no attempt counted).
        max_attempts: a task its trainers failed this many times goes to ``failed``.
        max_todo: the slicer stops cutting while this many tasks wait in ``todo``.
        max_failed_kept: how many failed tasks stay in etcd for inspection (oldest dropped).
    """

    max_records: int = 8192
    linger_ms: int = 500
    timeout_s: float = 30.0
    max_attempts: int = 3
    # Back-pressure: when trainers fall behind, the backlog stays in Kafka, which is built to
    # hold it, instead of turning into thousands of etcd keys.
    max_todo: int = 1000
    max_failed_kept: int = 1000

    def __post_init__(self) -> None:
        _fix(
            self,
            max_records=_int("tasks.max_records", self.max_records, 1),
            linger_ms=_int("tasks.linger_ms", self.linger_ms, 0),
            timeout_s=_positive("tasks.timeout_s", self.timeout_s),
            max_attempts=_int("tasks.max_attempts", self.max_attempts, 1),
            max_todo=_int("tasks.max_todo", self.max_todo, 1),
            max_failed_kept=_int("tasks.max_failed_kept", self.max_failed_kept, 0),
        )


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: what the trainers build.

    Attributes:
        factory: ``"module.path:callable"`` returning the torch module; imported by trainers only.
        embedding_dim: width of each sparse feature's embedding rows.
        hash_buckets: sparse ids, salted by their field name, are hashed into one range of this
            many rows shared by all fields.
        batch_size: examples per mini-batch.
        sparse_fields: the examples' sparse fields the model reads, in model order.
        dense_features: how many dense features each example carries.
    """

    factory: str = "streamtrain.trainer.models:LogisticRegression"
    embedding_dim: int = 16
    hash_buckets: int = 2**20
    batch_size: int = 256
    sparse_fields: tuple[str, ...] = ()
    dense_features: int = 0

    def __post_init__(self) -> None:
        _ref("model.factory", self.factory)
        _int("model.embedding_dim", self.embedding_dim, 1)
        _int("model.hash_buckets", self.hash_buckets, 1)
        _int("model.batch_size", self.batch_size, 1)
        _int("model.dense_features", self.dense_features, 0, 1 << 16)
        _fix(self, sparse_fields=_field_names("model.sparse_fields", self.sparse_fields))


def _field_names(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise JobConfigError(key, f"must be a list of field names, got {_show(value)}")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or not name.isprintable() or len(name.encode()) > 255:
            raise JobConfigError(f"{key}[{i}]", f"must be a field name (1-255 printable bytes), got {_show(name)}")
        if name in seen:
            raise JobConfigError(f"{key}[{i}]", f"{name!r} is listed twice")
        seen.add(name)
    return tuple(value)


class SgdMode(StrEnum):
    """``train.sgd``: how trainers and shards keep in step. A ``StrEnum``, so the job file, the
    JSON in etcd and comparisons with the plain strings are unchanged; code asks the
    predicates below, never the name.

    ``async``: shards apply deltas as they arrive; a trainer bounds only its own pushes not yet
    published (``train.max_in_flight``). ``sync``: shards hold step k's deltas until every live
    trainer's step k arrived (pserver/barrier.py). ``bounded``: shards apply at once; a trainer
    waits until its own step is published and while it is more than ``train.staleness`` steps
    ahead of the slowest (trainer/steps.py).
    """

    ASYNC = "async"
    SYNC = "sync"
    BOUNDED = "bounded"

    @property
    def holds_at_barrier(self) -> bool:
        """Shards hold a step's deltas at a barrier until every live trainer's copy of that
        step arrived (sync); the trainer's steps then start at the barrier's step."""
        return self is SgdMode.SYNC

    @property
    def waits_on_steps(self) -> bool:
        """Shards keep and publish every trainer's steps (`BarrierSteps`) and a trainer waits
        on them after each push (`trainer.steps.StepGate`): sync and bounded."""
        return self is not SgdMode.ASYNC

    @property
    def limits_in_flight(self) -> bool:
        """A trainer waits only for its own pushes, while more than `train.max_in_flight` are
        unpublished (`trainer.steps.InFlight`): async, the one mode that setting applies to."""
        return self is SgdMode.ASYNC

    @property
    def bounds_staleness(self) -> bool:
        """`train.staleness` bounds how far a trainer runs ahead of the slowest: bounded."""
        return self is SgdMode.BOUNDED


@dataclass(frozen=True)
class TrainSection:
    """``[train]``: how trainers and pservers exchange gradients and parameters.

    Attributes:
        sgd: ``async``, ``sync`` (pservers apply step k once every live trainer's step k
            arrived) or ``bounded`` (a trainer more than ``staleness`` steps ahead waits); a
            plain string is taken and stored as its `SgdMode`.
        staleness: the bound for ``sgd = "bounded"`` (>= 1 there, 0 otherwise).
        delivery: either way the deltas are produced as they are made and each pserver
            applies each ``(task_id, seq)`` once, so every example reaches every parameter
            exactly once across kills and redone tasks. ``exactly_once`` also commits a task's
            DLQ letters and metrics record in one Kafka transaction at its end (an attempt that
            dies leaves none); ``at_least_once`` produces them at once (a redone task can
            repeat them), for brokers without transactions.
        push_every: push every n mini-batches, each still a step of the update rule that
            pulls its rows first; ``"auto"`` (the default): fixed for each task by its first
            claim from the trainers live then (`trainer.policy.group_size`): 4 for one or two,
            2 for three or four, 1 beyond, so that the trainers' mini-batches in flight at
            once stay about 8. Fewer pushes cost the broker and the shards less a record; more
            of the others' steps hidden at once cost AUC (bench/RESULTS.md, "larger push groups
            while few trainers share the model").
        pull_every: pull the dense parameters with a mini-batch's rows once m mini-batches
            have trained since their last pull.
        max_in_flight: async only: how many of its own pushes a trainer may have sent and not
            yet seen published by every shard when it goes on to the next mini-batch; it waits
            for the shards otherwise, never for other trainers. 0 (the default): each
            mini-batch trains on parameters that include every push of its trainer, exactly,
            and the others' published ones. Above 0 a trainer runs
            ahead of a slow pipeline and adds its pushes' estimated changes to the dense
            blocks and rows it pulls (trainer/own.py). The bound is what keeps trainers from
            drifting apart: unbounded, a slow moment of the pipeline leaves them many pushes
            apart and behind one process in AUC (bench/RESULTS.md, "From docs/job-config.md").
            Must be 0 when sync or bounded, which wait their own way.
        damp_stale: a dense gradient computed on blocks that have since taken n steps of other
            trainers moves them by 1 / (1 + n) of the update rule's step (pserver/state.py):
            at full steps, several trainers' dense gradients, each computed before the others'
            steps landed, overshoot and fall behind one process in AUC (bench/RESULTS.md,
            "four trainers, and why they fell behind"). One trainer's steps are not damped,
            while its pushes land.
        average_steps: what is scored (`streamtrain predict`, online inference) is, for the
            dense layers, an exponential moving average of their values over about this many
            steps of the update rule, or early on the last tenth of the steps taken
            (params/averages.py); trainers train on the
            values themselves. Adam at a constant learning rate moves the output layer, and
            with it the mean prediction, from one mini-batch to the next; the average moves far
            less (bench/RESULTS.md, "the dense layers scored as an average of their last 50
            steps"). 0 or 1 scores the values themselves.
        learning_rate: the optimizer's step size, applied by the pservers.
        torch_threads: a trainer's intra-op threads for forward and backward; 0 = torch's
            default (one per core).
    """

    sgd: SgdMode = SgdMode.ASYNC
    staleness: int = 0
    delivery: str = "exactly_once"
    push_every: int | str = "auto"
    pull_every: int = 1
    max_in_flight: int = 0
    damp_stale: bool = True
    average_steps: int = 50
    learning_rate: float = 0.05
    # One: at the built-in models' sizes, a second intra-op thread costs more in hand-offs than
    # it saves, and the trainer's own threads (reading, pulling, committing) need the cores.
    torch_threads: int = 1

    def __post_init__(self) -> None:
        sgd = SgdMode(_choice("train.sgd", self.sgd, tuple(SgdMode)))
        _fix(self, sgd=sgd)
        _int("train.torch_threads", self.torch_threads, 0)
        staleness = _int("train.staleness", self.staleness, 0)
        _choice("train.delivery", self.delivery, ("exactly_once", "at_least_once"))
        _push_every(self.push_every)
        _int("train.pull_every", self.pull_every, 1)
        _bool("train.damp_stale", self.damp_stale)
        _int("train.average_steps", self.average_steps, 0, 1 << 20)
        _fix(self, learning_rate=_positive("train.learning_rate", self.learning_rate))
        # A setting that cannot take effect is refused like a typo: the user believes it works.
        if sgd.bounds_staleness and staleness < 1:
            reason = f"must be an integer >= 1 when train.sgd = 'bounded', got {staleness}"
            raise JobConfigError("train.staleness", reason)
        if not sgd.bounds_staleness and staleness != 0:
            reason = f"only applies when train.sgd = 'bounded' (it is {sgd.value!r}); remove it"
            raise JobConfigError("train.staleness", reason)
        max_in_flight = _int("train.max_in_flight", self.max_in_flight, 0, 255)  # OwnPushes keeps 256
        if not sgd.limits_in_flight and max_in_flight != 0:
            reason = f"only applies when train.sgd = 'async' (it is {sgd.value!r}, which waits its own way); remove it"
            raise JobConfigError("train.max_in_flight", reason)


@dataclass(frozen=True)
class PserversSection:
    """``[pservers]``: the parameter-server shards.

    Attributes:
        count: number of shards, 1..1024 (the initial ``ps_desired``).
        slots: parameter slots hashed over the shards, 128..1024 and >= count; fixed for the
            job's life, since changing it would rehash every parameter.
        optimizer: ``sgd``, ``adagrad``, ``adam``, ``ftrl`` or a ``"module:callable"``.
        checkpoint_every_s: seconds between job-wide checkpoints (master/checkpoint_schedule.py).
        checkpoint_uri: a pyarrow filesystem URI; defaults to
            ``file:///var/lib/streamtrain/<job>/ckpt`` (None here only before ``JobConfig``
            fills it in).
        keep_checkpoints: complete checkpoints kept; older ones are deleted.
    """

    count: int = 2
    slots: int = 256
    optimizer: str = "adagrad"
    checkpoint_every_s: float = 60.0
    checkpoint_uri: str | None = None
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        count = _int("pservers.count", self.count, 1, 1024)
        slots = _int("pservers.slots", self.slots, 128, 1024)
        if slots < count:
            reason = f"must be >= pservers.count ({count}): every shard owns a slot, got {slots}"
            raise JobConfigError("pservers.slots", reason)
        _choice("pservers.optimizer", self.optimizer, ("sgd", "adagrad", "adam", "ftrl"), ref=True)
        _fix(self, checkpoint_every_s=_positive("pservers.checkpoint_every_s", self.checkpoint_every_s))
        uri = self.checkpoint_uri
        if uri is not None and (not isinstance(uri, str) or not _URI.fullmatch(uri) or uri != uri.strip()):
            raise JobConfigError(
                "pservers.checkpoint_uri",
                f"must be a filesystem URI such as file:///abs/path or s3://bucket/path, got {_show(uri)}",
            )
        _int("pservers.keep_checkpoints", self.keep_checkpoints, 1)


@dataclass(frozen=True)
class MasterSection:
    """``[master]``: the master's leadership and polling.

    Attributes:
        lock_ttl_s: TTL of the leader lease (whole seconds, as etcd leases take); a standby
            master takes over within this after the leader dies.
        poll_ms: how often the master reads the input partitions' end offsets.
        compact_history_s: every this many seconds the master compacts etcd's history up to
            the revision it saw one period earlier (0: leave it to the cluster's own
            auto-compaction).
    """

    lock_ttl_s: int = 10
    poll_ms: int = 200
    compact_history_s: int = 10

    def __post_init__(self) -> None:
        _int("master.lock_ttl_s", self.lock_ttl_s, 1)
        # Below 10 ms the master would spend its time asking Kafka for offsets.
        _int("master.poll_ms", self.poll_ms, 10)
        _int("master.compact_history_s", self.compact_history_s, 0)


@dataclass(frozen=True)
class KafkaSection:
    """``[kafka]``: how the job's own topics (gradients, dead letters, metrics) are created when
    they do not exist yet; topics that exist are left as they are.

    Attributes:
        replication_factor: replicas of each partition; 0: min(3, brokers in the cluster).
        min_insync_replicas: replicas that must have a write before it is acknowledged (every
            producer of the job asks for all of them); 0: min(2, the replication factor).
    """

    replication_factor: int = 0
    min_insync_replicas: int = 0

    def __post_init__(self) -> None:
        _int("kafka.replication_factor", self.replication_factor, 0, 32767)
        _int("kafka.min_insync_replicas", self.min_insync_replicas, 0, 32767)
        if 0 < self.replication_factor < self.min_insync_replicas:
            raise JobConfigError("kafka.min_insync_replicas",
                                 f"{self.min_insync_replicas} is more than the replication factor "
                                 f"{self.replication_factor}: no write could be acknowledged")


_SECTIONS: dict[str, type] = {
    "job": JobSection,
    "input": InputSection,
    "tasks": TasksSection,
    "model": ModelSection,
    "train": TrainSection,
    "pservers": PserversSection,
    "master": MasterSection,
    "kafka": KafkaSection,
}
_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in fields(cls)) for name, cls in _SECTIONS.items()
}
