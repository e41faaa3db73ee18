"""What a checkpoint holds besides the parameter arrays and the manifest.

| document | where | written by | read by |
|---|---|---|---|
| `StateIndex` | a shard checkpoint's `index.json` | the shard (pserver/checkpoint_store.py) | its successor, restoring |
| `ExampleCounts` | a shard checkpoint's `examples.json` | the shard | its successor |
| `LedgerSnapshot` | a shard checkpoint's `dedup.json` | the shard (pserver/dedup.py) | its successor |
| `JobRecord` | etcd `checkpoints/<id>/job` | the master (jobstate/job_checkpoints.py) | the master, rolling back |

A successor restoring a checkpoint replays the gradient topic from the manifest's offsets, so
the ledger must drop exactly what the shard had dropped: these documents are as much a part of
the checkpoint as the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _json
from ._check import Check
from .errors import SchemaError
from .keys import _segment

VERSION = 1
_index = Check("StateIndex", VERSION)
_examples = Check("ExampleCounts", VERSION)
_ledger = Check("LedgerSnapshot", VERSION)
_record = Check("JobRecord", VERSION)
_kept = Check("KeptDocument")  # no version of its own: it holds what its key held


@dataclass(frozen=True)
class SavedTable:
    """A row table: its rows' width and the prefix of its files (`<file>.ids.npy`, ...);
    `updates`, its table clock (None in checkpoints written before there was one)."""

    name: str
    dim: int
    file: str
    updates: int | None = None


@dataclass(frozen=True)
class SavedBlock:
    """A dense block (`param`, `block`) and the prefix of its files."""

    param: str
    block: int
    file: str


@dataclass(frozen=True)
class StateIndex:
    """Which files of a shard checkpoint hold which table and dense block."""

    tables: tuple[SavedTable, ...] = ()
    dense: tuple[SavedBlock, ...] = ()

    def __post_init__(self) -> None:
        for i, t in enumerate(self.tables):
            _index.text(f"tables[{i}].name", t.name, max_bytes=255)
            _index.integer(f"tables[{i}].dim", t.dim)
            _index.text(f"tables[{i}].file", t.file)
            if t.updates is not None:
                _index.integer(f"tables[{i}].updates", t.updates)
        for i, b in enumerate(self.dense):
            _index.text(f"dense[{i}].param", b.param)
            _index.integer(f"dense[{i}].block", b.block)
            _index.text(f"dense[{i}].file", b.file)

    def to_json(self) -> bytes:
        tables = {t.name: {"dim": t.dim, "file": t.file, **({} if t.updates is None else {"updates": t.updates})}
                  for t in self.tables}
        return _json.dumps({"v": VERSION, "tables": tables,
                            "dense": [{"param": b.param, "block": b.block, "file": b.file} for b in self.dense]})

    @classmethod
    def from_json(cls, data: bytes | str) -> StateIndex:
        """Raises: SchemaError."""
        doc = _json.loads(_index, data)
        tables = []
        for name, meta in _json.obj(_index, _json.field(_index, doc, "tables"), "tables").items():
            meta = _json.obj(_index, meta, f"tables.{name}")
            dim, file = (_json.field(_index, meta, k, path=f"tables.{name}.{k}") for k in ("dim", "file"))
            tables.append(SavedTable(name, dim, file, meta.get("updates")))
        dense = []
        for i, meta in enumerate(_json.array(_index, _json.field(_index, doc, "dense"), "dense")):
            meta = _json.obj(_index, meta, f"dense[{i}]")
            dense.append(SavedBlock(*(_json.field(_index, meta, k, path=f"dense[{i}].{k}")
                                      for k in ("param", "block", "file"))))
        return cls(tuple(tables), tuple(dense))


@dataclass(frozen=True)
class ExampleCounts:
    """Examples a shard has applied: `tasks`, per task id not yet folded; `partitions`, per
    input `topic:partition`, of the tasks folded into it."""

    tasks: dict[str, int] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tasks", "partitions"):
            counts = getattr(self, name)
            if not isinstance(counts, dict):
                raise _examples.error(name, "expected an object of name -> count")
            for key, count in counts.items():
                _examples.integer(f"{name}.{key}", count)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "tasks": self.tasks, "partitions": self.partitions})

    @classmethod
    def from_json(cls, data: bytes | str) -> ExampleCounts:
        """Raises: SchemaError. Reads checkpoints written before the version too."""
        doc = _json.loads(_examples, data, unversioned=True)
        return cls(*(dict(_json.obj(_examples, _json.field(_examples, doc, k), k)) for k in ("tasks", "partitions")))


@dataclass(frozen=True)
class LedgerEntry:
    """One input partition's ledger: the pass it is in, the offset below which every task is
    applied, and each task above it (by start offset) with the highest group seq applied."""

    topic: str
    partition: int
    pass_no: int
    watermark: int
    max_seq: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class LedgerSnapshot:
    """A shard's exactly-once ledger (pserver/dedup.py) and how many duplicates it dropped."""

    dropped: int = 0
    partitions: tuple[LedgerEntry, ...] = ()

    def __post_init__(self) -> None:
        _ledger.integer("dropped", self.dropped)
        for i, p in enumerate(self.partitions):
            _ledger.topic(f"partitions[{i}].topic", p.topic)
            for key in ("partition", "pass_no", "watermark"):
                _ledger.integer(f"partitions[{i}].{key}", getattr(p, key))
            for j, (start, seq) in enumerate(p.max_seq):
                _ledger.integer(f"partitions[{i}].max_seq[{j}][0]", start)
                _ledger.integer(f"partitions[{i}].max_seq[{j}][1]", seq)

    def to_json(self) -> bytes:
        return _json.dumps({"v": VERSION, "dropped": self.dropped, "partitions": [
            {"topic": p.topic, "partition": p.partition, "pass_no": p.pass_no, "watermark": p.watermark,
             "max_seq": [list(pair) for pair in p.max_seq]} for p in self.partitions]})

    @classmethod
    def from_json(cls, data: bytes | str) -> LedgerSnapshot:
        """Raises: SchemaError."""
        doc = _json.loads(_ledger, data)
        partitions = []
        for i, p in enumerate(_json.array(_ledger, _json.field(_ledger, doc, "partitions"), "partitions")):
            at = f"partitions[{i}]"
            p = _json.obj(_ledger, p, at)
            topic, partition, pass_no, watermark, pairs = (
                _json.field(_ledger, p, k, path=f"{at}.{k}")
                for k in ("topic", "partition", "pass_no", "watermark", "max_seq"))
            max_seq = []
            for j, pair in enumerate(_json.array(_ledger, pairs, f"{at}.max_seq")):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _ledger.error(f"{at}.max_seq[{j}]", f"expected [start, seq], got {pair!r}")
                max_seq.append((pair[0], pair[1]))
            partitions.append(LedgerEntry(topic, partition, pass_no, watermark, tuple(max_seq)))
        return cls(_json.field(_ledger, doc, "dropped"), tuple(partitions))


