"""TaskRecord: one offset range of one input partition, as the master keeps it in etcd.

The record's etcd key says which queue it is in (``tasks/<state>/<task_id>``); the record
itself says what the range is and who holds it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import _json
from ._check import Check

VERSION = 1
_check = Check("TaskRecord", VERSION)

# Kafka partition numbers are int32 on the broker.
_PARTITION_MAX = 2**31 - 1


class TaskId(NamedTuple):
    """The parts of a task id."""

    topic: str
    partition: int
    start: int
    pass_no: int = 0


@dataclass(frozen=True)
class TaskRecord:
    """A task: train on offsets ``[start, end)`` of ``topic:partition`` in pass ``pass_no``.

    ``claim`` is a fencing token: the master bumps it on every claim, and a completion that
    carries an older claim is from a zombie attempt and is refused. ``task_id`` must be
    ``make_id(topic, partition, start, pass_no)``; ``for_range`` builds a record that way.

    Raises:
        SchemaError: a value does not fit (names the field).
    """

    task_id: str
    topic: str
    partition: int
    start: int
    end: int
    pass_no: int = 0
    attempt: int = 0
    trainer_id: str | None = None
    deadline: float | None = None  # epoch seconds
    reason: str | None = None  # why the last attempt failed
    claim: int = 0
    # Mini-batches a push holds: fixed by the first claim (0 before it) and kept by every later
    # attempt, whose push groups must be cut where the first attempt's were, since the shards
    # apply each (task_id, seq) once.
    push_every: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check.topic("topic", self.topic)
        set_(self, "partition", _check.integer("partition", self.partition, hi=_PARTITION_MAX))
        set_(self, "start", _check.integer("start", self.start))
        set_(self, "end", _check.integer("end", self.end))
        if self.end <= self.start:
            raise _check.error("end", f"must be greater than start ({self.end} <= {self.start})")
        set_(self, "pass_no", _check.integer("pass_no", self.pass_no))
        set_(self, "attempt", _check.integer("attempt", self.attempt))
        set_(self, "claim", _check.integer("claim", self.claim))
        set_(self, "push_every", _check.integer("push_every", self.push_every))
        _check.optional_text("trainer_id", self.trainer_id)
        _check.optional_text("reason", self.reason)
        if self.deadline is not None:
            set_(self, "deadline", _check.number("deadline", self.deadline))
        expected = self.make_id(self.topic, self.partition, self.start, self.pass_no)
        if self.task_id != expected:
            raise _check.error("task_id", f"{self.task_id!r} does not match the range; expected {expected!r}")

    @classmethod
    def for_range(cls, topic: str, partition: int, start: int, end: int, pass_no: int = 0) -> TaskRecord:
        """A fresh, unclaimed task for a range."""
        return cls(cls.make_id(topic, partition, start, pass_no), topic, partition, start, end, pass_no)

    @staticmethod
    def make_id(topic: str, partition: int, start: int, pass_no: int = 0) -> str:
        """``<topic>:<partition>:<start, 20 digits>``, then ``:<pass_no>`` from the second pass on.

        Topic names cannot contain ':', and the zero padding keeps etcd keys in offset order.
        The pass is part of the id because a later pass over the same range is new training,
        not a duplicate: gradient dedup keys on (task_id, seq). Pass 0 leaves it out.
        """
        _check.topic("topic", topic)
        partition = _check.integer("partition", partition, hi=_PARTITION_MAX)
        start = _check.integer("start", start)
        pass_no = _check.integer("pass_no", pass_no)
        task_id = f"{topic}:{partition}:{start:020d}"
        return f"{task_id}:{pass_no}" if pass_no else task_id

    @staticmethod
    def parse_id(task_id: str) -> TaskId:
        """The inverse of make_id. Raises: SchemaError (field ``task_id``) if it is not one."""
        if isinstance(task_id, str):
            parsed = _parsed_id(task_id)
            if parsed is not None:
                return parsed
        raise _check.error("task_id", f"{task_id!r} is not <topic>:<partition>:<20-digit start>[:<pass>]")

    def to_json(self) -> bytes:
        return _json.dumps(
            {
                "v": VERSION,
                "task_id": self.task_id,
                "topic": self.topic,
                "partition": self.partition,
                "start": self.start,
                "end": self.end,
                "pass_no": self.pass_no,
                "attempt": self.attempt,
                "trainer_id": self.trainer_id,
                "deadline": self.deadline,
                "reason": self.reason,
                "claim": self.claim,
                "push_every": self.push_every,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> TaskRecord:
        """Keys after ``end`` may be absent (they take their defaults). Raises: SchemaError."""
        doc = _json.loads(_check, data)

        def get(key: str, *default: Any) -> Any:
            return _json.field(_check, doc, key, *default)

        return cls(
            task_id=get("task_id"),
            topic=get("topic"),
            partition=get("partition"),
            start=get("start"),
            end=get("end"),
            pass_no=get("pass_no", 0),
            attempt=get("attempt", 0),
            trainer_id=get("trainer_id", None),
            deadline=get("deadline", None),
            reason=get("reason", None),
            claim=get("claim", 0),
            push_every=get("push_every", 0),
        )


def _canonical(digits: str) -> bool:
    """A decimal without sign, spaces or leading zeros, so every id has one spelling."""
    # The length bound also keeps int() clear of its 4300-digit limit.
    return 0 < len(digits) <= 20 and digits.isascii() and digits.isdigit() and str(int(digits)) == digits


# A shard parses the id of every delta it reads, and of every task it holds for its stats: the
# same few ids again and again.
@functools.lru_cache(maxsize=1 << 14)
def _parsed_id(task_id: str) -> TaskId | None:
    parts = task_id.split(":")
    if len(parts) in (3, 4):
        topic, partition, start, *rest = parts
        if (
            _canonical(partition)
            and len(start) == 20
            and start.isascii()
            and start.isdigit()
            and (not rest or (_canonical(rest[0]) and rest[0] != "0"))
        ):
            parsed = TaskId(topic, int(partition), int(start), int(rest[0]) if rest else 0)
            try:
                if TaskRecord.make_id(*parsed) == task_id:
                    return parsed
            except ValueError:
                pass  # refused by parse_id, with the whole id
    return None
