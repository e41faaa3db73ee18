"""Read a whole topic back, for tests that check what a producer or the joiner wrote."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60.0,
               settle: float = 1.0) -> list[Message]:
    """Every committed record of `topic` from the beginning: waits until `expected` have come,
    then `settle` seconds more so that extra (duplicate) records would show up too."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"reader-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.subscribe([topic])
    found: list[Message] = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                found.append(msg)
            elif msg is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"reading {topic}: {msg.error().str()}")
            if len(found) >= expected:
                quiet_until = quiet_until or time.monotonic() + settle
                if time.monotonic() >= quiet_until:
                    break
        return found
    finally:
        consumer.close()
