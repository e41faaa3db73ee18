"""The job file's value rules: the error every refusal raises (`JobConfigError`) and the checks
the sections (config_sections.py) run on each value. Internal to schemas/config.py, which
is the public face; the underscore names are shared within these three modules only."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from streamtrain.schemas import StreamtrainError

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


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise JobConfigError(key, f"must be true or false, got {_show(value)}")
    return value


def _push_every(value: object) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _I64_MAX:
        raise JobConfigError("train.push_every", f"must be \"auto\" or an integer >= 1, got {_show(value)}")
    return value


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
