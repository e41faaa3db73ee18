"""PartitionCursor: slicing and training progress of one input partition, kept in etcd.

Stored at ``cursor/<topic>/<partition>``. The master is its only writer. Trainers never read
it; pservers read ``trained`` to record input watermarks in their checkpoints, and
``streamtrain job status`` reads it to show lag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _json
from ._check import Check

VERSION = 1
_check = Check("PartitionCursor", VERSION)
_PARTITION_MAX = 2**31 - 1


@dataclass(frozen=True)
class PartitionCursor:
    """Offsets of one partition, all in the partition's current pass ``pass_no``.

    ``origin <= trained <= next``: every offset in ``[origin, next)`` belongs to exactly one
    task of this pass; every offset below ``trained`` is in a done (or failed) task.
    ``stop`` is the end offset snapshotted when a bounded job first saw the partition (None
    on a live stream, which is followed forever).

    Raises:
        SchemaError: a value does not fit (names the field).
    """

    topic: str
    partition: int
    next: int
    trained: int
    origin: int
    stop: int | None = None
    pass_no: int = 0

    def __post_init__(self) -> None:
        _check.topic("topic", self.topic)
        _check.integer("partition", self.partition, hi=_PARTITION_MAX)
        _check.integer("origin", self.origin)
        _check.integer("trained", self.trained, lo=self.origin)
        _check.integer("next", self.next, lo=self.trained)
        _check.integer("pass_no", self.pass_no)
        if self.stop is not None:
            _check.integer("stop", self.stop, lo=self.origin)
            if self.next > self.stop:
                raise _check.error("next", f"beyond stop ({self.next} > {self.stop})")

    @classmethod
    def fresh(cls, topic: str, partition: int, origin: int, stop: int | None) -> PartitionCursor:
        return cls(topic, partition, origin, origin, origin, stop)

    @property
    def complete(self) -> bool:
        """Bounded input only: this pass trained every offset up to stop."""
        return self.stop is not None and self.trained >= self.stop

    def to_json(self) -> bytes:
        return _json.dumps({
            "v": VERSION, "topic": self.topic, "partition": self.partition, "next": self.next,
            "trained": self.trained, "origin": self.origin, "stop": self.stop,
            "pass_no": self.pass_no,
        })

    @classmethod
    def from_json(cls, data: bytes | str) -> PartitionCursor:
        """Raises: SchemaError."""
        doc = _json.loads(_check, data)

        def get(key: str, *default: Any) -> Any:
            return _json.field(_check, doc, key, *default)

        return cls(get("topic"), get("partition"), get("next"), get("trained"), get("origin"),
                   get("stop", None), get("pass_no", 0))
