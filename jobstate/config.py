"""The job file: one TOML document parsed once into a frozen, validated ``JobConfig``.

The master validates the user's file when the job is submitted and stores ``to_json()`` at
``/streamtrain/<job>/config``; every other process reads it back with ``from_json``, which runs
the same checks, so no process ever runs on a value the master would have refused. The stored
document is fully resolved (every default filled in), so processes of different versions agree
on the values even if a default changes later. Keys, defaults and meanings: docs/job-config.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from streamtrain.jobstate.fields import DeclaredFields, FieldsError, parse_fields
from streamtrain.schemas import StreamtrainError

__all__ = [
    "CsvColumn",
    "InputSection",
    "JobConfig",
    "JobConfigError",
    "JobSection",
    "MasterSection",
    "ModelSection",
    "PserversSection",
    "TasksSection",
    "TrainSection",
]

# Same rules as schemas/keys.py; kept inline so this module needs nothing but the stdlib.
# 100 characters leaves room for "<job>.grad.<shard>" inside Kafka's 249-character topic limit.
_JOB = re.compile(r"[A-Za-z0-9._-]{1,100}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# What importlib + getattr can resolve. Never imported here: the master validates a job without
# the user's code (or torch) installed; the process that calls it imports it.
_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", re.ASCII)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S.*")
_CSV_NAME = re.compile(r"[^\s:]+")
_URL = re.compile(r"https?://[^\s/]+(?:/\S*)?")
_REGISTERED = ("avro", "protobuf")  # formats whose writer schemas a registry holds
_CSV_KINDS = ("label", "dense", "sparse", "time", "ignore")
# TOML integers are signed 64-bit; JSON's are not, and from_json must accept exactly what TOML can.
_I64_MAX = 2**63 - 1
_JSON_VERSION = 1


class JobConfigError(StreamtrainError, ValueError):
    """A job file (or its stored JSON) is unreadable or holds a value streamtrain refuses.

    The message reads ``<source>: <dotted.key>: <why>``, e.g.
    ``job.toml: tasks.max_records: must be an integer >= 1, got -3``.

    Attributes:
        key: the dotted key at fault (``"input.topics[1]"``), or None for whole-file errors.
        reason: what is wrong, without source and key.
        source: the file path or other origin, or None when not known.
    """

    def __init__(self, key: str | None, reason: str, source: str | None = None) -> None:
        where = ": ".join(part for part in (source, key) if part)
        super().__init__(f"{where}: {reason}" if where else reason)
        self.key = key
        self.reason = reason
        self.source = source

    # Default pickling replays args=(message,), which this __init__ cannot take; config errors
    # cross process boundaries (executors, multiprocessing) like any other.
    def __reduce__(self):
        return (type(self), (self.key, self.reason, self.source))


# ---------------------------------------------------------------------------------- checks


def _show(value: object) -> str:
    """A value as the user wrote it, short enough for one error line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a table"
    text = str(value) if isinstance(value, float) and not math.isfinite(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(key: str, value: object, lo: int, hi: int = _I64_MAX) -> int:
    bounds = f">= {lo}" if hi == _I64_MAX else f"in {lo}..{hi}"
    # bool is an int subclass, but `max_attempts = true` is a mistake, not a 1.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        too_big = " (beyond a 64-bit integer)" if isinstance(value, int) and value > _I64_MAX else ""
        raise JobConfigError(key, f"must be an integer {bounds}, got {_show(value)}{too_big}")
    return value


def _positive(key: str, value: object) -> float:
    problem = isinstance(value, bool) or not isinstance(value, (int, float))
    if not problem:
        try:
            number = float(value)  # type: ignore[arg-type]
        except OverflowError:
            problem = True
        else:
            problem = not (math.isfinite(number) and number > 0)
    if problem:
        raise JobConfigError(key, f"must be a number > 0, got {_show(value)}")
    return number


def _choice(key: str, value: object, choices: tuple[str, ...], ref: bool = False) -> str:
    if isinstance(value, str) and (value in choices or (ref and _REF.fullmatch(value))):
        return value
    tail = " or a 'module.path:callable' reference" if ref else ""
    raise JobConfigError(key, f"must be one of {', '.join(choices)}{tail}, got {_show(value)}")


def _ref(key: str, value: object) -> str:
    if not isinstance(value, str) or not _REF.fullmatch(value):
        raise JobConfigError(key, f"must be a 'module.path:callable' reference, got {_show(value)}")
    return value


def _utf8_len(value: str) -> int | None:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, possible in JSON, never in TOML
        return None


def _topics(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        hint = f"; write [{json.dumps(value)}]"
        raise JobConfigError(key, f"must be a list of topic names, got {_show(value)}{hint}")
    if not isinstance(value, (list, tuple)) or not value:
        raise JobConfigError(key, f"must be a non-empty list of Kafka topic names, got {_show(value)}")
    first_seen: dict[str, int] = {}
    for i, topic in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
            reason = f"must be a Kafka topic name ([A-Za-z0-9._-]{{1,249}}), got {_show(topic)}"
            raise JobConfigError(where, reason)
        if topic in first_seen:
            raise JobConfigError(where, f"{topic!r} is listed twice (also {key}[{first_seen[topic]}])")
        first_seen[topic] = i
    return tuple(value)


def _csv_column(key: str, item: object) -> CsvColumn:
    spec = str(item) if isinstance(item, CsvColumn) else item
    kinds = ", ".join(_CSV_KINDS)
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise JobConfigError(key, f"must be a 'name:kind' string, kind one of {kinds}, got {_show(item)}")
    name, kind = spec.split(":")
    size = _utf8_len(name)
    if not _CSV_NAME.fullmatch(name) or size is None or size > 255:
        reason = f"column name must be 1..255 bytes of UTF-8 without spaces or ':', got {name!r}"
        raise JobConfigError(key, reason)
    if kind not in _CSV_KINDS:
        raise JobConfigError(key, f"column kind must be one of {kinds}, got {kind!r}")
    return CsvColumn(name, kind)


def _csv_columns(key: str, value: object, fmt: str) -> tuple[CsvColumn, ...]:
    if not isinstance(value, (list, tuple)):
        raise JobConfigError(key, f"must be a list of 'name:kind' strings, got {_show(value)}")
    if fmt != "csv":
        if value:
            raise JobConfigError(key, f"only applies when input.format = 'csv' (it is {fmt!r}); remove it")
        return ()
    if not value:
        reason = "is required when input.format = 'csv': every column in file order as 'name:kind'"
        raise JobConfigError(key, reason)
    columns = tuple(_csv_column(f"{key}[{i}]", item) for i, item in enumerate(value))
    first_seen: dict[str, int] = {}
    for i, column in enumerate(columns):
        if column.name in first_seen:
            reason = f"column {column.name!r} is listed twice (also {key}[{first_seen[column.name]}])"
            raise JobConfigError(f"{key}[{i}]", reason)
        first_seen[column.name] = i
    kinds = [column.kind for column in columns]
    if kinds.count("label") != 1:
        raise JobConfigError(key, f"must have exactly one 'label' column, got {kinds.count('label')}")
    if kinds.count("time") > 1:
        raise JobConfigError(key, f"may have at most one 'time' column, got {kinds.count('time')}")
    if "dense" not in kinds and "sparse" not in kinds:
        reason = "must have at least one 'dense' or 'sparse' column: a label alone trains nothing"
        raise JobConfigError(key, reason)
    return columns


def _fix(section: object, **values: object) -> None:
    """Store normalised values (list -> tuple, int -> float) on a frozen dataclass."""
    for name, value in values.items():
        object.__setattr__(section, name, value)


# -------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class CsvColumn:
    """One column of a CSV input record, in file order: ``"name:kind"`` in the job file.

    Attributes:
        name: the feature name (1..255 bytes of UTF-8, no whitespace or ':').
        kind: ``label`` (the target), ``dense`` (one float), ``sparse`` (ids of a sparse
            feature), ``time`` (the event time in ms), or ``ignore`` (a column the model must
            not see, such as a record id or a value known only later: never read).
    """

    name: str
    kind: str

    def __str__(self) -> str:
        return f"{self.name}:{self.kind}"


@dataclass(frozen=True)
class JobSection:
    """``[job]``: the job's identity.

    Attributes:
        name: prefixes the job's Kafka topics (``<name>.grad.<i>``, ``<name>.dlq``,
            ``<name>.metrics``), etcd keys (``/streamtrain/<name>/``) and Redis keys
            (``st:<name>:``); ``[A-Za-z0-9._-]{1,100}``, not ``.`` or ``..``. Required.
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
            jobstate/fields.py): with ``json``, None means the records are streamtrain's Example
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
        timeout_s: a claimed task not finished within this is requeued.
        max_attempts: a task that timed out or failed this many times goes to ``failed``.
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


@dataclass(frozen=True)
class TrainSection:
    """``[train]``: how trainers and pservers exchange gradients and parameters.

    Attributes:
        sgd: ``async``, ``sync`` (pservers apply step k once every live trainer's step k
            arrived) or ``bounded`` (a trainer more than ``staleness`` steps ahead waits).
        staleness: the bound for ``sgd = "bounded"`` (>= 1 there, 0 otherwise).
        delivery: either way the deltas are produced as they are made and each pserver
            applies each ``(task_id, seq)`` once, so every example reaches every parameter
            exactly once across kills and redone tasks. ``exactly_once`` also commits a task's
            DLQ letters and metrics record in one Kafka transaction at its end (an attempt that
            dies leaves none); ``at_least_once`` produces them at once (a redone task can
            repeat them), for brokers without transactions.
        push_every: push every n mini-batches, each still a step of the update rule, with
            one pull of their rows at the start.
        pull_every: pull the dense parameters at a push's start once m mini-batches have
            trained since their last pull.
        max_in_flight: async only: how many of its own pushes a trainer may have sent and not
            yet seen published by every shard when it goes on to the next mini-batch; it waits
            for the shards otherwise, never for other trainers. 0 (the default): each
            mini-batch trains on parameters that include every push of its trainer, exactly,
            and the others' published ones. Above 0 a trainer runs
            ahead of a slow pipeline and adds its pushes' estimated changes to the dense
            blocks and rows it pulls (trainer/own.py). Unbounded, two trainers were up to 10
            pushes apart and 0.01 AUC behind one process (bench/RESULTS.md). Must be 0 when
            sync or bounded, which wait their own way.
        learning_rate: the optimizer's step size, applied by the pservers.
        torch_threads: a trainer's intra-op threads for forward and backward; 0 = torch's
            default (one per core).
    """

    sgd: str = "async"
    staleness: int = 0
    delivery: str = "exactly_once"
    push_every: int = 1
    pull_every: int = 1
    max_in_flight: int = 0
    learning_rate: float = 0.05
    # One: at the built-in models' sizes, a second intra-op thread costs more in hand-offs than
    # it saves, and the trainer's own threads (reading, pulling, committing) need the cores.
    torch_threads: int = 1

    def __post_init__(self) -> None:
        sgd = _choice("train.sgd", self.sgd, ("async", "sync", "bounded"))
        _int("train.torch_threads", self.torch_threads, 0)
        staleness = _int("train.staleness", self.staleness, 0)
        _choice("train.delivery", self.delivery, ("exactly_once", "at_least_once"))
        _int("train.push_every", self.push_every, 1)
        _int("train.pull_every", self.pull_every, 1)
        _fix(self, learning_rate=_positive("train.learning_rate", self.learning_rate))
        # A setting that cannot take effect is refused like a typo: the user believes it works.
        if sgd == "bounded" and staleness < 1:
            reason = f"must be an integer >= 1 when train.sgd = 'bounded', got {staleness}"
            raise JobConfigError("train.staleness", reason)
        if sgd != "bounded" and staleness != 0:
            reason = f"only applies when train.sgd = 'bounded' (it is {sgd!r}); remove it"
            raise JobConfigError("train.staleness", reason)
        max_in_flight = _int("train.max_in_flight", self.max_in_flight, 0, 255)  # OwnPushes keeps 256
        if sgd != "async" and max_in_flight != 0:
            reason = f"only applies when train.sgd = 'async' (it is {sgd!r}, which waits its own way); remove it"
            raise JobConfigError("train.max_in_flight", reason)


@dataclass(frozen=True)
class PserversSection:
    """``[pservers]``: the parameter-server shards.

    Attributes:
        count: number of shards, 1..1024 (the initial ``ps_desired``).
        slots: parameter slots hashed over the shards, 128..1024 and >= count; fixed for the
            job's life, since changing it would rehash every parameter.
        optimizer: ``sgd``, ``adagrad``, ``adam``, ``ftrl`` or a ``"module:callable"``.
        checkpoint_every_s: seconds between job-wide checkpoints (master/checkpoints.py).
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


_SECTIONS: dict[str, type] = {
    "job": JobSection,
    "input": InputSection,
    "tasks": TasksSection,
    "model": ModelSection,
    "train": TrainSection,
    "pservers": PserversSection,
    "master": MasterSection,
}
_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in fields(cls)) for name, cls in _SECTIONS.items()
}


