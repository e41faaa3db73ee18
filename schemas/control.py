"""The control plane's documents in etcd: the requests to pause, checkpoint and roll back a job,
and what answers them.

| document | key | written by | read by |
|---|---|---|---|
| `PauseRequest` | `control/pause` | `rollback` (while it runs) | trainers (claim nothing), the master (no checkpoint) |
| `CheckpointRequest` | `control/checkpoint` | `streamtrain checkpoint` (an ask), the master (an id) | the master, shards |
| `ShardCheckpoint` | `checkpoints/<id>/<i>` | shard i, once it holds checkpoint id | the master, `checkpoint`, `rollback` |
| `LatestCheckpoint` | `checkpoints/latest` | the master; `rollback` when done | shards (never prune it), `rollback --to latest` |
| `RollbackRequest` | `control/rollback` | `rollback` (phase "master"), the master (phase "shards") | the master, shards |
| `RollbackAck` | `checkpoints/<id>/rolled/<i>` | shard i, rolled back | `rollback` |
| `ResizeRecord` | `control/resize` | `resize`, with the new slot map | `resize` (one run again finishes it) |

The job's side of a checkpoint (`checkpoints/<id>/job`) is jobstate/job_checkpoints.py's record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from . import _json
from ._check import Check

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

VERSION = 1
_PHASES = ("master", "shards")

Phase = Literal["master", "shards"]


def _encode(doc: DataclassInstance) -> bytes:
    return _json.dumps({"v": VERSION, **{k: v for k, v in asdict(doc).items() if v is not None}})


ROLLBACK_PAUSE = "rollback"  # `PauseRequest.by` of a rollback's pause: the master takes no checkpoint then


@dataclass(frozen=True)
class PauseRequest:
    """Trainers finish the task in hand and claim no other while it exists."""

    by: str
    at: float

    def __post_init__(self) -> None:
        _pause.text("by", self.by)
        _pause.number("at", self.at)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> PauseRequest:
        """Raises: SchemaError."""
        doc = _json.loads(_pause, data)
        return cls(_json.field(_pause, doc, "by"), _json.field(_pause, doc, "at"))


@dataclass(frozen=True)
class CheckpointRequest:
    """An ask of the master (`ask` set, `id` None), or, once the master recorded the job's
    side, the request to the shards (`id` set; `ask` kept so the asker can follow)."""

    id: str | None = None
    ask: str | None = None
    at: float | None = None

    def __post_init__(self) -> None:
        if self.id is None and self.ask is None:
            raise _request.error("id", "neither an id nor an ask")
        if self.id is not None:
            _request.checkpoint_id("id", self.id)
        if self.ask is not None:
            _request.text("ask", self.ask, max_bytes=128)
        if self.at is not None:
            _request.number("at", self.at)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> CheckpointRequest:
        """Raises: SchemaError."""
        doc = _json.loads(_request, data)
        return cls(doc.get("id"), doc.get("ask"), doc.get("at"))


@dataclass(frozen=True)
class ShardCheckpoint:
    """Shard `shard` holds checkpoint `checkpoints/<id>/`: where, and from which gradient offset
    it resumes."""

    shard: int
    uri: str
    grad_offset: int
    created_at: float
    optimizer: str
    rows: dict[str, int]

    def __post_init__(self) -> None:
        _shard.integer("shard", self.shard)
        _shard.text("uri", self.uri)
        _shard.integer("grad_offset", self.grad_offset)
        _shard.number("created_at", self.created_at)
        _shard.text("optimizer", self.optimizer)
        if not isinstance(self.rows, dict):
            raise _shard.error("rows", "expected an object of table -> row count")
        for table, count in self.rows.items():
            _shard.integer(f"rows.{table}", count)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> ShardCheckpoint:
        """Raises: SchemaError."""
        doc = _json.loads(_shard, data)
        shard, uri, grad_offset, created_at, optimizer, rows = _json.required(
            _shard, doc, "shard", "uri", "grad_offset", "created_at", "optimizer", "rows")
        return cls(shard, uri, grad_offset, created_at, optimizer, _json.obj(_shard, rows, "rows"))


@dataclass(frozen=True)
class LatestCheckpoint:
    """The newest rollback target: every one of `shards` shards holds `id`. `ask`: the
    `streamtrain checkpoint` it answers, if any."""

    id: str
    shards: int
    at: float
    ask: str | None = None

    def __post_init__(self) -> None:
        _latest.checkpoint_id("id", self.id)
        _latest.integer("shards", self.shards)
        _latest.number("at", self.at)
        if self.ask is not None:
            _latest.text("ask", self.ask, max_bytes=128)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> LatestCheckpoint:
        """Raises: SchemaError."""
        doc = _json.loads(_latest, data)
        return cls(_json.field(_latest, doc, "id"), _json.field(_latest, doc, "shards"),
                   _json.field(_latest, doc, "at"), doc.get("ask"))


@dataclass(frozen=True)
class RollbackRequest:
    """Return the job to checkpoint `to`: the master's phase first, then the shards'."""

    to: str
    phase: Phase
    at: float

    def __post_init__(self) -> None:
        _rollback.checkpoint_id("to", self.to)
        if self.phase not in _PHASES:
            raise _rollback.error("phase", f"{self.phase!r} is not one of {_PHASES}")
        _rollback.number("at", self.at)

    def next_phase(self) -> RollbackRequest:
        return replace(self, phase="shards")

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> RollbackRequest:
        """Raises: SchemaError."""
        doc = _json.loads(_rollback, data)
        return cls(_json.field(_rollback, doc, "to"), _json.field(_rollback, doc, "phase"),
                   _json.field(_rollback, doc, "at"))


@dataclass(frozen=True)
class RollbackAck:
    """Shard `shard` rolled back, and skips the gradients before `grad_offset`."""

    shard: int
    grad_offset: int
    at: float

    def __post_init__(self) -> None:
        _ack.integer("shard", self.shard)
        _ack.integer("grad_offset", self.grad_offset)
        _ack.number("at", self.at)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> RollbackAck:
        """Raises: SchemaError."""
        doc = _json.loads(_ack, data)
        return cls(_json.field(_ack, doc, "shard"), _json.field(_ack, doc, "grad_offset"),
                   _json.field(_ack, doc, "at"))


@dataclass(frozen=True)
class ResizeRecord:
    """A resize under way: the slot map gives the job `shards` shards now, and the job is
    to roll back to checkpoint `checkpoint`, the shards' state regrouped under that map."""

    shards: int
    checkpoint: str
    at: float

    def __post_init__(self) -> None:
        _resize.integer("shards", self.shards, lo=1)
        _resize.checkpoint_id("checkpoint", self.checkpoint)
        _resize.number("at", self.at)

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> ResizeRecord:
        """Raises: SchemaError."""
        doc = _json.loads(_resize, data)
        return cls(_json.field(_resize, doc, "shards"), _json.field(_resize, doc, "checkpoint"),
                   _json.field(_resize, doc, "at"))


_resize = Check("ResizeRecord", VERSION)
_pause = Check("PauseRequest", VERSION)
_request = Check("CheckpointRequest", VERSION)
_shard = Check("ShardCheckpoint", VERSION)
_latest = Check("LatestCheckpoint", VERSION)
_rollback = Check("RollbackRequest", VERSION)
_ack = Check("RollbackAck", VERSION)
