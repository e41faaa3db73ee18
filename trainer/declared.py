"""A log's own JSON documents, decoded by the paths the job declares (`input.fields`,
schemas/fields.py, which says what each path may hold).

`DeclaredJson` decodes one record and is the reference: what it accepts and the reasons it
gives are the verdicts (`DeclaredRecord` maps the parsed record, for Avro's too). `DeclaredFast` reads a chunk with
pyarrow's JSON reader, in C,
and converts the declared columns vectorised; strings become ids once per distinct string. A
chunk pyarrow cannot read as one table (a value whose type changes between records, a record
that is not an object) and every record a vectorised check refuses go to `DeclaredJson`, so
the fast path decides speed, never acceptance (a hypothesis test holds the two equal).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from streamtrain.schemas import Example
from streamtrain.schemas.fields import DeclaredFields, LabelRule
from streamtrain.trainer.features import Columns

_MISSING = object()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MS = dt.timedelta(milliseconds=1)
_COMPARE = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal, "==": np.equal,
            "!=": np.not_equal}


class DeclaredRecord:
    """A parsed record (objects as dicts, arrays as lists: what a JSON or an Avro decoder
    gives) into an Example by the declared paths. Raises `error` naming the path; `kind`
    names the format in the reasons."""

    def __init__(self, fields: DeclaredFields, error: type[Exception], stable_id, kind: str) -> None:
        self.fields = fields
        self._error = error
        self._stable_id = stable_id
        self._kind = kind
        self._defaults = dict(fields.defaults)

    def example(self, doc: dict) -> Example:
        f = self.fields
        sparse = {name: self._ids(path, self._get(doc, path)) for name, path in f.sparse}
        dense = tuple(self._number(path, self._required(doc, path, "dense")) for path in f.dense)
        label = self._label(f.label, self._required(doc, f.label.path, "label"))
        ts = 0 if f.time is None else self._time(f.time, self._required(doc, f.time, "time"))
        return Example({k: v for k, v in sparse.items() if v}, dense, label, ts)

    def _get(self, doc: dict, path: str) -> object:
        node: object = doc
        walked: list[str] = []
        for key in path.split("."):
            if node is None:
                break
            if not isinstance(node, dict):
                raise self._error(f"{self._kind} field {path!r}: {'.'.join(walked)!r} is {_show(node)}, not an object")
            node = node.get(key)
            walked.append(key)
        return self._defaults.get(path, _MISSING) if node is None else node

    def _required(self, doc: dict, path: str, what: str) -> object:
        value = self._get(doc, path)
        if value is _MISSING:
            raise self._error(f"{self._kind} field {path!r} ({what}): missing, and no default")
        return value

    def _ids(self, path: str, value: object) -> tuple[int, ...]:
        if value is _MISSING:
            return ()
        items = value if isinstance(value, list) else (value,)
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(self._stable_id(item))
            elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**64:
                out.append(item)
            else:
                raise self._error(f"{self._kind} field {path!r} (sparse): {_show(item)} is not an id "
                                  f"(an integer 0..2^64-1 or a string)")
        return tuple(out)

    def _number(self, path: str, value: object) -> float:
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return self._float(path, "dense", value)
        raise self._error(f"{self._kind} field {path!r} (dense): {_show(value)} is not a number")

    def _float(self, path: str, what: str, value: int | float | Decimal) -> float:
        try:
            return float(value)
        except OverflowError:  # an integer literal beyond any double
            raise self._error(f"{self._kind} field {path!r} ({what}): {_show(value)} is too large") from None

    def _label(self, rule: LabelRule, value: object) -> float:
        if rule.op is None and isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            number = self._float(rule.path, "label", value)
            if rule.op is None:
                return number
            return float(bool(_COMPARE[rule.op](number, rule.threshold)))
        wanted = "a number" if rule.op else "true, false or a number"
        raise self._error(f"{self._kind} field {rule.path!r} (label): {_show(value)} is not {wanted}")

    def _time(self, path: str, value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str):
            ms = iso_ms(value)
            if ms is not None:
                return ms
        if isinstance(value, dt.datetime):  # Avro's timestamp-millis and -micros
            ms = datetime_ms(value)
            if ms >= 0:
                return ms
        raise self._error(f"{self._kind} field {path!r} (time): {_show(value)} is neither epoch milliseconds (>= 0) "
                          f"nor an ISO-8601 time")


class DeclaredJson(DeclaredRecord):
    """One JSON record into an Example."""

    def __init__(self, fields: DeclaredFields, error: type[Exception], stable_id) -> None:
        super().__init__(fields, error, stable_id, "json")

    def __call__(self, value: bytes) -> Example:
        try:
            doc = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
            raise self._error(f"json: {exc}") from exc
        if not isinstance(doc, dict):
            raise self._error(f"json: a record must be an object, got {type(doc).__name__}")
        return self.example(doc)


def iso_ms(text: str) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 time (UTC unless it names an offset), or None."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    ms = datetime_ms(when)
    return ms if ms >= 0 else None


def datetime_ms(when: dt.datetime) -> int:
    """Milliseconds since the epoch (UTC unless `when` names an offset)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (when - _EPOCH) // _MS