# ------------------------------------------------------------------------------ the config


@dataclass(frozen=True)
class JobConfig:
    """A whole job file, validated: one frozen section object per ``[table]``.

    Build it with ``load``, ``from_toml`` or ``from_json``; constructing it (or a section)
    directly runs the same checks. Every check raises ``JobConfigError``.
    """

    job: JobSection
    input: InputSection
    tasks: TasksSection = field(default_factory=TasksSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    pservers: PserversSection = field(default_factory=PserversSection)
    master: MasterSection = field(default_factory=MasterSection)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            section = getattr(self, name)
            if not isinstance(section, cls):
                raise JobConfigError(name, f"must be a {cls.__name__}, got {type(section).__name__}")
        job = self.job.name
        # Training on the job's own gradients, dead letters or metrics is always a mistake,
        # and a feedback loop that never ends on an online job.
        for i, topic in enumerate(self.input.topics):
            if topic in (f"{job}.dlq", f"{job}.metrics") or topic.startswith(f"{job}.grad."):
                reason = f"{topic!r} is one of the job's own topics, not input"
                raise JobConfigError(f"input.topics[{i}]", reason)
        if self.pservers.checkpoint_uri is None:
            default_uri = f"file:///var/lib/streamtrain/{job}/ckpt"
            _fix(self, pservers=dataclasses.replace(self.pservers, checkpoint_uri=default_uri))

    @property
    def name(self) -> str:
        """The job name (``job.name``)."""
        return self.job.name

    @property
    def bounded(self) -> bool:
        """True when the input is bounded (``input.passes >= 1``), False for online input."""
        return self.input.passes >= 1

    @classmethod
    def from_toml(cls, text: str, source: str = "<job>") -> JobConfig:
        """Parse and validate a job file's text; ``source`` names it in error messages.

        Raises:
            JobConfigError: invalid TOML (with line and column), an unknown section or key, a
                missing required key, or a value out of its rules.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobConfigError(None, f"invalid TOML: {exc}", source) from exc
        return _build(data, source)

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        """Read, parse and validate the job file at ``path``: TOML, or the JSON of ``to_json``
        if its name ends in ``.json`` (what `LocalJob` hands its master).

        Raises:
            JobConfigError: the file cannot be read or is not UTF-8 (naming the path), or
                anything ``from_toml`` refuses.
        """
        source = str(path)
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise JobConfigError(None, f"cannot read the job file: {exc.strerror or exc}", source) from exc
        try:
            # utf-8-sig: editors that write a byte-order mark should not break the parse.
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JobConfigError(None, f"not UTF-8 text (bad byte at offset {exc.start})", source) from exc
        if Path(path).suffix == ".json":
            return cls.from_json(text, source)
        return cls.from_toml(text, source)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved config as plain data: ``{section: {key: value}}`` with lists, not tuples.

        Every key is present (defaults filled in) but an optional table not given; feeding it
        back as TOML or JSON gives an equal config.
        """
        return {name: _section_dict(getattr(self, name)) for name in _SECTIONS}

    def to_json(self) -> bytes:
        """The canonical JSON stored in etcd: ASCII, sorted keys, with a ``version`` field.

        ``JobConfig.from_json(c.to_json()) == c`` and the bytes are stable for equal configs.
        """
        document = {"version": _JSON_VERSION, **self.to_dict()}
        return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "<config json>") -> JobConfig:
        """Parse and validate a config stored by ``to_json``, with exactly the TOML checks.

        Raises:
            JobConfigError: invalid JSON, a duplicate key, an unknown ``version``, or anything
                ``from_toml`` refuses.
        """
        try:
            document = json.loads(data, object_pairs_hook=_no_duplicate_keys)
        except JobConfigError as exc:
            raise JobConfigError(exc.key, exc.reason, source) from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise JobConfigError(None, f"invalid JSON: {exc}", source) from exc
        if not isinstance(document, dict):
            raise JobConfigError(None, f"must be a JSON object, got {_show(document)}", source)
        version = document.pop("version", None)
        if isinstance(version, bool) or version != _JSON_VERSION:
            reason = f"must be {_JSON_VERSION} (the config format this code reads), got {_show(version)}"
            raise JobConfigError("version", reason, source)
        return _build(document, source)


