"""`[input.fields]`: which fields of a log's own records (JSON, Avro, Protobuf) the model trains on, by path.

A production log is not written for us: its records are the service's own documents, nested,
with ids as numbers or strings, optional fields and booleans for labels. The job file names,
for each thing the model needs, where it is in a record (`user.id`: key `id` of the object, or
Avro record, under `user`); trainer/declared.py and trainer/registered.py decode by it. What a path
may hold:

| declared | a record's value there |
|---|---|
| `sparse = {name = "path", ...}` | a non-negative integer id, a string (hashed to a stable id), or an array of them; missing or null: no ids |
| `dense = ["path", ...]` | a number |
| `label = "path"` | `true`/`false`, or a number in [0, 1] |
| `label = "path > 30000"` | a number compared (`>`, `>=`, `<`, `<=`, `==`, `!=`): 1 when it holds, else 0 |
| `time = "path"` | epoch milliseconds, or an ISO-8601 string (UTC unless it says otherwise) |
| `defaults = {"path" = value}` | what a missing or null value at that path is taken to be |

A missing dense value, label or time with no default makes the record bad (dead-lettered
with the path named); a missing sparse field is an empty bag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from streamtrain.schemas import StreamtrainError

_SEGMENT = r"[A-Za-z0-9_\-]+"
_PATH = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*")
_RULE = re.compile(rf"\s*({_SEGMENT}(?:\.{_SEGMENT})*)\s*(?:(>=|<=|==|!=|>|<)\s*(\S+))?\s*")
OPERATORS = (">", ">=", "<", "<=", "==", "!=")


class FieldsError(StreamtrainError, ValueError):
    """A declaration that cannot be used; `key` names it (`input.fields.sparse.user`)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class LabelRule:
    """`path`, or `path op threshold`: the label is the value, or 1.0 where the comparison holds."""

    path: str
    op: str | None = None
    threshold: float = 0.0

    def __str__(self) -> str:
        return self.path if self.op is None else f"{self.path} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class DeclaredFields:
    sparse: tuple[tuple[str, str], ...]  # (model field, path), by field name: a table has no order in JSON
    dense: tuple[str, ...]  # paths, in the model's order
    label: LabelRule
    time: str | None = None  # path; None: every event time is 0
    defaults: tuple[tuple[str, object], ...] = ()  # (path, value)

    def default(self, path: str) -> object | None:
        return dict(self.defaults).get(path)

    def to_dict(self) -> dict[str, object]:
        """The TOML/JSON form `parse_fields` reads back to an equal value."""
        out: dict[str, object] = {"sparse": dict(self.sparse), "dense": list(self.dense), "label": str(self.label)}
        if self.time is not None:
            out["time"] = self.time
        if self.defaults:
            out["defaults"] = dict(self.defaults)
        return out


def parse_fields(key: str, value: object) -> DeclaredFields:
    """Raises: FieldsError naming the key at fault."""
    if isinstance(value, DeclaredFields):
        return value
    if not isinstance(value, dict):
        raise FieldsError(key, f"must be a table of sparse, dense, label, time, defaults, got {value!r}")
    unknown = set(value) - {"sparse", "dense", "label", "time", "defaults"}
    if unknown:
        raise FieldsError(f"{key}.{sorted(unknown)[0]}", "unknown key (sparse, dense, label, time, defaults)")
    sparse = value.get("sparse", {})
    if not isinstance(sparse, dict):
        raise FieldsError(f"{key}.sparse", f"must be a table of field name = \"path\", got {sparse!r}")
    for name, path in sparse.items():
        if not name or not name.isprintable() or len(name.encode()) > 255:
            raise FieldsError(f"{key}.sparse", f"field name must be 1-255 printable bytes, got {name!r}")
        _path(f"{key}.sparse.{name}", path)
    dense = value.get("dense", [])
    if not isinstance(dense, (list, tuple)):
        raise FieldsError(f"{key}.dense", f"must be a list of paths, got {dense!r}")
    for i, path in enumerate(dense):
        _path(f"{key}.dense[{i}]", path)
    if not sparse and not dense:
        raise FieldsError(key, "must declare at least one sparse or dense field: a label alone trains nothing")
    if "label" not in value:
        raise FieldsError(f"{key}.label", "is required: a path, or 'path > number'")
    label = _label(f"{key}.label", value["label"])
    time = value.get("time")
    if time is not None:
        _path(f"{key}.time", time)
    defaults = value.get("defaults", {})
    if not isinstance(defaults, dict):
        raise FieldsError(f"{key}.defaults", f"must be a table of \"path\" = value, got {defaults!r}")
    for path, default in defaults.items():
        _path(f"{key}.defaults", path)
        if isinstance(default, (dict, list)) and not (isinstance(default, list) and path in sparse.values()):
            raise FieldsError(f"{key}.defaults.{path}", f"must be a number, string or boolean, got {default!r}")
    return DeclaredFields(tuple(sorted(sparse.items())), tuple(dense), label, time, tuple(sorted(defaults.items())))


def _path(key: str, path: object) -> str:
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise FieldsError(key, f"must be a path of keys joined by '.' (user.id), got {path!r}")
    return path


def _label(key: str, rule: object) -> LabelRule:
    match = _RULE.fullmatch(rule) if isinstance(rule, str) else None
    if match is None:
        raise FieldsError(key, f"must be a path, or 'path op number' with op one of {OPERATORS}, got {rule!r}")
    path, op, threshold = match.groups()
    if op is None:
        return LabelRule(path)
    try:
        number = float(threshold)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise FieldsError(key, f"the threshold must be a finite number, got {threshold!r}")
    return LabelRule(path, op, number)
