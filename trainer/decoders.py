"""Record bytes → examples, as the job's `input.format` names it.

Built-ins: `json` and `binary` (the schemas/ formats) and `csv` (one line per record, columns
declared by `input.csv_columns`); anything else is a user's "module:callable" taking the
record's value bytes and returning an Example. Every failure is a `DecodeError` with a reason
a person can act on; the trainer dead-letters the record and goes on.

`make_decoder` decodes one record into a `schemas.Example`. The trainer uses `ChunkDecoder`,
which decodes many records straight into the job's `Columns`: for JSON, msgspec parses and
type-checks each record in C against a schema that accepts only what `Example.from_json`
accepts, and the remaining checks run vectorised over the chunk. A record the fast path
refuses goes through `Example.from_json`, so its reason (and the verdict) are the same as one
by one: the fast path decides speed, never acceptance.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Literal

import msgspec
import numpy as np

from master.config import CsvColumn, InputSection
from schemas import Example, SchemaError
from trainer.features import Columns

Decoder = Callable[[bytes], Example]

_NAME_MAX_BYTES = 255  # schemas: a field name travels behind a u8 length
_NAMES_CACHED = 4096  # valid field names remembered; a stream of ever new names stays bounded


class DecodeError(ValueError):
    """A record that is not an example of the job's format; the message says why."""


@dataclass(frozen=True)
class Decoded:
    columns: Columns  # the good records, in their order
    bad: list[tuple[int, str]]  # (position in the chunk, reason)


class ChunkDecoder:
    """Many records at once into the job's columns; also checks that each example fits the
    job (its dense width, a label in [0, 1])."""

    def __init__(self, section: InputSection, fields: Sequence[str], dense_features: int) -> None:
        self.fields = tuple(fields)
        self.dense_features = dense_features
        self._one = make_decoder(section)
        self._fast = _JsonFast() if section.format == "json" else None

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        if self._fast is not None:
            picked, slow = self._fast.parse(values, self.dense_features)
        else:
            picked, slow = {}, range(len(values))
        bad = []
        for i in slow:
            try:
                picked[i] = self.fit(self._one(values[i]))
            except DecodeError as exc:
                bad.append((i, str(exc)))
        order = sorted(picked)
        examples = [picked[i] for i in order]
        try:
            columns = Columns.gather(examples, self.fields, self.dense_features)
        except OverflowError:
            # An id beyond 64 bits that the fast parser let through: judge its chunk one by one.
            return Decoded(*self._one_by_one(values))
        return Decoded(columns, bad)

    def _one_by_one(self, values: Sequence[bytes | None]) -> tuple[Columns, list[tuple[int, str]]]:
        good, bad = [], []
        for i, value in enumerate(values):
            try:
                good.append(self.fit(self._one(value)))
            except DecodeError as exc:
                bad.append((i, str(exc)))
        return Columns.gather(good, self.fields, self.dense_features), bad

    def fit(self, example: Example) -> Example:
        """The example, if the job can train on it.

        Raises:
            DecodeError: its dense width is not the job's, or its label is not a probability.
        """
        if len(example.dense) != self.dense_features:
            raise DecodeError(f"{len(example.dense)} dense features, the job declares {self.dense_features}")
        if not 0.0 <= example.label <= 1.0:
            raise DecodeError(f"label {example.label!r} is outside [0, 1] (a click probability)")
        return example


_Id = Annotated[int, msgspec.Meta(ge=0)]  # msgspec bounds stop at int64; > 2^64-1 fails in gather


class _JsonDoc(msgspec.Struct):
    """What `Example.from_json` accepts, as far as msgspec can say it; unknown keys ignored."""

    v: Literal[1]
    sparse: dict[str, list[_Id]]
    dense: list[float]
    label: float
    event_time_ms: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = msgspec.field(name="ts")


_DENSE, _SPARSE, _LABEL = attrgetter("dense"), attrgetter("sparse"), attrgetter("label")


