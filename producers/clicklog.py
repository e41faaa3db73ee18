"""The raw click log's two record kinds, as the synthetic source writes them and the joiner
reads them. Both are JSON keyed by impression id, so with equal partition counts an impression
and its click land in the same partition number of their topics.

    impression  {"v":1,"id":"imp-7-42","ts":1700000000042,"sparse":{"ad":[3],"user":[17]},"dense":[0.5,-1.25]}
    click       {"v":1,"id":"imp-7-42","ts":1700000003517}

`ts` is event time in epoch milliseconds; a click's is when the user clicked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from streamtrain import schemas
from streamtrain.producers.errors import ProducerError

VERSION = 1


class ClickLogError(ProducerError, ValueError):
    """A click-log record is malformed; the message names the record kind and the field."""


@dataclass(frozen=True)
class ImpressionRecord:
    impression_id: str
    event_time_ms: int
    sparse: Mapping[str, tuple[int, ...]]
    dense: tuple[float, ...]

    def to_json(self) -> bytes:
        return _dumps({"v": VERSION, "id": self.impression_id, "ts": self.event_time_ms,
                       "sparse": {k: list(v) for k, v in self.sparse.items()}, "dense": list(self.dense)})

    def to_example(self, label: float) -> schemas.Example:
        return schemas.Example(self.sparse, self.dense, label, self.event_time_ms)

    @classmethod
    def from_json(cls, data: bytes | str) -> ImpressionRecord:
        """Raises: ClickLogError."""
        doc = _loads("impression", data)
        try:
            # Example's constructor validates ids and features and names the offending field.
            features = schemas.Example(doc.get("sparse"), doc.get("dense"), 0.0, doc["ts"])
        except schemas.SchemaError as exc:
            raise ClickLogError(f"impression {doc['id']!r}: field '{exc.field}': {exc.reason}") from exc
        return cls(doc["id"], features.event_time_ms, features.sparse, features.dense)


@dataclass(frozen=True)
class ClickRecord:
    impression_id: str
    event_time_ms: int

    def to_json(self) -> bytes:
        return _dumps({"v": VERSION, "id": self.impression_id, "ts": self.event_time_ms})

    @classmethod
    def from_json(cls, data: bytes | str) -> ClickRecord:
        """Raises: ClickLogError."""
        doc = _loads("click", data)
        return cls(doc["id"], doc["ts"])


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _loads(kind: str, data: bytes | str) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ClickLogError(f"{kind}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ClickLogError(f"{kind}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("v") != VERSION:
        raise ClickLogError(f"{kind}: field 'v': unknown version {doc.get('v')!r}; this reader understands {VERSION}")
    if not isinstance(doc.get("id"), str) or not doc["id"]:
        raise ClickLogError(f"{kind}: field 'id': expected a non-empty string, got {doc.get('id')!r}")
    ts = doc.get("ts")
    if type(ts) is not int or ts < 0:
        raise ClickLogError(f"{kind} {doc['id']!r}: field 'ts': expected epoch milliseconds >= 0, got {ts!r}")
    return doc