def object_lines(values: Sequence[bytes | None]) -> bytes | None:
    """The records joined by line breaks, for pyarrow's JSON reader, if every one is a single
    line of UTF-8 that starts with '{'; else None. pyarrow 26's reader crashes the process on
    a block whose first record is `null`, and takes bytes that are not UTF-8, which a JSON
    parser refuses, even in a field nobody reads."""
    # A record without a value (None) makes the join raise TypeError: no lines then.
    records = cast("Sequence[bytes]", values)
    try:
        joined = b"\n".join(records)
    except TypeError:
        return None
    if not records or joined.count(b"\n") != len(records) - 1 or b"\r" in joined:
        return None  # a line break inside a record: lines would not be records
    if not all(value[:1] == b"{" for value in records):
        return None
    if not joined.isascii():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return joined


def _only_json_numbers(column: pa.Array) -> bool:
    """Whether every float in `column`, at any depth, could have come from a JSON parser:
    pyarrow's reader also takes NaN, Infinity and numbers beyond a double (as infinity or the
    largest double), which a JSON parser refuses, even in a field nobody reads."""
    kind = column.type
    if pa.types.is_floating(kind):
        finite = pc.fill_null(pc.less(pc.abs(column), _DOUBLE_MAX), True)
        return pc.all(finite).as_py() is not False
    if pa.types.is_struct(kind):
        return all(_only_json_numbers(pc.struct_field(column, i)) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _only_json_numbers(pc.list_flatten(column))
    return True


_DOUBLE_MAX = float(np.finfo(np.float64).max)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class DeclaredFast:
    """A chunk of records into the job's columns in C where they have the usual shape: JSON
    lines read by pyarrow's reader, or records already parsed into dicts (Avro's)."""

    def __init__(self, fields: DeclaredFields, model_fields: Sequence[str], dense_features: int, stable_id) -> None:
        self.fields = fields
        self.model_fields = tuple(model_fields)
        self.usable = len(fields.dense) == dense_features  # else every record is refused, one by one
        self._stable_id = stable_id
        self._defaults = dict(fields.defaults)
        self._read = pj.ReadOptions(use_threads=False, block_size=1 << 30)

    def parse(self, values: Sequence[bytes | None]) -> tuple[Columns, np.ndarray, list[int]] | None:
        """(columns of the records decoded here, their positions, positions for DeclaredJson),
        or None: the whole chunk goes one by one."""
        joined = object_lines(values) if self.usable else None
        if joined is None:
            return None
        try:
            table = pj.read_json(pa.py_buffer(joined), read_options=self._read)
            if table.num_rows != len(values):
                return None
            return self._convert(table, len(values))
        except pa.ArrowException:
            # What pyarrow cannot read or convert (its JSON reader builds some list columns
            # that its own concatenation refuses: `[null, 0]`) the reference decides.
            return None

    def parse_documents(self, docs: Sequence[dict]) -> tuple[Columns, np.ndarray, list[int]] | None:
        """As `parse`, for parsed records; positions are in `docs`. None: one by one."""
        if not self.usable or not docs:
            return None
        try:
            # One struct array infers every record's keys (a table from a list takes the
            # first record's), so records of two schema versions share a chunk.
            table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(docs))])
            return self._convert(table, len(docs))
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return None

    def _convert(self, table: pa.Table, n: int) -> tuple[Columns, np.ndarray, list[int]] | None:
        if not all(_only_json_numbers(c.combine_chunks()) for c in table.columns):
            return None
        ok = np.ones(n, dtype=bool)
        by_path = {}
        declared = dict(self.fields.sparse)
        for name, path in self.fields.sparse:
            by_path[name] = self._ids(_column(table, path, n), path, ok)
        dense = np.stack([self._numbers(_column(table, p, n), p, ok) for p in self.fields.dense], axis=1) \
            if self.fields.dense else np.zeros((n, 0))
        labels = self._label(_column(table, self.fields.label.path, n), ok)
        time = self.fields.time
        times = self._times(_column(table, time, n), time, ok) if time else np.zeros(n, np.int64)
        with np.errstate(over="ignore", invalid="ignore"):
            dense32 = dense.astype(np.float32)
            ok &= np.isfinite(dense32).all(axis=1) & np.isfinite(dense).all(axis=1)
            ok &= (labels >= 0.0) & (labels <= 1.0)
        empty = (np.zeros(0, dtype=np.uint64), np.zeros(n, dtype=np.int64))
        sparse = [by_path[f] if f in declared else empty for f in self.model_fields]
        if not ok.all():
            sparse = [(ids[np.repeat(ok, counts)], counts[ok]) for ids, counts in sparse]
            dense32, labels, times = dense32[ok], labels[ok], times[ok]
        at = np.flatnonzero(ok)
        slow = np.flatnonzero(~ok).tolist()
        return Columns(tuple(sparse), dense32, labels.astype(np.float32), times.astype(np.int64)), at, slow

    # Each converter returns one value per record and clears `ok` where it cannot decide.
    def _nulls(self, col: pa.Array, path: str, ok: np.ndarray, required: bool) -> np.ndarray:
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        if nulls.any() and (required or path in self._defaults):
            ok &= ~nulls  # missing: a default or an error, both one by one
        return nulls

    def _ids(self, col: pa.Array, path: str, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(col)
        nulls = self._nulls(col, path, ok, required=False)
        kind = col.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            counts = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
            flat = pc.list_flatten(col)
            ids, good = self._scalar_ids(flat)
            owner = np.repeat(np.arange(n), counts)
            ok[owner[~good]] = False
            return ids, counts
        counts = (~nulls).astype(np.int64)
        present = col.filter(pc.invert(col.is_null())) if nulls.any() else col
        ids, good = self._scalar_ids(present)
        ok[np.flatnonzero(~nulls)[~good]] = False
        return ids, counts

    def _scalar_ids(self, col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(ids, which are good) of a column of scalars, none null where it matters."""
        kind, n = col.type, len(col)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            encoded = pc.dictionary_encode(col).combine_chunks() if isinstance(col, pa.ChunkedArray) \
                else pc.dictionary_encode(col)
            table = np.array([self._stable_id(s) for s in encoded.dictionary.to_pylist()], dtype=np.uint64)
            good = ~encoded.indices.is_null().to_numpy(zero_copy_only=False)
            # Filled first: with a null among them the indices came out as floats (NaN for it).
            indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
            return table[indices] if len(table) else np.zeros(n, np.uint64), good
        if pa.types.is_integer(kind):
            values = col.to_numpy(zero_copy_only=False)
            if col.null_count:
                return np.zeros(n, np.uint64), np.zeros(n, dtype=bool)
            good = values >= 0
            return values.astype(np.uint64), good
        if pa.types.is_null(kind):
            return np.zeros(n, np.uint64), np.zeros(n, dtype=bool)
        return np.zeros(n, np.uint64), np.zeros(n, dtype=bool)  # floats, booleans, objects: one by one

    def _numbers(self, col: pa.Array, path: str, ok: np.ndarray) -> np.ndarray:
        nulls = self._nulls(col, path, ok, required=True)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            return pc.fill_null(pc.cast(col, pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False)
        ok &= nulls  # any other type is refused, one by one
        return np.zeros(len(col))

    def _label(self, col: pa.Array, ok: np.ndarray) -> np.ndarray:
        rule = self.fields.label
        self._nulls(col, rule.path, ok, required=True)
        kind = col.type
        if pa.types.is_boolean(kind) and rule.op is None:
            return pc.fill_null(pc.cast(col, pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False)
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            values = pc.fill_null(pc.cast(col, pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False)
            return values if rule.op is None else _COMPARE[rule.op](values, rule.threshold).astype(np.float64)
        ok[:] = False
        return np.zeros(len(col))

    def _times(self, col: pa.Array, path: str, ok: np.ndarray) -> np.ndarray:
        self._nulls(col, path, ok, required=True)
        kind = col.type
        if pa.types.is_integer(kind):
            values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            ok &= values >= 0
            return values
        if pa.types.is_timestamp(kind):  # the reader's own reading of ISO-8601 strings
            values = pc.fill_null(pc.cast(pc.cast(col, pa.timestamp("ms", kind.tz)), pa.int64()), -1)
            values = values.to_numpy(zero_copy_only=False)
            ok &= values >= 0
            return values
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            encoded = pc.dictionary_encode(col)
            parsed = [iso_ms(s) for s in encoded.dictionary.to_pylist()]
            table = np.array([-1 if ms is None else ms for ms in parsed], dtype=np.int64)
            indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
            values = table[indices] if len(table) else np.zeros(len(col), np.int64)
            ok &= values >= 0
            return values
        ok[:] = False
        return np.zeros(len(col), np.int64)


def _column(table: pa.Table, path: str, n: int) -> pa.Array:
    """The values at `path` (null where a record lacks it); all null when no record has it. A
    parent that is not an object in some record makes the reader fail first (its type
    changes), so every parent here is a struct or absent."""
    first, *rest = path.split(".")
    if first not in table.column_names:
        return pa.nulls(n)
    col = table.column(first).combine_chunks()
    for key in rest:
        if pa.types.is_null(col.type) or (pa.types.is_struct(col.type) and col.type.get_field_index(key) < 0):
            return pa.nulls(n)
        if not pa.types.is_struct(col.type):  # a scalar where an object should be: one by one
            return pa.array([{"": 0}] * n)
        col = pc.struct_field(col, key)
    return col
