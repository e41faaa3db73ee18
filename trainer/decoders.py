"""Record bytes → examples, as the job's `input.format` names it.

Built-ins: `json` and `binary` (the schemas/ formats, or with `json` a log's own documents by
the paths of `input.fields`), `csv` (one line per record, columns declared by
`input.csv_columns`), `avro` and `protobuf` (Confluent's wire format, schemas from a registry,
trainer/registered.py); anything else is a user's "module:callable" taking the
record's value bytes and returning an Example. Every failure is a `DecodeError` with a reason
a person can act on; the trainer dead-letters the record and goes on.

`make_decoder` decodes one record into a `schemas.Example`. The trainer uses `ChunkDecoder`,
which decodes many records straight into the job's `Columns`: for JSON, a compiled pass over
the chunk's bytes takes the usual chunk whole (trainer/jsonscan.py), pyarrow's JSON reader the
rest of the chunks of one document shape, and otherwise msgspec parses and type-checks each
record in C against a schema that accepts only what `Example.from_json` accepts, and the
remaining checks run vectorised over the chunk; for CSV (trainer/csvinput.py),
pyarrow's reader splits the chunk's lines in C and its casts convert the numbers, with Python only for the
cells they refuse. A record the fast path refuses goes through the one-record decoder, so its
reason (and the verdict) are the same as one by one: the fast path decides speed, never
acceptance.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Literal, NoReturn, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from streamtrain.infra.endpoints import Endpoints
from streamtrain.schemas import Example, SchemaError, StreamtrainError
from streamtrain.schemas.config import InputSection, JobConfigError
from streamtrain.trainer.csvinput import CsvChunks, CsvDecoder
from streamtrain.trainer.declared import DeclaredFast, DeclaredJson, object_lines
from streamtrain.trainer.features import Columns
from streamtrain.trainer.registered import DeclaredAvro, DeclaredProtobuf, Fetch, registry_fetch

# A record's value, or None for a tombstone, which the decoder refuses (a DecodeError) itself.
Decoder = Callable[[bytes | None], Example]

_NAME_MAX_BYTES = 255  # schemas: a field name travels behind a u8 length
_NAMES_CACHED = 4096  # valid field names remembered; a stream of ever new names stays bounded


class DecodeError(StreamtrainError, ValueError):
    """A record that is not an example of the job's format; the message says why."""


@dataclass(frozen=True)
class Decoded:
    columns: Columns  # the good records, in their order
    bad: list[tuple[int, str]]  # (position in the chunk, reason)