@dataclass(frozen=True)
class KeptDocument:
    """A JSON object as an etcd key held it, kept whole: what a `JobRecord` holds of each cursor,
    task and the job state. A rollback writes back what was there, keys this version does not
    know included, and a task no reader here understands as it was rather than not at all.

    Raises:
        SchemaError: `doc` is not a JSON object that encodes (NaN, a non-string key; field `$`).
    """

    doc: dict[str, Any]
    _encoded: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.doc, dict):
            raise _kept.error("$", f"expected a JSON object, got {type(self.doc).__name__}")
        try:  # encoded once, here: it is written back as it is, or refused now, not mid-rollback
            encoded = _json.dumps(self.doc)
        except (TypeError, ValueError) as exc:
            raise _kept.error("$", f"does not encode as JSON: {exc}") from None
        object.__setattr__(self, "_encoded", encoded)

    def to_json(self) -> bytes:
        return self._encoded

    @classmethod
    def from_json(cls, data: bytes | str) -> KeptDocument:
        """Any JSON object, whatever its keys and version. Raises: SchemaError."""
        return cls(_json.parse_object(_kept, data))


@dataclass(frozen=True)
class JobRecord:
    """The job's side of a checkpoint: its cursors, tasks and state as etcd held them, each the
    document its key held (`PartitionCursor`, `TaskRecord`, `JobState`), kept whole
    (`KeptDocument`), so a task no reader understands is restored as it was rather than lost;
    tasks in hand were released (no holder, same attempt) before they were recorded.

    Each document names the key it goes back to: a cursor has `topic` and `partition`, a task
    `task_id` (a key segment); the state's key is fixed.

    Raises:
        SchemaError: a member is not a KeptDocument, or lacks what names its key
            (`cursors[0].topic`, `done[2].task_id`).
    """

    cursors: tuple[KeptDocument, ...] = ()
    todo: tuple[KeptDocument, ...] = ()
    done: tuple[KeptDocument, ...] = ()
    failed: tuple[KeptDocument, ...] = ()
    state: KeptDocument | None = None

    def __post_init__(self) -> None:
        for name in ("cursors", "todo", "done", "failed"):
            for i, kept in enumerate(getattr(self, name)):
                _kept_in_record(kept, f"{name}[{i}]")
        for i, cursor in enumerate(self.cursors):
            _record.topic(f"cursors[{i}].topic", cursor.doc.get("topic"))
            _record.integer(f"cursors[{i}].partition", cursor.doc.get("partition"), hi=2**31 - 1)
        for name in ("todo", "done", "failed"):
            for i, task in enumerate(getattr(self, name)):
                try:
                    _segment("task_id", task.doc.get("task_id"))
                except SchemaError as exc:
                    raise _record.error(f"{name}[{i}].task_id", exc.reason) from None
        if self.state is not None:
            _kept_in_record(self.state, "state")

    def to_json(self) -> bytes:
        def docs(kept: tuple[KeptDocument, ...]) -> list[dict[str, Any]]:
            return [k.doc for k in kept]

        return _json.dumps({"v": VERSION, "cursors": docs(self.cursors), "todo": docs(self.todo),
                            "done": docs(self.done), "failed": docs(self.failed),
                            "state": None if self.state is None else self.state.doc})

    @classmethod
    def from_json(cls, data: bytes | str) -> JobRecord:
        """Raises: SchemaError."""
        doc = _json.loads(_record, data)
        cursors, todo, done, failed = [
            tuple(_kept_at(item, f"{k}[{i}]")
                  for i, item in enumerate(_json.array(_record, _json.field(_record, doc, k), k)))
            for k in ("cursors", "todo", "done", "failed")]
        state = doc.get("state")
        return cls(cursors, todo, done, failed, None if state is None else _kept_at(state, "state"))


def _kept_at(value: Any, path: str) -> KeptDocument:
    try:
        return KeptDocument(_json.obj(_record, value, path))
    except SchemaError as exc:
        if exc.format == _record.format:
            raise
        raise _record.error(path, exc.reason) from None


def _kept_in_record(value: object, path: str) -> None:
    if not isinstance(value, KeptDocument):
        raise _record.error(path, f"expected a KeptDocument, got {type(value).__name__}")
