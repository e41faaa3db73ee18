"""The raw click log, before the joiner labels it: impressions and clicks, and the joiner's
record of what is waiting for its match.

| document | topic, key | written by | read by |
|---|---|---|---|
| `ImpressionRecord` | the impressions topic, impression id | a click-log source (producers/synthetic.py) | the joiner (producers/joiner.py) |
| `ClickRecord` | the clicks topic, impression id | a click-log source | the joiner |
| `JoinWaiting` | `<group>.state` (compacted), impression id | the joiner | the joiner's next instance, rebuilding its state |

Keyed by impression id, so with equal partition counts an impression, its click and what the
joiner keeps of them land in the same partition number of their topics.

    impression  {"v":1,"id":"imp-7-42","ts":1700000000042,"sparse":{"ad":[3],"user":[17]},"dense":[0.5,-1.25]}
    click       {"v":1,"id":"imp-7-42","ts":1700000003517}
    waiting     {"v":1,"p":3,"imp":<an impression, as above>,"click_ts":null}

`ts` is event time in epoch milliseconds: an impression's is when it was shown, a click's when
the user clicked. Errors name the document's keys (`id`, `ts`, `sparse.user[0]`, `imp.dense[1]`),
whether raised by a constructor or a decoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _json
from ._check import Check
from .errors import SchemaError
from .example import Example

VERSION = 1
_PARTITION_MAX = 2**31 - 1
_imp = Check("ImpressionRecord", VERSION)
_click = Check("ClickRecord", VERSION)
_waiting = Check("JoinWaiting", VERSION)


@dataclass(frozen=True)
class ImpressionRecord:
    """An impression shown at `event_time_ms`, with its features. Constructing one checks and
    normalises the features as `Example` does (`sparse` a read-only mapping sorted by name,
    `dense` rounded to float32), so it compares equal to itself after a round trip.

    Raises:
        SchemaError: a value does not fit (names the key, e.g. `ts`, `dense[1]`).
    """

    impression_id: str
    event_time_ms: int
    sparse: Mapping[str, tuple[int, ...]]
    dense: tuple[float, ...]

    def __post_init__(self) -> None:
        _imp.text("id", self.impression_id)
        _imp.integer("ts", self.event_time_ms)
        try:
            features = Example(self.sparse, self.dense, 0.0, self.event_time_ms)
        except SchemaError as exc:  # Example's own field names (sparse.ad[0], dense[1]) are ours too
            raise _imp.error(exc.field, exc.reason) from None
        object.__setattr__(self, "sparse", features.sparse)
        object.__setattr__(self, "dense", features.dense)

    def to_example(self, label: float) -> Example:
        """The training example it makes once the joiner has labelled it."""
        return Example(self.sparse, self.dense, label, self.event_time_ms)

    def to_json(self) -> bytes:
        return _json.dumps(self._doc())

    @classmethod
    def from_json(cls, data: bytes | str) -> ImpressionRecord:
        """Raises: SchemaError."""
        return cls._of(_json.parse_object(_imp, data))

    def _doc(self) -> dict[str, Any]:
        return {"v": VERSION, "id": self.impression_id, "ts": self.event_time_ms,
                "sparse": {k: list(v) for k, v in self.sparse.items()}, "dense": list(self.dense)}

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> ImpressionRecord:
        _json.version(_imp, doc)
        impression_id, ts, sparse, dense = _json.required(_imp, doc, "id", "ts", "sparse", "dense")
        return cls(impression_id, ts, sparse, dense)


@dataclass(frozen=True)
class ClickRecord:
    """A click on impression `impression_id`, at `event_time_ms`.

    Raises:
        SchemaError: a value does not fit (names the key: `id`, `ts`).
    """

    impression_id: str
    event_time_ms: int

    def __post_init__(self) -> None:
        _click.text("id", self.impression_id)
        _click.integer("ts", self.event_time_ms)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "id": self.impression_id, "ts": self.event_time_ms})

    @classmethod
    def from_json(cls, data: bytes | str) -> ClickRecord:
        """Raises: SchemaError."""
        doc = _json.loads(_click, data)
        return cls(*_json.required(_click, doc, "id", "ts"))


@dataclass(frozen=True)
class JoinWaiting:
    """What the joiner holds of one impression id until it labels it: the impression, waiting
    for its click, or the earliest click, waiting for its impression (one of the two at least).
    `partition`: the input partition it came from, which is also its changelog partition.

    The changelog's value; a tombstone (no value) is an id resolved. Written with both keys
    `imp` and `click_ts`, null where unset, as every joiner so far has read them.

    Raises:
        SchemaError: a value does not fit (names the key: `p`, `click_ts`, `imp.ts`, ...).
    """

    partition: int
    impression: ImpressionRecord | None = None
    click_ms: int | None = None

    def __post_init__(self) -> None:
        _waiting.integer("p", self.partition, hi=_PARTITION_MAX)
        if self.impression is None and self.click_ms is None:
            raise _waiting.error("imp", "neither an impression nor a click is waiting")
        if self.impression is not None and not isinstance(self.impression, ImpressionRecord):
            raise _waiting.error("imp", f"expected an ImpressionRecord, got {type(self.impression).__name__}")
        if self.click_ms is not None:
            _waiting.integer("click_ts", self.click_ms)

    def to_json(self) -> bytes:
        imp = None if self.impression is None else self.impression._doc()
        return _json.dumps({"v": VERSION, "p": self.partition, "imp": imp, "click_ts": self.click_ms})

    @classmethod
    def from_json(cls, data: bytes | str) -> JoinWaiting:
        """Raises: SchemaError (a changelog record of another version included)."""
        doc = _json.loads(_waiting, data)
        partition = _json.field(_waiting, doc, "p")
        imp, click_ms = doc.get("imp"), doc.get("click_ts")
        if imp is not None:
            try:
                imp = ImpressionRecord._of(_json.obj(_waiting, imp, "imp"))
            except SchemaError as exc:
                if exc.format != "ImpressionRecord":
                    raise
                raise _waiting.error(f"imp.{exc.field}", exc.reason) from None
        return cls(partition, imp, click_ms)
