"""What the input topics hold: their partitions and each partition's offset bounds.

The end a task may reach is the *last stable offset* (read_committed): beyond it lie records
of transactions still open, which a trainer could not read yet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from streamtrain.infra import Endpoints
from streamtrain.jobstate.errors import CoordinationError

_quiet = logging.getLogger("streamtrain.kafka-admin")

Partition = tuple[str, int]


class InputUnavailableError(CoordinationError):
    """An input topic is missing or its partitions did not answer; the master retries."""


@dataclass(frozen=True)
class Bounds:
    earliest: int
    stable_end: int


class InputOffsets:
    def __init__(self, endpoints: Endpoints, timeout_s: float = 5.0) -> None:
        # Any: the stubs type config values str | int | float, but "logger" takes a logging.Logger.
        self._config: dict[str, Any] = {"bootstrap.servers": endpoints.kafka, "logger": _quiet}
        self._admin = AdminClient(self._config)
        self._timeout = timeout_s

    def _renew(self) -> None:
        # After a broker restart librdkafka's admin client can keep asking with a partition's
        # old leader epoch and get FENCED_LEADER_EPOCH for good (seen: every call for over 30
        # s); a new client starts from fresh metadata.
        self._admin = AdminClient(self._config)

    def partitions(self, topics: Iterable[str]) -> list[Partition]:
        """Every partition of the topics, partitions added since the last call included."""
        found: list[Partition] = []
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            self._renew()
            raise InputUnavailableError(f"Kafka metadata request failed: {exc}") from exc
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise InputUnavailableError(f"input topic {topic!r} does not exist "
                                            f"({meta.error if meta else 'not in metadata'})")
            found.extend((topic, p) for p in sorted(meta.partitions))
        return found

    def bounds(self, partitions: Iterable[Partition], earliest: bool = True) -> dict[Partition, Bounds]:
        """Earliest offset and last stable offset per partition, in two batched requests."""
        parts = list(partitions)
        if not parts:
            return {}
        ends = self._query(parts, OffsetSpec.latest())
        starts = self._query(parts, OffsetSpec.earliest()) if earliest else dict.fromkeys(parts, 0)
        return {p: Bounds(starts[p], ends[p]) for p in parts}

    def log_ends(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """The offset after the last record written, committed or not (the high watermark).

        A reader that must have seen everything *committed* before some moment waits for this,
        not for the stable end: a transaction left open by a dead producer holds the stable end
        below records that other producers committed after it.
        """
        parts = list(partitions)
        return self._query(parts, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED) if parts else {}

    def _query(self, parts: list[Partition], spec: OffsetSpec,
               isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[Partition, int]:
        request = {TopicPartition(t, p): spec for t, p in parts}
        try:
            futures = self._admin.list_offsets(request, isolation_level=isolation,
                                               request_timeout=self._timeout)
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            self._renew()
            raise InputUnavailableError(f"listing offsets failed: {exc}") from exc
