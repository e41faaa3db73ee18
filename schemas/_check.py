"""Validation shared by every format: one Check per format turns a bad value into SchemaError."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .errors import SchemaError

T = TypeVar("T")

U16_MAX = 2**16 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
# Kafka offsets and timestamps are signed 64-bit on the broker.
I64_MAX = 2**63 - 1
# Field, parameter and table names travel behind a u8 length prefix.
NAME_MAX_BYTES = 255

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# A job name prefixes Kafka topics, etcd keys and Redis keys, so it takes the strictest rules.
_JOB = re.compile(r"[A-Za-z0-9._-]{1,100}")
# Checkpoint ids become etcd key segments (checkpoints/<id>/...) and directory names.
_CHECKPOINT_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class Check:
    format: str
    version: int | None = None

    def error(self, field: str, reason: str) -> SchemaError:
        return SchemaError(self.format, field, reason, self.version)

    def integer(self, field: str, value: object, lo: int = 0, hi: int = I64_MAX) -> int:
        # bool is an int subclass; a True offset is always a bug upstream.
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise self.error(field, f"expected an integer, got {type(value).__name__}")
        value = int(value)
        if not lo <= value <= hi:
            raise self.error(field, f"{value} is out of range [{lo}, {hi}]")
        return value

    def number(self, field: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise self.error(field, f"expected a number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError as exc:  # a JSON integer too large for a double
            raise self.error(field, "number too large") from exc
        if not math.isfinite(value):
            raise self.error(field, f"{_nonfinite_word(value)} not allowed")
        return value

    def text(self, field: str, value: object, max_bytes: int = U16_MAX) -> str:
        """A non-empty string that encodes to at most ``max_bytes`` of UTF-8."""
        if not isinstance(value, str):
            raise self.error(field, f"expected a string, got {type(value).__name__}")
        if not value:
            raise self.error(field, "must not be empty")
        size = len(utf8(self, field, value))
        if size > max_bytes:
            raise self.error(field, f"{size} bytes of UTF-8, at most {max_bytes} allowed")
        return value

    def name(self, field: str, value: object) -> str:
        return self.text(field, value, NAME_MAX_BYTES)

    def optional_text(self, field: str, value: object) -> str | None:
        return None if value is None else self.text(field, value)

    def topic(self, field: str, value: object) -> str:
        if not isinstance(value, str) or not _TOPIC.fullmatch(value) or value in (".", ".."):
            raise self.error(field, f"{value!r} is not a Kafka topic name ([A-Za-z0-9._-]{{1,249}})")
        return value

    def job(self, field: str, value: object) -> str:
        if not isinstance(value, str) or not _JOB.fullmatch(value) or value in (".", ".."):
            raise self.error(field, f"{value!r} is not a job name ([A-Za-z0-9._-]{{1,100}}, not '.' or '..')")
        return value

    def checkpoint_id(self, field: str, value: object) -> str:
        # "latest" would collide with the checkpoints/latest pointer key.
        if not isinstance(value, str) or not _CHECKPOINT_ID.fullmatch(value) or value in (".", "..", "latest"):
            raise self.error(field, f"{value!r} is not a checkpoint id ([A-Za-z0-9._-]{{1,128}}, "
                                    "not '.', '..', 'latest')")
        return value

    def finite(self, field: str, values: np.ndarray, per_element: bool = False) -> None:
        """Vectorised: one pass of np.isfinite; the slow path only runs to word the error.

        per_element names the element in the field (``dense[3]``) rather than in the reason.
        """
        finite = np.isfinite(values)
        if finite.all():
            return
        where = np.unravel_index(int(np.argmin(finite)), values.shape)
        word = _nonfinite_word(float(values[where]))
        at = "][".join(str(int(i)) for i in where)
        if per_element:
            raise self.error(f"{field}[{at}]", f"{word} not allowed")
        raise self.error(field, f"{word} not allowed (at [{at}])")

    def rows(self, field: str, ids: object, values: object, per: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows of a table: `ids` a 1-D array of non-negative integers, `values` one finite row
        of 1 to 65535 floats per id, at most U32_MAX rows (one `per`); returns them as uint64
        and C-contiguous float32, copied only if they are not already. Fields `<field>ids`
        and `<field>values`."""
        if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise self.error(f"{field}ids", f"expected a 1-D integer array, got {_describe(ids)}")
        if ids.dtype.kind == "i" and ids.size and ids.min() < 0:
            raise self.error(f"{field}ids", f"negative id at [{int(np.argmax(ids < 0))}]")
        values = self.float_array(f"{field}values", values, ndim=2)
        if values.shape[0] != ids.size:
            raise self.error(f"{field}values", f"{values.shape[0]} rows for {ids.size} ids")
        if not 1 <= values.shape[1] <= U16_MAX:
            raise self.error(f"{field}values", f"dim {values.shape[1]} is out of range [1, {U16_MAX}]")
        if ids.size > U32_MAX:
            raise self.error(f"{field}ids", f"{ids.size} rows, at most {U32_MAX} per {per}")
        return ids.astype(np.uint64, copy=False), values

    def decoded_rows(self, field: str, table: str, values: np.ndarray) -> None:
        """What is left to check of a table's rows as `Reader.table_rows` read them (uint64
        ids, float32 rows, as many as ids, of a u16 width): the name, the width and that the
        values are finite. Fields `<field>table` and `<field>values`."""
        if not table:
            raise self.error(f"{field}table", "must not be empty")
        if values.shape[1] < 1:
            raise self.error(f"{field}values", f"dim {values.shape[1]} is out of range [1, {U16_MAX}]")
        self.finite(f"{field}values", values)

    def named_values(self, name_field: str, name: str, values: np.ndarray) -> None:
        """What is left to check of a named array of the wire's types (a name of at most 255
        bytes, a float32 array): a name and finite values (field ``values``)."""
        if not name:
            raise self.error(name_field, "must not be empty")
        self.finite("values", values)

    def float_array(self, field: str, values: object, ndim: int) -> np.ndarray:
        """Any floating array of the right rank, as C-contiguous float32 (no copy if it already is)."""
        if not isinstance(values, np.ndarray):
            raise self.error(field, f"expected a numpy array, got {type(values).__name__}")
        if values.dtype.kind != "f":
            raise self.error(field, f"expected a floating-point array, got dtype {values.dtype}")
        if values.ndim != ndim:
            raise self.error(field, f"expected {ndim}-D, got shape {values.shape}")
        # Check before narrowing so a float64 NaN is reported as such, then again after:
        # a finite float64 above 3.4e38 becomes inf in float32.
        self.finite(field, values)
        with np.errstate(over="ignore"):
            narrowed = np.ascontiguousarray(values, dtype=np.float32)
        if narrowed is not values:
            self.finite(field, narrowed)
        return narrowed


def unchecked(cls: type[T], **fields: object) -> T:
    """An instance of the frozen dataclass `cls` holding `fields` as given, its own checks
    skipped: for values decoded from the wire or made by our own code, whose types the
    format or the maker guarantees, where the checks would be much of the cost (the caller
    checks what is left)."""
    out = object.__new__(cls)
    out.__dict__.update(fields)
    return out


def utf8(check: Check, field: str, value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates, e.g. from os.fsdecode
        raise check.error(field, f"not encodable as UTF-8: {exc.reason}") from exc


def _nonfinite_word(value: float) -> str:
    return "NaN" if math.isnan(value) else "inf"


def nested(err: SchemaError, check: Check, prefix: str) -> SchemaError:
    """Re-home an error raised by a part (a DenseSlice, a FileEntry) under its place in the whole."""
    return check.error(f"{prefix}.{err.field}", err.reason)


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
