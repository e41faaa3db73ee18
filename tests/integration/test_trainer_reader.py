"""Exact reads against the real broker where offsets are not records: once the log cleaner has
compacted a topic, the records it removed leave gaps that a task's range must step over, may
begin or end inside, or may lie wholly within. (Transaction markers, the other kind of gap,
are covered in test_trainer_loader.py.)"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from streamtrain.infra import Endpoints
from streamtrain.trainer.reader import RangeReader

pytestmark = [pytest.mark.services]

COMPACTED = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
             "min.compaction.lag.ms": "0"}


def produce(services: Endpoints, topic: str, keys: list[str]) -> None:
    # Idempotent: offsets in the order given, even if a fresh topic refuses the first batch.
    producer = Producer({"bootstrap.servers": services.kafka, "enable.idempotence": True})
    for key in keys:
        producer.produce(topic, key.encode() + b"-value", key=key.encode(), partition=0)
    producer.flush(30)


def read(reader: RangeReader, topic: str, start: int, end: int) -> list[int]:
    return [msg.offset() for msg in reader.read(topic, 0, start, end)]


def test_ranges_over_compacted_gaps_hold_exactly_the_surviving_records(services, topic_factory) -> None:
    topic = topic_factory("compacted", 1, **COMPACTED)
    # Offsets 10..29 are superseded by 40..59 (same keys); the rest are the only values of
    # their keys. The record after the pause lands in a new segment, which closes the first
    # one: the cleaner only compacts closed segments.
    produce(services, topic, [f"a{i}" for i in range(10)] + [f"k{i}" for i in range(20)]
            + [f"b{i}" for i in range(10)] + [f"k{i}" for i in range(20)])
    time.sleep(0.5)
    produce(services, topic, ["tail"])
    surviving = list(range(10)) + list(range(30, 61))

    reader = RangeReader(services, f"{topic}.reader-test")
    try:
        deadline = time.monotonic() + 90
        while read(reader, topic, 0, 61) != surviving:
            assert time.monotonic() < deadline, f"not compacted: {read(reader, topic, 0, 61)}"
            time.sleep(0.5)

        assert read(reader, topic, 5, 35) == [5, 6, 7, 8, 9, 30, 31, 32, 33, 34]  # across the gap
        assert read(reader, topic, 5, 20) == [5, 6, 7, 8, 9]  # ends inside it
        assert read(reader, topic, 15, 32) == [30, 31]  # begins inside it
        assert read(reader, topic, 12, 25) == []  # wholly inside it: ends, empty
        assert read(reader, topic, 29, 31) == [30]
    finally:
        reader.close()
