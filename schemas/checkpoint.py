"""CheckpointManifest: what one pserver shard's checkpoint holds, written last, read first.

A checkpoint is complete once its manifest exists: files are written and checksummed first,
the manifest next, the ``checkpoints/latest`` pointer after that (see docs/schemas.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from . import _json
from ._check import U32_MAX, U64_MAX, Check, nested
from .errors import SchemaError
from .keys import partition_of

VERSION = 1
_check = Check("CheckpointManifest", VERSION)
_file_check = Check("FileEntry", VERSION)

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    """A file of the checkpoint: path relative to the checkpoint's directory, size, checksum."""

    path: str
    size: int
    sha256: str  # lowercase hex

    def __post_init__(self) -> None:
        _file_check.text("path", self.path)
        parts = self.path.split("/")
        if self.path.startswith("/") or "\\" in self.path or any(p in ("", ".", "..") for p in parts):
            raise _file_check.error("path", f"{self.path!r} is not a normalised relative path")
        object.__setattr__(self, "size", _file_check.integer("size", self.size))
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise _file_check.error("sha256", f"{self.sha256!r} is not 64 lowercase hex digits")


@dataclass(frozen=True)
class CheckpointManifest:
    """One shard's checkpoint: parameter and optimizer files plus where to resume consuming.

    ``grad_offsets`` maps the shard's gradient topic to the next offset to consume, so replay
    starts exactly after the last applied delta. ``input_watermarks`` maps ``"topic:partition"``
    to the input offset trained up to, which rollback uses to reset the master's cursors.
    Dedup state lives in one of the ``files``, not here. Mappings are kept sorted by key.

    Raises:
        SchemaError: a value does not fit (names the field, e.g. ``files[2].sha256``).
    """

    checkpoint_id: str
    job: str
    shard: int
    created_at: float  # epoch seconds
    optimizer: str
    files: tuple[FileEntry, ...]
    grad_offsets: Mapping[str, int]
    input_watermarks: Mapping[str, int]
    slots: tuple[int, ...]
    epoch: int = 0  # of the slot map the slots are from (manifests written before epochs: 0)
    # Where the shard's publishing stood: every change this state holds was in a round numbered
    # at most `published_round` of the rounds stream's epoch `published_epoch` (round 0: not
    # known, as in manifests written before). A restart that finds Redis's row keys flushed
    # through that round of that epoch need write only the rows its replay changes.
    published_epoch: int = 0
    published_round: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check.checkpoint_id("checkpoint_id", self.checkpoint_id)
        _check.job("job", self.job)
        set_(self, "shard", _check.integer("shard", self.shard, hi=U32_MAX))
        created_at = _check.number("created_at", self.created_at)
        if created_at < 0:
            raise _check.error("created_at", f"{created_at} is negative")
        set_(self, "created_at", created_at)
        _check.text("optimizer", self.optimizer)
        set_(self, "files", _files(self.files))
        set_(self, "grad_offsets", _offsets("grad_offsets", self.grad_offsets, _grad_topic))
        set_(self, "input_watermarks", _offsets("input_watermarks", self.input_watermarks, _topic_partition))
        set_(self, "slots", _slots(self.slots))
        set_(self, "epoch", _check.integer("epoch", self.epoch, hi=U32_MAX))
        set_(self, "published_epoch", _check.integer("published_epoch", self.published_epoch, hi=U64_MAX))
        set_(self, "published_round", _check.integer("published_round", self.published_round))

    def to_json(self) -> bytes:
        return _json.dumps(
            {
                "v": VERSION,
                "checkpoint_id": self.checkpoint_id,
                "job": self.job,
                "shard": self.shard,
                "created_at": self.created_at,
                "optimizer": self.optimizer,
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
                "grad_offsets": dict(self.grad_offsets),
                "input_watermarks": dict(self.input_watermarks),
                "slots": list(self.slots),
                "epoch": self.epoch,
                "published_epoch": self.published_epoch,
                "published_round": self.published_round,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> CheckpointManifest:
        """Raises: SchemaError."""
        doc = _json.loads(_check, data)

        def get(key: str) -> Any:
            return _json.field(_check, doc, key)

        files = []
        for i, entry in enumerate(_json.array(_check, get("files"), "files")):
            at = f"files[{i}]"
            entry = _json.obj(_check, entry, at)
            values = [_json.field(_check, entry, k, path=f"{at}.{k}") for k in ("path", "size", "sha256")]
            try:
                files.append(FileEntry(*values))
            except SchemaError as err:
                raise nested(err, _check, at) from err
        return cls(
            checkpoint_id=get("checkpoint_id"),
            job=get("job"),
            shard=get("shard"),
            created_at=get("created_at"),
            optimizer=get("optimizer"),
            files=tuple(files),
            grad_offsets=_json.obj(_check, get("grad_offsets"), "grad_offsets"),
            input_watermarks=_json.obj(_check, get("input_watermarks"), "input_watermarks"),
            slots=tuple(_json.array(_check, get("slots"), "slots")),
            epoch=_json.field(_check, doc, "epoch", 0),
            published_epoch=_json.field(_check, doc, "published_epoch", 0),
            published_round=_json.field(_check, doc, "published_round", 0),
        )


def _files(value: object) -> tuple[FileEntry, ...]:
    if not isinstance(value, (tuple, list)):
        raise _check.error("files", f"expected a tuple of FileEntry, got {type(value).__name__}")
    seen = set()
    for i, entry in enumerate(value):
        if not isinstance(entry, FileEntry):
            raise _check.error(f"files[{i}]", f"expected FileEntry, got {type(entry).__name__}")
        if entry.path in seen:
            raise _check.error(f"files[{i}].path", f"duplicate path {entry.path!r}")
        seen.add(entry.path)
    return tuple(value)


def _offsets(field: str, value: object, check_key: Callable[[str, object], None]) -> Mapping[str, int]:
    if not isinstance(value, Mapping):
        raise _check.error(field, f"expected a mapping, got {type(value).__name__}")
    out = {}
    for key in sorted(value, key=lambda k: k if isinstance(k, str) else ""):
        check_key(field, key)
        out[key] = _check.integer(f"{field}.{key}", value[key])
    return MappingProxyType(out)


def _grad_topic(field: str, key: object) -> None:
    _check.topic(field, key)


def _topic_partition(field: str, key: object) -> None:
    try:
        partition_of(key)
    except SchemaError as exc:
        raise _check.error(field, exc.reason) from None


def _slots(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _check.error("slots", f"expected a sequence of slot numbers, got {type(value).__name__}")
    slots = tuple(_check.integer(f"slots[{i}]", s, hi=U32_MAX) for i, s in enumerate(value))
    if len(set(slots)) != len(slots):
        dup = next(s for i, s in enumerate(slots) if s in slots[:i])
        raise _check.error("slots", f"slot {dup} listed twice")
    return slots
