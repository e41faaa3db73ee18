"""DeadLetter: a record that could not be decoded, parked on ``<job>.dlq`` with the reason."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from . import _json
from ._check import Check

VERSION = 1
_check = Check("DeadLetter", VERSION)

# Kafka partition numbers are int32 on the broker.
_PARTITION_MAX = 2**31 - 1


@dataclass(frozen=True)
class DeadLetter:
    """Where the bad record was, why it was refused, and its bytes, so it can be replayed.

    Raises:
        SchemaError: a value does not fit (names the field).
    """

    source_topic: str
    partition: int
    offset: int
    reason: str
    payload: bytes
    job: str
    at_ms: int  # when it was dead-lettered, epoch milliseconds

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _check.topic("source_topic", self.source_topic)
        set_(self, "partition", _check.integer("partition", self.partition, hi=_PARTITION_MAX))
        set_(self, "offset", _check.integer("offset", self.offset))
        _check.text("reason", self.reason)
        if not isinstance(self.payload, (bytes, bytearray, memoryview)):
            raise _check.error("payload", f"expected bytes, got {type(self.payload).__name__}")
        set_(self, "payload", bytes(self.payload))
        _check.job("job", self.job)
        set_(self, "at_ms", _check.integer("at_ms", self.at_ms))

    def to_json(self) -> bytes:
        return _json.dumps(
            {
                "v": VERSION,
                "job": self.job,
                "source_topic": self.source_topic,
                "partition": self.partition,
                "offset": self.offset,
                "reason": self.reason,
                "at_ms": self.at_ms,
                "payload": base64.b64encode(self.payload).decode("ascii"),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> DeadLetter:
        """Raises: SchemaError."""
        doc = _json.loads(_check, data)

        def get(key: str) -> Any:
            return _json.field(_check, doc, key)

        encoded = get("payload")
        if not isinstance(encoded, str):
            raise _check.error("payload", f"expected a base64 string, got {type(encoded).__name__}")
        try:
            payload = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
            raise _check.error("payload", f"invalid base64: {exc}") from exc
        return cls(
            source_topic=get("source_topic"),
            partition=get("partition"),
            offset=get("offset"),
            reason=get("reason"),
            payload=payload,
            job=get("job"),
            at_ms=get("at_ms"),
        )
