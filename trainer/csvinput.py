"""CSV input: one line per record, columns declared by `input.csv_columns`.

`CsvDecoder` decodes one line into an Example; `CsvChunks` decodes a chunk of lines in C
(pyarrow's reader splits the cells, its casts convert the numbers) and hands the lines it
refuses to `CsvDecoder`, so the verdict on a line is the one-by-one decoder's. The error type
and the id hash come from trainer/decoders.py, as for trainer/declared.py.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv

from streamtrain.schemas import Example
from streamtrain.schemas.config import CsvColumn
from streamtrain.trainer.features import Columns


class CsvChunks:
    """CSV lines in C: pyarrow's reader splits a chunk's lines into cells, its casts convert
    numbers and plain ids. A cell a cast refuses is converted in Python exactly as CsvDecoder
    would (it strips, it takes '1_000' and raw categories); a line that still fails, has
    another number of cells, is empty, quoted, or holds a line break, goes to CsvDecoder whole."""

    def __init__(self, columns: tuple[CsvColumn, ...], fields: Sequence[str], dense_features: int,
                 stable_id: Callable[[str], int]) -> None:
        self.columns = columns
        self._stable_id = stable_id
        self.names = [f"c{j}" for j in range(len(columns))]  # positional: the reader wants names
        self.sparse = {c.name: j for j, c in enumerate(columns) if c.kind == "sparse"}
        self.fields = tuple(fields)
        self.dense = [j for j, c in enumerate(columns) if c.kind == "dense"]
        self.label = next(j for j, c in enumerate(columns) if c.kind == "label")
        self.time = next((j for j, c in enumerate(columns) if c.kind == "time"), None)
        self.usable = len(self.dense) == dense_features  # else every record is refused, one by one
        self._read = pv.ReadOptions(column_names=self.names, use_threads=False)
        # `ignore` columns are split but never converted.
        self._convert = pv.ConvertOptions(column_types={n: pa.string() for n in self.names},
                                          include_columns=[n for n, c in zip(self.names, columns)
                                                           if c.kind != "ignore"],
                                          strings_can_be_null=False, quoted_strings_can_be_null=False)

    def parse(self, values: Sequence[bytes | None]) -> tuple[Columns, np.ndarray, list[int]]:
        """(columns of the records decoded here, their positions, positions for CsvDecoder)."""
        lines: Sequence[bytes]
        at: Any  # the lines' positions: a range or a list, then an int64 array
        slow: list[int]
        plain = _plain_lines(values) if self.usable else None
        if plain is not None:  # the usual chunk: every record one plain line, checked in C
            lines, at, slow, joined = cast("Sequence[bytes]", values), range(len(values)), [], plain  # no None
        else:
            kept: list[bytes] = []
            lines, at, slow = kept, [], []
            if self.usable:
                for i, value in enumerate(values):
                    line = value.rstrip(b"\r\n") if value is not None else b""
                    if not line or b"\n" in line or b"\r" in line or b'"' in line:
                        slow.append(i)
                    else:
                        kept.append(line)
                        at.append(i)
            else:
                slow = list(range(len(values)))
            joined = b"\n".join(lines)
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:  # rare: find the lines that are not UTF-8
            valid = [_utf8(line) for line in lines]
            slow.extend(i for i, ok in zip(at, valid) if not ok)
            lines = [line for line, ok in zip(lines, valid) if ok]
            at = [i for i, ok in zip(at, valid) if ok]
            joined = b"\n".join(lines)
        if not lines:
            return _empty_columns(len(self.fields), len(self.dense)), np.zeros(0, dtype=np.int64), sorted(slow)
        wrong: list[int] = []

        def skip(row: pv.InvalidRow) -> str:
            wrong.append(row.number - 1)  # 1-based line numbers
            return "skip"

        table = pv.read_csv(pa.py_buffer(joined), read_options=self._read, convert_options=self._convert,
                            parse_options=pv.ParseOptions(invalid_row_handler=skip))
        at = np.asarray(at, dtype=np.int64)
        if wrong:
            keep = np.ones(len(at), dtype=bool)
            keep[wrong] = False
            slow.extend(at[~keep].tolist())
            at = at[keep]
        n = len(at)
        ok = np.ones(n, dtype=bool)
        cells = [table.column(name) if column.kind != "ignore" else None
                 for name, column in zip(self.names, self.columns)]
        dense = np.stack([self._numbers(cells[j], ok, float) for j in self.dense], axis=1) if self.dense \
            else np.zeros((n, 0))
        labels = self._numbers(cells[self.label], ok, float)
        times = self._numbers(cells[self.time], ok, int, pa.int64()) if self.time is not None \
            else np.zeros(n, dtype=np.int64)
        with np.errstate(over="ignore", invalid="ignore"):
            dense32 = dense.astype(np.float32)
            ok &= np.isfinite(dense32).all(axis=1) & np.isfinite(dense).all(axis=1)
            ok &= (labels >= 0.0) & (labels <= 1.0) & (times >= 0)
        sparse = [self._ids(cells[self.sparse[f]], ok) if f in self.sparse
                  else (np.zeros(0, dtype=np.uint64), np.zeros(n, dtype=np.int64)) for f in self.fields]
        if not ok.all():
            slow.extend(at[~ok].tolist())
            sparse = [_rows(ids, counts, ok) for ids, counts in sparse]
            dense32, labels, times, at = dense32[ok], labels[ok], times[ok], at[ok]
        slow.sort()
        return Columns(tuple(sparse), dense32, labels.astype(np.float32), times.astype(np.int64)), at, slow

    @staticmethod
    def _numbers(column: pa.ChunkedArray, ok: np.ndarray, parse, arrow_type: pa.DataType = pa.float64()
                 ) -> np.ndarray:
        """The column as numbers; a cell neither pyarrow's cast nor `parse` (after strip)
        takes clears its row in `ok`."""
        # pyarrow's integer cast also takes '0x10', which `int` refuses: integers must be digits.
        if parse is float or pc.all(pc.ascii_is_decimal(column)).as_py():
            try:
                return pc.cast(column, arrow_type).to_numpy()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        out = np.zeros(len(column), dtype=np.float64 if parse is float else np.int64)
        for k, cell in enumerate(column.to_pylist()):
            try:
                out[k] = parse(cell.strip())
            except (ValueError, OverflowError):
                ok[k] = False
        return out

    def _ids(self, column: pa.ChunkedArray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One id per cell where every cell is a plain number that fits 64 bits (in C); else
        each cell as CsvDecoder splits and hashes it."""
        # ASCII digits only, and at least one: what `str.isdigit` then `int` take as the id
        # itself (a '+5' or '0x10' is a category to CsvDecoder, though pyarrow's cast takes it).
        if pc.all(pc.ascii_is_decimal(column)).as_py():
            try:
                return pc.cast(column, pa.uint64()).to_numpy(), np.ones(len(column), dtype=np.int64)
            except pa.ArrowInvalid:
                pass  # beyond 2^64 - 1: refused one by one
        ids, counts = [], np.zeros(len(column), dtype=np.int64)
        for k, cell in enumerate(column.to_pylist()):
            try:
                row = [int(t) if t.isdigit() else self._stable_id(t) for t in cell.strip().split("|") if t]
            except ValueError:  # a digit int() does not take ('²')
                ok[k] = False
                continue
            if any(i > 2**64 - 1 for i in row):
                ok[k] = False
                continue
            ids += row
            counts[k] = len(row)
        return np.array(ids, dtype=np.uint64), counts


