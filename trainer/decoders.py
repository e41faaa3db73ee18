"""Record bytes → `schemas.Example`, as the job's `input.format` names it.

Built-ins: `json` and `binary` (the schemas/ formats) and `csv` (one line per record, columns
declared by `input.csv_columns`); anything else is a user's "module:callable" taking the
record's value bytes and returning an Example. Every failure is a `DecodeError` with a reason
a person can act on; the trainer dead-letters the record and goes on.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
from collections.abc import Callable

from master.config import CsvColumn, InputSection
from schemas import Example, SchemaError

Decoder = Callable[[bytes], Example]


class DecodeError(ValueError):
    """A record that is not an example of the job's format; the message says why."""


def make_decoder(section: InputSection) -> Decoder:
    if section.format == "json":
        return _guarded(Example.from_json)
    if section.format == "binary":
        return _guarded(Example.from_bytes)
    if section.format == "csv":
        return _guarded(CsvDecoder(section.csv_columns))
    return _guarded(_user_decoder(section.format))


def _guarded(decode: Callable[[bytes], Example]) -> Decoder:
    def run(value: bytes) -> Example:
        if value is None:
            raise DecodeError("record has no value (a tombstone)")
        try:
            example = decode(value)
        except DecodeError:
            raise
        except (SchemaError, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from exc
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