class _JsonFast:
    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(_JsonDoc)
        self._names: set[str] = set()  # sparse field names seen and valid

    def parse(self, values: Sequence[bytes | None], dense_features: int) -> tuple[dict[int, _JsonDoc], list[int]]:
        """({position: doc} for records that pass every check, positions for the slow path).

        The common case (every record parses) runs as C-level `map`s; per-record Python only
        runs for a chunk holding a record msgspec refuses."""
        try:
            parsed = list(map(self._decoder.decode, values))
            positions = range(len(values))
            slow: list[int] = []
        except (msgspec.DecodeError, TypeError):  # ValidationError is a DecodeError
            parsed, positions, slow = [], [], []
            for i, value in enumerate(values):
                try:
                    parsed.append(self._decoder.decode(value))
                    positions.append(i)
                except (msgspec.DecodeError, TypeError):
                    slow.append(i)
        if not parsed:
            return {}, slow
        n = len(parsed)
        dense_lists = list(map(_DENSE, parsed))
        ok = np.fromiter(map(len, dense_lists), dtype=np.int64, count=n) == dense_features
        sparse = list(map(_SPARSE, parsed))
        named = np.fromiter(map(self._names.issuperset, sparse), dtype=bool, count=n)
        for j in np.flatnonzero(~named).tolist():
            named[j] = self._names_ok(sparse[j])
        ok &= named
        labels = np.fromiter(map(_LABEL, parsed), dtype=np.float64, count=n)
        dense = np.zeros((n, dense_features))
        fitting = np.flatnonzero(ok)
        dense[fitting] = np.array([dense_lists[j] for j in fitting.tolist()] if len(fitting) < n else dense_lists,
                                  dtype=np.float64).reshape(len(fitting), dense_features)
        with np.errstate(over="ignore"):
            ok &= np.isfinite(dense.astype(np.float32)).all(axis=1)  # float32 is what the wire carries
        ok &= (labels >= 0.0) & (labels <= 1.0)
        docs = {positions[j]: parsed[j] for j in np.flatnonzero(ok).tolist()}
        slow.extend(positions[j] for j in np.flatnonzero(~ok).tolist())
        return docs, slow

    def _names_ok(self, sparse: dict[str, list[int]]) -> bool:
        for name in sparse:
            if name not in self._names:
                if not name or len(name.encode("utf-8")) > _NAME_MAX_BYTES:
                    return False
                if len(self._names) < _NAMES_CACHED:
                    self._names.add(name)
        return True


def make_decoder(section: InputSection) -> Decoder:
    if section.format == "json":
        return _guarded(Example.from_json)
    if section.format == "binary":
        return _guarded(Example.from_bytes)
    if section.format == "csv":
        return _guarded(CsvDecoder(section.csv_columns))
    # Whatever a user's decoder raises on a record (struct.error, its own exceptions) makes
    # that record bad, not the trainer: a task that stopped every trainer that retried it
    # would stop training. A bug in the built-ins, though, should surface.
    return _guarded(_user_decoder(section.format), user=True)


def _guarded(decode: Callable[[bytes], Example], user: bool = False) -> Decoder:
    failures = Exception if user else (SchemaError, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError)

    def run(value: bytes) -> Example:
        if value is None:
            raise DecodeError("record has no value (a tombstone)")
        try:
            example = decode(value)
        except DecodeError:
            raise
        except failures as exc:
            # A user's exception is named: "error: unpack requires a buffer of 8 bytes" alone
            # does not say it came from struct.
            reason = f"{type(exc).__module__}.{type(exc).__name__}: {exc}" if user else str(exc)
            raise DecodeError(reason or type(exc).__name__) from exc
        if not isinstance(example, Example):
            raise DecodeError(f"decoder returned {type(example).__name__}, not schemas.Example")
        return example

    return run


def _user_decoder(spec: str) -> Callable[[bytes], Example]:
    module_name, _, attr = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"input.format {spec!r}: cannot load the decoder: {exc}") from exc
    if not callable(target):
        raise ValueError(f"input.format {spec!r}: {attr} is not callable")
    return target


def stable_id(token: str) -> int:
    """A categorical value that is not a number becomes a stable 63-bit id."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little") >> 1


class CsvDecoder:
    """One CSV line per record. A sparse cell holds one or more ids separated by '|'; ids
    that are not non-negative integers are hashed, so raw categories ("ios") work as they are."""

    def __init__(self, columns: tuple[CsvColumn, ...]) -> None:
        self.columns = columns

    def __call__(self, value: bytes) -> Example:
        rows = list(csv.reader([value.decode("utf-8").rstrip("\r\n")]))
        cells = rows[0] if rows else []
        if len(cells) != len(self.columns):
            raise DecodeError(f"csv: {len(cells)} columns, the job declares {len(self.columns)}")
        sparse: dict[str, tuple[int, ...]] = {}
        dense: list[float] = []
        label, ts = None, 0
        for column, cell in zip(self.columns, cells):
            cell = cell.strip()
            try:
                if column.kind == "label":
                    label = float(cell)
                elif column.kind == "dense":
                    dense.append(float(cell))
                elif column.kind == "time":
                    ts = int(cell)
                else:
                    sparse[column.name] = tuple(int(t) if t.isdigit() else stable_id(t)
                                                for t in cell.split("|") if t)
            except ValueError as exc:
                raise DecodeError(f"csv column {column.name!r} ({column.kind}): {cell!r} is not a number") from exc
        return Example(sparse, tuple(dense), label, ts)