class ChunkDecoder:
    """Many records at once into the job's columns; also checks that each example fits the
    job (its dense width, a label in [0, 1])."""

    def __init__(self, section: InputSection, fields: Sequence[str], dense_features: int,
                 registry: Fetch | None = None) -> None:
        self.fields = tuple(fields)
        self.dense_features = dense_features
        self._framed = _framed_decoder(section, registry) if section.format in _FRAMED else None
        self._one = _guarded(self._framed) if self._framed is not None else make_decoder(section, registry)
        example_json = section.format == "json" and section.fields is None
        self._scan = None
        if example_json:
            # Here, not at the top: numba's import is a second of a process's start, which
            # only a loader of Example JSON need pay.
            from streamtrain.trainer.jsonscan import JsonScan

            self._scan = JsonScan(self.fields, dense_features)
        self._fast = _JsonFast() if example_json else None
        self._arrow = _JsonArrow(self.fields, dense_features) if example_json else None
        self._csv = CsvChunks(section.csv_columns, self.fields, dense_features, stable_id) \
            if section.format == "csv" else None
        self._declared = DeclaredFast(section.fields, self.fields, dense_features, stable_id) \
            if section.fields is not None else None

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        if self._csv is not None:
            return self._merge(values, *self._csv.parse(values))
        if self._framed is not None:
            return self._documents(values)
        if self._declared is not None:
            parsed = self._declared.parse(values)
            return self._merge(values, *parsed) if parsed is not None else Decoded(*self._one_by_one(values))
        if self._scan is not None:
            columns = self._scan.parse(values)
            if columns is not None:
                return Decoded(columns, [])
        if self._arrow is not None:
            columns = self._arrow.parse(values)
            if columns is not None:
                return Decoded(columns, [])
        picked: dict[int, _JsonDoc | Example]
        slow: Sequence[int]
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

    def _documents(self, values: Sequence[bytes | None]) -> Decoded:
        """Avro, Protobuf: each value read into a dict (or judged bad), the dicts converted at once."""
        assert self._framed is not None and self._declared is not None
        docs: list[dict] = []
        at, bad = [], []
        for i, value in enumerate(values):
            try:
                # A tombstone is judged as one by one judges it.
                docs.append(self._framed.document(value) if value is not None else _tombstone())
                at.append(i)
            except DecodeError as exc:
                bad.append((i, str(exc)))
        parsed = self._declared.parse_documents(docs)
        if parsed is None:
            return Decoded(*self._one_by_one(values))
        fast, fast_at, slow = parsed
        positions = np.array(at, dtype=np.int64)
        decoded = self._merge(values, fast, positions[fast_at], [at[i] for i in slow])
        return Decoded(decoded.columns, sorted(decoded.bad + bad))

    def _merge(self, values: Sequence[bytes | None], fast: Columns, at: np.ndarray, slow: list[int]) -> Decoded:
        """The records a fast path decoded, with the others decoded one by one."""
        good, good_at, bad = [], [], []
        for i in slow:
            try:
                good.append(self.fit(self._one(values[i])))
                good_at.append(i)
            except DecodeError as exc:
                bad.append((i, str(exc)))
        if not good:
            return Decoded(fast, bad)
        rest = Columns.gather(good, self.fields, self.dense_features)
        return Decoded(Columns.interleave(fast, at, rest, np.array(good_at, dtype=np.int64)), bad)

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

    def parse(self, values: Sequence[bytes | None], dense_features: int
              ) -> tuple[dict[int, _JsonDoc | Example], list[int]]:
        """({position: doc} for records that pass every check, positions for the slow path;
        the caller adds the slow path's Examples to the same dict).

        The common case (every record parses) runs as C-level `map`s; per-record Python only
        runs for a chunk holding a record msgspec refuses."""
        # A tombstone (None) makes msgspec raise TypeError: that record goes the slow path.
        records = cast("Sequence[bytes]", values)
        positions: Sequence[int]
        try:
            parsed = list(map(self._decoder.decode, records))
            positions = range(len(records))
            slow: list[int] = []
        except (msgspec.DecodeError, TypeError):  # ValidationError is a DecodeError
            parsed, at, slow = [], [], []
            for i, value in enumerate(records):
                try:
                    parsed.append(self._decoder.decode(value))
                    at.append(i)
                except (msgspec.DecodeError, TypeError):
                    slow.append(i)
            positions = at
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
        docs: dict[int, _JsonDoc | Example] = {positions[j]: parsed[j] for j in np.flatnonzero(ok).tolist()}
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


