"""Example: one training record, as producers write it to a topic and trainers read it back."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from . import _json
from ._binary import BytesLike, Reader, Writer, le
from ._check import NAME_MAX_BYTES, U64_MAX, Check, utf8

VERSION = 1
MAGIC = b"SX"
_check = Check("Example", VERSION)

# After magic and version: reserved, dense count, sparse field count, label, event time.
_HEADER = le("BIIdQ")
_NAME_LEN = le("B")
_COUNT = le("I")
_INT = {int}
_NUMBER = {int, float}


@dataclass(frozen=True)
class Example:
    """A record: categorical ids per sparse field, float32 dense features, a label, an event time.

    Constructing one validates and normalises it: ``sparse`` becomes a read-only mapping of
    tuples sorted by field name, ``dense`` is rounded to float32 (what the wire carries), so an
    Example compares equal to itself after any round trip.

    Raises:
        SchemaError: a value does not fit (names the field, e.g. ``dense[3]``).
    """

    sparse: Mapping[str, tuple[int, ...]]
    dense: tuple[float, ...]
    label: float
    event_time_ms: int

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "sparse", _sparse(self.sparse))
        set_(self, "dense", _dense(self.dense))
        set_(self, "label", _check.number("label", self.label))
        set_(self, "event_time_ms", _check.integer("event_time_ms", self.event_time_ms))

    def to_json(self) -> bytes:
        return _json.dumps(
            {
                "v": VERSION,
                "sparse": {name: list(ids) for name, ids in self.sparse.items()},
                "dense": list(self.dense),
                "label": self.label,
                "ts": self.event_time_ms,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> Example:
        """Raises: SchemaError."""
        doc = _json.loads(_check, data)
        sparse = _json.obj(_check, _json.field(_check, doc, "sparse"), "sparse")
        for name, ids in sparse.items():
            _json.array(_check, ids, f"sparse.{name}")
        dense = _json.array(_check, _json.field(_check, doc, "dense"), "dense")
        # The constructor would call it event_time_ms; name the key the document actually has.
        ts = _check.integer("ts", _json.field(_check, doc, "ts"))
        return cls(sparse, tuple(dense), _json.field(_check, doc, "label"), ts)

    def to_bytes(self) -> bytes:
        w = Writer(MAGIC, VERSION)
        w.pack(_HEADER, 0, len(self.dense), len(self.sparse), self.label, self.event_time_ms)
        w.add(struct.pack(f"<{len(self.dense)}f", *self.dense))
        for name, ids in self.sparse.items():
            raw = name.encode("utf-8")
            w.pack(_NAME_LEN, len(raw))
            w.add(raw)
            w.pack(_COUNT, len(ids))
            w.add(struct.pack(f"<{len(ids)}Q", *ids))
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: BytesLike) -> Example:
        """Raises: SchemaError."""
        r = Reader(_check, data, MAGIC)
        reserved, n_dense, n_fields, label, ts = r.unpack(_HEADER, "header")
        if reserved:
            raise _check.error("header", "reserved byte must be zero")
        dense = r.scalars("f", 4, n_dense, "dense")
        sparse: dict[str, tuple[int, ...]] = {}
        for i in range(n_fields):
            (size,) = r.unpack(_NAME_LEN, f"sparse[{i}].name")
            name = r.text(size, f"sparse[{i}].name")
            if name in sparse:
                raise _check.error(f"sparse[{i}].name", f"duplicate field {name!r}")
            (count,) = r.unpack(_COUNT, f"sparse.{name}")
            sparse[name] = r.scalars("Q", 8, count, f"sparse.{name}")
        r.finish()
        return cls(sparse, dense, label, ts)


def _sparse(value: object) -> Mapping[str, tuple[int, ...]]:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise _check.error("sparse", f"expected a mapping of field name to ids, got {type(value).__name__}")
    out = {}
    for name in sorted(value, key=_sort_key):
        if not isinstance(name, str) or not name or len(utf8(_check, "sparse", name)) > NAME_MAX_BYTES:
            raise _check.error("sparse", f"field name {name!r} is not a non-empty string of <= 255 UTF-8 bytes")
        out[name] = _ids(f"sparse.{name}", value[name])
    return MappingProxyType(out)


def _sort_key(name: object) -> str:
    # Sorting must not raise TypeError on a non-str key; the loop in _sparse reports it.
    return name if isinstance(name, str) else ""


def _ids(field: str, value: Any) -> tuple[int, ...]:  # anything: checked here
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or value.ndim != 1:
            raise _check.error(field, f"expected a 1-D integer array, got {value.dtype} shape {value.shape}")
        value = value.tolist()
    elif type(value) is not tuple and (isinstance(value, (str, bytes)) or not isinstance(value, Sequence)):
        raise _check.error(field, f"expected a sequence of ids, got {type(value).__name__}")
    ids = tuple(value)
    # Examples are decoded one by one at the trainer's input rate, so the common case (plain
    # ints) is checked with C-level passes; the element-wise pass only runs to name a bad id.
    if set(map(type, ids)) <= _INT and (not ids or (min(ids) >= 0 and max(ids) <= U64_MAX)):
        return ids
    return tuple(_check.integer(f"{field}[{j}]", i, 0, U64_MAX) for j, i in enumerate(ids))


def _dense(value: Any) -> tuple[float, ...]:  # anything: checked here
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu" or value.ndim != 1:
            raise _check.error("dense", f"expected a 1-D numeric array, got {value.dtype} shape {value.shape}")
        value = value.tolist()
    elif isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _check.error("dense", f"expected a sequence of floats, got {type(value).__name__}")
    try:
        plain = set(map(type, value)) <= _NUMBER and all(map(math.isfinite, value))
    except OverflowError:  # an int beyond float64
        plain = False
    if not plain:
        # Names the first offender: bool, None, str, NaN, inf or too large.
        value = [_check.number(f"dense[{j}]", x) for j, x in enumerate(value)]
    # Packing as float32 is the rounding the wire applies, and refuses what would become inf.
    layout = f"<{len(value)}f"
    try:
        return struct.unpack(layout, struct.pack(layout, *value))
    except OverflowError as exc:
        j = next(j for j, x in enumerate(value) if not _fits_float32(x))
        raise _check.error(f"dense[{j}]", f"{float(value[j])!r} overflows float32") from exc


def _fits_float32(x: float) -> bool:
    try:
        struct.pack("<f", x)
    except OverflowError:
        return False
    return True
