"""Exactly the records of a task: `[start, end)` of one partition, by assign and seek.

No consumer group, no committed offsets: the task says what to read, so two attempts of a
task read the same records. Offsets are not records: transaction markers and compacted-away
records leave gaps, so the read ends when the consumer's position reaches `end`, not after
`end - start` records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from streamtrain.infra import Endpoints
from streamtrain.schemas import StreamtrainError

log = logging.getLogger(__name__)


class RangeReadError(StreamtrainError, RuntimeError):
    """The range could not be read (broker unreachable for too long); the task is retried."""


class RangeReader:
    def __init__(self, endpoints: Endpoints, group: str, stall_s: float = 30.0) -> None:
        self._consumer = Consumer({
            "bootstrap.servers": endpoints.kafka,
            "group.id": group,  # required by librdkafka; nothing is ever committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            # A range ends where the task does, but the consumer prefetches past it (by default
            # up to 100,000 messages or 64 MB) and unassign throws that away: a few thousand
            # records ahead keep the decoder fed and cut the client's fetch CPU on short
            # ranges. The backoff is how soon a fetcher that stopped at the limit
            # looks again (the default second starves the reader).
            "queued.min.messages": 4096,
            "queued.max.messages.kbytes": 1024,
            "max.partition.fetch.bytes": 262144,
            "fetch.queue.backoff.ms": 5,
        })
        self._stall_s = stall_s

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[Message]:
        """Yield the records with start <= offset < end, in offset order."""
        for records in self.read_batches(topic, partition, start, end):
            yield from records

    def read_batches(self, topic: str, partition: int, start: int, end: int) -> Iterator[list[Message]]:
        """The records with start <= offset < end, in offset order, as the consumer hands
        them over (lists of up to 500): no Python work per record but a look at its error.

        Offsets below the partition's earliest (removed by retention) are skipped: the consumer
        resets to the earliest offset (`auto.offset.reset`), which is only looked up, to say so,
        when the first record comes after `start`."""
        if start >= end:
            return
        tp = TopicPartition(topic, partition, start)
        self._consumer.assign([tp])
        progress = time.monotonic()
        position = start
        try:
            while position < end:
                msgs = self._consumer.consume(500, 0.2)
                if any(msg.error() is not None for msg in msgs):
                    for msg in msgs:
                        error = msg.error()
                        if error is not None and error.code() != KafkaError._PARTITION_EOF:
                            log.warning("%s:%d: %s", topic, partition, error)
                    msgs = [msg for msg in msgs if msg.error() is None]
                before = position
                if msgs:
                    if position == start and _offset(msgs[0]) > start:
                        self._say_if_gone(topic, partition, start, end)
                    if _offset(msgs[-1]) >= end:
                        msgs = [msg for msg in msgs if _offset(msg) < end]
                        position = end
                    else:
                        position = _offset(msgs[-1]) + 1
                    if msgs:
                        yield msgs
                if position < end:
                    # Markers and gaps advance the position without delivering a record.
                    now_at = self._consumer.position([TopicPartition(topic, partition)])[0].offset
                    if now_at > position:
                        position = now_at
                if position > before:
                    progress = time.monotonic()
                elif time.monotonic() - progress > self._stall_s:
                    raise RangeReadError(f"{topic}:{partition}: no progress at offset {position} "
                                         f"(reading [{start}, {end})) for {self._stall_s:.0f} s")
        finally:
            self._consumer.unassign()

    def _say_if_gone(self, topic: str, partition: int, start: int, end: int) -> None:
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        if low > start:
            log.warning("%s:%d: offsets [%d, %d) are gone (retention); reading from %d",
                        topic, partition, start, min(low, end), low)

    def close(self) -> None:
        self._consumer.close()


def _offset(msg: Message) -> int:
    """A consumed record's offset (only an error comes without one)."""
    offset = msg.offset()
    assert offset is not None
    return offset
