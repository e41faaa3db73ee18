"""PublishedRound: one publish round of a shard, as appended to its `RedisKeys.rounds` stream;
FlushMark: the round of the shard's last flush of its row keys (`RedisKeys.flushed`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ._binary import BytesLike, Reader, Writer, le
from ._check import U16_MAX, U64_MAX, Check, unchecked

VERSION = 1
MAGIC = b"SR"
_check = Check("PublishedRound", VERSION)

# After magic and version: epoch, round, reset flag, applied JSON length, table count.
_HEADER = le("QQBIH")


@dataclass(frozen=True, eq=False)
class RoundRows:
    """Rows of one table as a round left them: ``values[i]`` is row ``ids[i]``; ids distinct."""

    table: str
    ids: np.ndarray  # non-negative integers, kept as uint64
    values: np.ndarray  # (len(ids), dim) float32

    def __post_init__(self) -> None:
        _check.name("rows.table", self.table)
        ids, values = _check.rows("rows.", self.ids, self.values, per="table")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)

    @classmethod
    def _decoded(cls, table: str, ids: np.ndarray, values: np.ndarray) -> RoundRows:
        """From fields `PublishedRound.from_bytes` read (uint64 ids, float32 rows, as many as
        ids, of a u16 width): what is left to check is a name, a width and finite values.
        Trainers decode a few rounds every pull, and the full checks would be half of it."""
        _check.decoded_rows("rows.", table, values)
        return unchecked(cls, table=table, ids=ids, values=values)


@dataclass(frozen=True, eq=False)
class PublishedRound:
    """What one publish round of a shard wrote: the rows it changed, with their new values,
    and the newest step of each trainer its values include (`RedisKeys.applied`).

    ``epoch`` names one unbroken run of rounds, numbered ``round`` 1, 2, ... within it; a
    round that starts a new epoch has ``reset`` set and carries no rows (it republished
    everything, after a restart, a lost Redis or a rollback). A reader that holds rows of
    the shard keeps them current by applying its rounds in order, and drops them when a
    round is missing (trimmed, or a new epoch began). Decoded arrays are read-only views.

    Raises:
        SchemaError: a value does not fit (names the field).
    """

    epoch: int
    round: int
    reset: bool
    applied: dict[str, int]
    rows: tuple[RoundRows, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch", _check.integer("epoch", self.epoch, hi=U64_MAX))
        object.__setattr__(self, "round", _check.integer("round", self.round, hi=U64_MAX))
        if not isinstance(self.applied, dict) or not all(
                isinstance(k, str) and isinstance(v, int) for k, v in self.applied.items()):
            raise _check.error("applied", "expected {trainer id: step}")
        if not isinstance(self.rows, tuple) or not all(isinstance(r, RoundRows) for r in self.rows):
            raise _check.error("rows", "expected a tuple of RoundRows")
        if len(self.rows) > U16_MAX:
            raise _check.error("rows", f"{len(self.rows)} tables, at most {U16_MAX}")
        if self.reset and self.rows:
            raise _check.error("rows", "a reset round carries no rows")

    def to_bytes(self) -> bytes:
        applied = json.dumps(self.applied, separators=(",", ":")).encode()
        w = Writer(MAGIC, VERSION)
        w.pack(_HEADER, self.epoch, self.round, int(self.reset), len(applied), len(self.rows))
        w.add(applied)
        for rows in self.rows:
            w.table_rows(rows.table, rows.ids, rows.values, "<f4")
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: BytesLike) -> PublishedRound:
        """Raises: SchemaError."""
        r = Reader(_check, data, MAGIC)
        epoch, round_no, reset, applied_len, tables = r.unpack(_HEADER, "header")
        if reset > 1:
            raise _check.error("reset", f"expected 0 or 1, got {reset}")
        try:
            applied = json.loads(r.text(applied_len, "applied"))
        except ValueError as exc:
            raise _check.error("applied", f"not JSON: {exc}") from exc
        if not isinstance(applied, dict) or not all(isinstance(k, str) and isinstance(v, int)
                                                    for k, v in applied.items()):
            raise _check.error("applied", "expected {trainer id: step}")
        rows = []
        for i in range(tables):
            rows.append(RoundRows._decoded(*r.table_rows(f"rows[{i}]", "<f4")))
        r.finish()
        if reset and rows:
            raise _check.error("rows", "a reset round carries no rows")
        # The rest of __post_init__'s checks hold by the wire format (widths).
        return unchecked(cls, epoch=epoch, round=round_no, reset=bool(reset), applied=applied, rows=tuple(rows))


_mark = Check("FlushMark", VERSION)


@dataclass(frozen=True)
class FlushMark:
    """The round of a shard's last flush: its id in the shard's rounds stream (`<ms>-<round>`),
    and the epoch and number of the round. The row keys hold every row as of that round at
    least, and the rounds after it are in the stream. Stored as ASCII `1 <id> <epoch>
    <version>` (the format's version first), written in the same transaction as the round it
    names.

    `version` is the shard version the round's INCR was to return, the keys written before it
    all still there; 0: the round wrote every row itself (a full reset); None: not known (a
    mark written without it). A shard version in Redis below it means Redis lost the keys
    since (it restarted empty, and the version counted again from 1): the flush wrote only its
    own rows onto an empty Redis, and the mark alone would claim every row."""

    at: bytes
    epoch: int
    round: int
    version: int | None = None

    def to_bytes(self) -> bytes:
        if self.version is None:
            return b"%d %s %d" % (VERSION, self.at, self.epoch)
        return b"%d %s %d %d" % (VERSION, self.at, self.epoch, self.version)

    @classmethod
    def from_bytes(cls, raw: bytes) -> FlushMark:
        """Raises: SchemaError."""
        parts = raw.split(b" ")
        if len(parts) not in (3, 4) or parts[0] != b"%d" % VERSION:
            raise _mark.error("$", f"expected b'{VERSION} <stream id> <epoch> [<version>]', got {raw[:64]!r}")
        at, epoch, version = parts[1], parts[2], parts[3] if len(parts) == 4 else b"0"
        ms, _, round_ = at.partition(b"-")
        if not (ms.isdigit() and round_.isdigit() and epoch.isdigit() and version.isdigit()):
            raise _mark.error("$", f"expected b'{VERSION} <ms>-<round> <epoch> [<version>]', got {raw[:64]!r}")
        return cls(at, int(epoch), int(round_), int(version) if len(parts) == 4 else None)