class _JsonArrow:
    """A chunk of JSON records into columns in C, by pyarrow's JSON reader against the one
    document shape every record of the usual chunk has: `v` 1, every declared field and no
    other, unsigned integer ids, the job's dense width, a label in [0, 1], a time of at least
    zero. Any other chunk (a missing or extra key, a record another type refuses, a record
    over several lines) returns None and goes through `_JsonFast`, which decides record by
    record: so this decides speed, never a verdict. Alone it is several times faster than
    msgspec's objects gathered into columns (bench/RESULTS.md, "cheaper decoding, a shard round
    without lookups, pooling as a lookup")."""

    def __init__(self, fields: Sequence[str], dense_features: int) -> None:
        self.fields = tuple(fields)
        self.dense_features = dense_features
        schema = pa.schema([("v", pa.int64()),
                            ("sparse", pa.struct([(f, pa.list_(pa.uint64())) for f in self.fields])),
                            ("dense", pa.list_(pa.float64())), ("label", pa.float64()), ("ts", pa.int64())])
        self._parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error",
                                      newlines_in_values=False)
        self._read = pj.ReadOptions(use_threads=False, block_size=1 << 26)

    def parse(self, values: Sequence[bytes | None]) -> Columns | None:
        n = len(values)
        joined = object_lines(values)
        if joined is None:
            return None
        try:
            table = pj.read_json(pa.py_buffer(joined), read_options=self._read, parse_options=self._parse)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != n:  # an empty line skipped, or two documents on one
            return None
        table = table.combine_chunks()
        chunked = [table.column(i) for i in range(5)]
        if not all(c.num_chunks for c in chunked):
            return None
        v, sparse, dense, label, ts = (c.chunk(0) for c in chunked)
        if any(c.null_count for c in (v, sparse, dense, label, ts)):
            return None
        if not pc.all(pc.equal(v, 1)).as_py():
            return None
        columns = []
        for i in range(len(self.fields)):
            ids = sparse.field(i)
            if ids.null_count:  # a field left out (or null): as one by one would say
                return None
            columns.append((ids.flatten().to_numpy(zero_copy_only=False).astype(np.uint64, copy=False),
                            pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)))
        widths = pc.list_value_length(dense).to_numpy(zero_copy_only=False)
        if not (widths == self.dense_features).all():
            return None
        wide = dense.flatten().to_numpy(zero_copy_only=False).reshape(n, self.dense_features)
        labels = label.to_numpy(zero_copy_only=False)
        times = ts.to_numpy(zero_copy_only=False)
        with np.errstate(over="ignore", invalid="ignore"):
            dense32 = wide.astype(np.float32)
            fits = (np.isfinite(dense32).all() and np.isfinite(wide).all()
                    and bool(((labels >= 0.0) & (labels <= 1.0)).all()) and bool((times >= 0).all()))
        if not fits:
            return None
        return Columns(tuple(columns), dense32, labels.astype(np.float32), times.astype(np.int64))


def make_decoder(section: InputSection, registry: Fetch | None = None) -> Decoder:
    """The one-record decoder of `section`; with Avro, `registry` looks schemas up by id (by
    default over HTTP at `input.registry`, or the local registry)."""
    if section.format == "json" and section.fields is not None:
        return _guarded(DeclaredJson(section.fields, DecodeError, stable_id))
    if section.format == "json":
        return _guarded(Example.from_json)
    if section.format == "binary":
        return _guarded(Example.from_bytes)
    if section.format == "csv":
        return _guarded(CsvDecoder(section.csv_columns, DecodeError, stable_id))
    if section.format in _FRAMED:
        return _guarded(_framed_decoder(section, registry))
    # Whatever a user's decoder raises on a record (struct.error, its own exceptions) makes
    # that record bad, not the trainer: a task that stopped every trainer that retried it
    # would stop training. A bug in the built-ins, though, should surface.
    return _guarded(_user_decoder(section.format), user=True)


_FRAMED: dict[str, type[DeclaredAvro] | type[DeclaredProtobuf]] = {"avro": DeclaredAvro, "protobuf": DeclaredProtobuf}


def _framed_decoder(section: InputSection, registry: Fetch | None) -> DeclaredAvro | DeclaredProtobuf:
    assert section.fields is not None, f"the config requires [input.fields] with {section.format}"
    fetch = registry or registry_fetch(section.registry or Endpoints.resolve().registry)
    return _FRAMED[section.format](section.fields, DecodeError, stable_id, fetch)


def _guarded(decode: Callable[[bytes], Example], user: bool = False) -> Decoder:
    failures = Exception if user else (SchemaError, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError)

    def run(value: bytes | None) -> Example:
        if value is None:
            _tombstone()
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
            raise DecodeError(f"decoder returned {type(example).__name__}, not streamtrain.schemas.Example")
        return example

    return run


def _tombstone() -> NoReturn:
    raise DecodeError("record has no value (a tombstone)")


def _user_decoder(spec: str) -> Callable[[bytes], Example]:
    module_name, _, attr = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise JobConfigError("input.format", f"{spec!r}: cannot load the decoder: {exc}") from exc
    if not callable(target):
        raise JobConfigError("input.format", f"{spec!r}: {attr} is not callable")
    return target


def stable_id(token: str) -> int:
    """A categorical value that is not a number becomes a stable 63-bit id."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little") >> 1
