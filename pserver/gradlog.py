"""A shard's gradient log: its topic `<job>.grad.<i>` read in order, each record parsed and
checked, the ones that do not parse or fit dead-lettered, and where reading stands.

The shard (shard.py) decides what to do with a delta; this module only reads. One partition
per shard topic gives every delta one place in one total order, which is what makes a replay
from a checkpoint's offset end where an unkilled shard would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from streamtrain.infra import Endpoints
from streamtrain.jobstate.offsets import Bounds, InputOffsets, InputUnavailableError
from streamtrain.jobstate.topics import dlq_spec, ensure_job_topics, grad_spec
from streamtrain.pserver.state import BadDeltaError
from streamtrain.schemas import DeadLetter, GradientDelta, SchemaError, Topics
from streamtrain.schemas.config import JobConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


class GradientLog:
    """Reads shard `shard`'s gradient topic from `next_offset` on; `bad` counts the records
    dead-lettered."""

    def __init__(self, endpoints: Endpoints, config: JobConfig, shard: int) -> None:
        job = config.name
        topics = Topics(job)
        self.job, self.shard = job, shard
        self.topic, self.dlq_topic = topics.grad(shard), topics.dlq
        self.next_offset = 0  # every record before it has been handed on or dead-lettered
        self.bad = 0
        ensure_job_topics(endpoints, config, [grad_spec(job, shard), dlq_spec(job)])
        self._admin = InputOffsets(endpoints)
        self._consumer = Consumer({
            "bootstrap.servers": endpoints.kafka,
            "group.id": f"{job}.pserver.{shard}",  # required by librdkafka; never committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # The broker answers a fetch as soon as a commit makes deltas readable; the wait only
            # bounds an idle shard's polling, which at tens of ms costs the broker CPU for each.
            "fetch.wait.max.ms": 500,
            # A restart replays up to a checkpoint interval of deltas (tens of KB each); at the
            # default 1 MB a partition a fetch brings only about 20 of them.
            "max.partition.fetch.bytes": 16 << 20,
        })
        self._dlq = Producer({"bootstrap.servers": endpoints.kafka, "enable.idempotence": True, "linger.ms": 20})

    def close(self) -> None:
        self._consumer.close()
        self._dlq.flush(10)

    def start(self, offset: int) -> None:
        """Read from `offset`, or from the topic's earliest offset if retention dropped what
        lies before it (logged: those updates are lost)."""
        earliest = self._bounds().earliest
        if earliest > offset:
            log.error("shard %d: %s kept no offsets below %d but the checkpoint resumes at %d: "
                      "the updates in between are lost; checkpoint more often than the topic's "
                      "retention", self.shard, self.topic, earliest, offset)
            offset = earliest
        self.seek(offset)

    def seek(self, offset: int) -> None:
        self.next_offset = offset
        self._consumer.assign([TopicPartition(self.topic, 0, offset)])

    def stable_end(self) -> int:
        """The last stable offset: past every committed transaction's records."""
        return self._bounds(earliest=False).stable_end

    def log_end(self) -> int:
        """Past every delta written so far. Reading up to it means every delta written before
        the call was seen; the stable end would stop short of it at any transaction left open
        on the topic until the broker aborts it."""
        return self._retried(lambda: self._admin.log_ends([(self.topic, 0)])[(self.topic, 0)])

    def read(self, fits: Callable[[GradientDelta], None], batch: int = 1000,
             timeout: float = 0.05) -> Iterator[tuple[GradientDelta, int]]:
        """The next deltas and their offsets, waiting up to `timeout` for the first; `fits`
        raises BadDeltaError for one that cannot apply here, which is dead-lettered like one
        that does not parse."""
        # Wait for one message at most `timeout`, then take what else is already fetched:
        # `consume(batch, timeout)` would wait out the whole timeout for the batch to fill,
        # and every delta would reach the parameters that much later.
        messages = self._consumer.consume(1, timeout)
        if messages:
            messages += self._consumer.consume(batch - 1, 0)
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("shard %d: consumer error: %s", self.shard, error)
                continue
            offset = msg.offset()
            assert offset is not None  # a consumed message, not an error: it has one
            self.next_offset = offset + 1
            try:
                # A value of None (a tombstone) is refused with SchemaError, and dead-lettered below.
                delta = GradientDelta.from_bytes(msg.value())  # type: ignore[arg-type]
                if delta.shard != self.shard:
                    raise BadDeltaError(f"delta for shard {delta.shard} on shard {self.shard}'s topic")
                fits(delta)
            except (SchemaError, BadDeltaError) as exc:
                self._dead_letter(msg, str(exc))
                continue
            yield delta, offset
        # The position also moves past transaction markers, which are never delivered: without
        # it a shard whose last record is a commit marker would never reach the stable end.
        position = self._consumer.position([TopicPartition(self.topic, 0)])[0].offset
        if position > self.next_offset:
            self.next_offset = position

    def _dead_letter(self, msg: Message, reason: str) -> None:
        self.bad += 1
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None  # a consumed record has them
        log.warning("shard %d: bad gradient message at %s:%d: %s", self.shard, topic, offset, reason)
        letter = DeadLetter(topic, partition, offset, reason, msg.value() or b"", self.job, int(time.time() * 1000))
        self._dlq.produce(self.dlq_topic, letter.to_json(), key=f"{topic}:{partition}:{offset}".encode())
        self._dlq.poll(0)

    def _bounds(self, earliest: bool = True) -> Bounds:
        """The partition's offsets; retried, since a topic just created has no leader for a
        moment."""
        return self._retried(lambda: self._admin.bounds([(self.topic, 0)], earliest)[(self.topic, 0)])

    def _retried(self, query: Callable[[], T], attempts: int = 30) -> T:
        for attempt in range(attempts):
            try:
                return query()
            except InputUnavailableError as exc:
                if attempt == attempts - 1:
                    raise
                log.info("shard %d: %s; retrying", self.shard, exc)
                time.sleep(1.0)
        raise AssertionError("unreachable")
