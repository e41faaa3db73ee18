"""Replay a file onto a topic, one record per row, at a paced rate, optionally looped.

CSV, Parquet and JSON lines are read through pyarrow in batches (`open_csv`, `open_json`,
`ParquetFile.iter_batches`), so a file far larger than memory streams through. A row becomes
a JSON object of its columns by default; a CSV file can instead be replayed as CSV lines
(`value="csv"`), its fields read as text so they go out as written (quoting may be normalised).
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from streamtrain.producers.errors import ReplayError
from streamtrain.producers.pacing import TokenBucket
from streamtrain.producers.sink import KafkaSink

FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".json": "jsonl",
           ".ndjson": "jsonl"}
VALUES = ("json", "csv")


@dataclass(frozen=True)
class ReplayConfig:
    path: Path
    topic: str
    format: str | None = None  # csv | parquet | jsonl; None = from the file's suffix
    rate: float = 0.0  # rows per second; 0 = as fast as Kafka takes them
    loop: bool = False  # start over at the end, until stopped
    value: str = "json"  # json | csv (csv input only)
    key_column: str | None = None  # a column whose text becomes the record key
    batch_rows: int = 10_000
    header: bool = True  # csv: the first line names the columns (and is not a row)
    columns: tuple[str, ...] | None = None  # csv: the column names, instead of the header's

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        fmt = self.format or FORMATS.get(self.path.suffix.lower())
        if fmt not in set(FORMATS.values()):
            raise ValueError(f"{self.path}: format {self.format or self.path.suffix!r} is not one of "
                             f"csv, parquet, jsonl (give it explicitly for other suffixes)")
        object.__setattr__(self, "format", fmt)
        if self.value not in VALUES:
            raise ValueError(f"value must be one of {', '.join(VALUES)}, got {self.value!r}")
        if self.value == "csv" and fmt != "csv":
            raise ValueError(f"value 'csv' needs a CSV file, {self.path} is {fmt}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {self.batch_rows}")
        if fmt != "csv" and (not self.header or self.columns is not None):
            raise ValueError(f"a header and column names apply to CSV files only, {self.path} is {fmt}")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
            if not self.columns or len(set(self.columns)) != len(self.columns) or not all(self.columns):
                raise ValueError(f"columns must be distinct non-empty names, got {list(self.columns)}")


@dataclass
class ReplayStats:
    rows: int = 0
    passes: int = 0  # complete passes over the file


class FileReplay:
    def __init__(self, config: ReplayConfig, sink: KafkaSink) -> None:
        self.config = config
        self._sink = sink
        self._bucket = TokenBucket(config.rate)
        self.stats = ReplayStats()

    def run(self, stop: threading.Event | None = None) -> ReplayStats:
        """Send the file's rows (again and again with `loop`) until done or `stop` is set.

        Raises: ReplayError (the file), DeliveryError (Kafka).
        """
        stop = stop or threading.Event()
        while not stop.is_set():
            for key, value in read_records(self.config):
                while (wait := self._bucket.delay()) > 0 and not stop.is_set():
                    stop.wait(min(wait, 0.05))
                if stop.is_set():
                    break
                self._sink.send(self.config.topic, value, key=key)
                self.stats.rows += 1
            else:
                self.stats.passes += 1
                if self.config.loop and self.stats.rows == 0:
                    raise ReplayError(f"{self.config.path} has no rows: nothing to loop over")
                if not self.config.loop:
                    break
        self._sink.flush()
        return self.stats


def read_records(cfg: ReplayConfig) -> Iterator[tuple[str | None, bytes]]:
    """(key, value) of every row, in file order: one pass.

    Raises: ReplayError.
    """
    row = 0
    try:
        for batch in _batches(cfg):
            keys = _keys(batch, cfg.key_column)
            values = _csv_lines(batch) if cfg.value == "csv" else _json_rows(batch)
            yield from zip(keys, values)
            row += batch.num_rows
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise ReplayError(f"{cfg.path}: unreadable after row {row}: {exc}") from exc
    except TypeError as exc:  # a column type with no JSON form
        raise ReplayError(f"{cfg.path}: row {row + 1}: {exc}") from exc


def _batches(cfg: ReplayConfig) -> Iterator[pa.RecordBatch]:
    if not cfg.path.is_file():
        raise ReplayError(f"{cfg.path}: no such file")
    if cfg.format == "parquet":
        import pyarrow.parquet as pq

        yield from pq.ParquetFile(cfg.path).iter_batches(batch_size=cfg.batch_rows)
    elif cfg.format == "csv":
        yield from _csv_batches(cfg)
    else:
        import pyarrow.json as pj

        # block_size bounds memory: a block is parsed at a time.
        yield from pj.open_json(cfg.path, read_options=pj.ReadOptions(block_size=1 << 20))


def _csv_batches(cfg: ReplayConfig) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pc

    # Without a header every line is a row: named by `columns`, or f0, f1, ... by pyarrow.
    read = pc.ReadOptions(block_size=1 << 20, column_names=cfg.columns, skip_rows=int(cfg.header and bool(cfg.columns)),
                          autogenerate_column_names=not cfg.header and not cfg.columns)
    convert = None
    if cfg.value == "csv":
        # Peek at the names, then read every column as text so lines go out as written.
        names = pc.open_csv(cfg.path, read_options=read).schema.names
        convert = pc.ConvertOptions(column_types={n: pa.string() for n in names})
    yield from pc.open_csv(cfg.path, read_options=read, convert_options=convert)


def _keys(batch: pa.RecordBatch, column: str | None) -> list[str | None]:
    if column is None:
        return [None] * batch.num_rows
    if column not in batch.schema.names:
        raise ReplayError(f"key column {column!r} is not among the columns {batch.schema.names}")
    return [None if v is None else str(v) for v in batch.column(column).to_pylist()]


def _json_rows(batch: pa.RecordBatch) -> list[bytes]:
    import pyarrow.compute as pc

    columns = []
    for col in batch.columns:
        if pa.types.is_floating(col.type):
            # JSON has no NaN or infinity: they go out as null.
            col = pc.if_else(pc.is_finite(col), col, pa.scalar(None, col.type))
        columns.append(col)
    rows = pa.RecordBatch.from_arrays(columns, schema=batch.schema).to_pylist()
    return [json.dumps(r, separators=(",", ":"), default=_json_value, allow_nan=False).encode() for r in rows]


def _json_value(value: object) -> object:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)  # exact; a float would round
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"a column value of type {type(value).__name__} has no JSON form")


def _csv_lines(batch: pa.RecordBatch) -> list[bytes]:
    out = []
    columns = [c.to_pylist() for c in batch.columns]
    for row in zip(*columns):
        buf = io.StringIO()
        csv.writer(buf, lineterminator="").writerow(row)
        out.append(buf.getvalue().encode())
    return out