# ------------------------------------------------------------------------------- plumbing


def _section_dict(section: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if value is None:  # an optional table not given (input.fields): JSON has no "unset"
            continue
        if isinstance(value, DeclaredFields):
            out[f.name] = value.to_dict()
        else:
            out[f.name] = [str(item) for item in value] if isinstance(value, tuple) else value
    return out


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys; TOML refuses them, and so do we.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JobConfigError(key, "duplicate key in JSON object")
        out[key] = value
    return out


def _build(data: dict[str, Any], source: str) -> JobConfig:
    try:
        _reject_unknown(data)
        sections: dict[str, object] = {}
        for name, cls in _SECTIONS.items():
            raw = data.get(name, {})
            if not isinstance(raw, dict):
                raise JobConfigError(name, f"must be a table ([{name}]), got {_show(raw)}")
            for f in fields(cls):
                if f.default is MISSING and f.default_factory is MISSING and f.name not in raw:
                    raise JobConfigError(f"{name}.{f.name}", "is required")
            for key, value in raw.items():
                # Only JSON has null; None means "use the default" to the constructors.
                if value is None:
                    raise JobConfigError(f"{name}.{key}", "must not be null")
            sections[name] = cls(**raw)
        return JobConfig(**sections)  # type: ignore[arg-type]
    except JobConfigError as exc:
        if exc.source is not None:
            raise
        raise JobConfigError(exc.key, exc.reason, source) from None


# Keys that meant something once: a job file that still sets one is told what became of it.
_REMOVED = {
    "input.json_fields": "renamed: [input.fields] (the same table; it also maps Avro records)",
    "train.commit_every": "removed: deltas are no longer committed in Kafka transactions; each is produced "
                          "as it is made and applied once by the pservers' ledger (docs/job-config.md, "
                          "train.delivery); remove the key",
}


def _reject_unknown(data: dict[str, Any]) -> None:
    """Name every unknown section and key at once, each with the closest known key, if any."""
    problems: list[tuple[str, str]] = []
    for name in data:
        if name not in _SECTIONS:
            what = "unknown section" if isinstance(data[name], dict) else "unknown key outside any [section]"
            problems.append((name, what + _suggest_section(name)))
        elif isinstance(data[name], dict):
            for key in data[name]:
                if f"{name}.{key}" in _REMOVED:
                    problems.append((f"{name}.{key}", _REMOVED[f"{name}.{key}"]))
                elif key not in _KEYS[name]:
                    problems.append((f"{name}.{key}", "unknown key" + _suggest_key(name, key)))
    if problems:
        (key, reason), rest = problems[0], problems[1:]
        if rest:
            reason += " (also " + "; ".join(f"{k}: {r}" for k, r in rest) + ")"
        raise JobConfigError(key, reason)


def _suggest_key(section: str, key: str) -> str:
    close = difflib.get_close_matches(key, _KEYS[section], n=1)
    if close:
        return f", did you mean '{section}.{close[0]}'?"
    # A right key in the wrong section: `[train] optimizer = ...` belongs to [pservers].
    return _suggest_elsewhere(key) or f" (known keys in [{section}]: {', '.join(_KEYS[section])})"


def _suggest_section(name: str) -> str:
    close = difflib.get_close_matches(name, list(_SECTIONS), n=1)
    if close:
        return f", did you mean '{close[0]}'?"
    # A key written above every table header lands at the top level.
    return _suggest_elsewhere(name) or f" (known sections: {', '.join(_SECTIONS)})"


def _suggest_elsewhere(word: str) -> str:
    dotted = {key: f"{section}.{key}" for section, keys in _KEYS.items() for key in keys}
    close = difflib.get_close_matches(word, list(dotted), n=1)
    return f", did you mean '{dotted[close[0]]}'?" if close else ""