def _plain_lines(values: Sequence[bytes | None]) -> bytes | None:
    """The records joined by line breaks if every one is a non-empty line with no line break,
    carriage return or quote (what the per-record checks let through unchanged), else None."""
    try:
        joined = b"\n".join(values)  # type: ignore[arg-type]  # a None raises TypeError: handled
    except TypeError:  # a record without a value
        return None
    if (not joined or joined.count(b"\n") != len(values) - 1 or b"\r" in joined or b'"' in joined
            or b"\n\n" in joined or joined[:1] == b"\n" or joined[-1:] == b"\n"):
        return None
    return joined


def _utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _rows(ids: np.ndarray, counts: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (ids, counts) of the examples `keep` selects."""
    return ids[np.repeat(keep, counts)], counts[keep]


def _empty_columns(fields: int, dense_features: int) -> Columns:
    return Columns(tuple((np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)) for _ in range(fields)),
                   np.zeros((0, dense_features), dtype=np.float32), np.zeros(0, dtype=np.float32),
                   np.zeros(0, dtype=np.int64))


class CsvDecoder:
    """One CSV line per record. A sparse cell holds one or more ids separated by '|'; ids
    that are not non-negative integers are hashed, so raw categories ("ios") work as they are."""

    def __init__(self, columns: tuple[CsvColumn, ...], error: type[Exception], stable_id: Callable[[str], int]) -> None:
        self.columns = columns
        self._error = error
        self._stable_id = stable_id

    def __call__(self, value: bytes) -> Example:
        try:
            rows = list(csv.reader([value.decode("utf-8").rstrip("\r\n")]))
        except csv.Error as exc:  # a line break inside the record, say: that record is bad
            raise self._error(f"csv: {exc}") from exc
        cells = rows[0] if rows else []
        if len(cells) != len(self.columns):
            raise self._error(f"csv: {len(cells)} columns, the job declares {len(self.columns)}")
        sparse: dict[str, tuple[int, ...]] = {}
        dense: list[float] = []
        label, ts = None, 0
        for column, cell in zip(self.columns, cells):
            if column.kind == "ignore":
                continue
            cell = cell.strip()
            try:
                if column.kind == "label":
                    label = float(cell)
                elif column.kind == "dense":
                    dense.append(float(cell))
                elif column.kind == "time":
                    ts = int(cell)
                else:
                    sparse[column.name] = tuple(int(t) if t.isdigit() else self._stable_id(t)
                                                for t in cell.split("|") if t)
            except ValueError as exc:
                raise self._error(f"csv column {column.name!r} ({column.kind}): {cell!r} is not a number") from exc
        assert label is not None  # a job declares one label column (JobConfig checks)
        return Example(sparse, tuple(dense), label, ts)
