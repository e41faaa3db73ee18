"""How a trainer's messages reach Kafka: in transactions (exactly-once) or as produced
(at-least-once).

Exactly-once keeps a group's messages in memory and opens the transaction only to produce
and commit them, so a transaction is open for milliseconds: a trainer killed mid-task leaves
no open transaction holding back the pservers' read_committed consumers (only one killed
inside those milliseconds does, until the broker aborts it after `transaction.timeout.ms`,
or at once when a trainer with the same id starts again and fences it).
"""

from __future__ import annotations

import logging
from typing import Protocol

from confluent_kafka import KafkaException, Producer

from infra import Endpoints

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_MS = 10_000

Messages = list[tuple[str, bytes, bytes | None]]  # (topic, value, key)


class DeliveryError(RuntimeError):
    """Messages could not be committed; nothing of the group is visible to read_committed readers."""


class Delivery(Protocol):
    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """A message of the group being built."""

    def take(self) -> Messages:
        """The group's messages not yet sent, handed to `commit` (possibly from another thread)."""

    def commit(self, messages: Messages) -> None:
        """Make a taken group visible. Raises DeliveryError."""

    def discard(self) -> None:
        """Drop the group being built."""

    def close(self) -> None: ...


class TransactionalDelivery:
    def __init__(self, endpoints: Endpoints, transactional_id: str) -> None:
        self._config = {
            "bootstrap.servers": endpoints.kafka,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 5,
            "compression.type": "lz4",
        }
        self._producer = self._new_producer()
        self._buffer: Messages = []

    def _new_producer(self) -> Producer:
        producer = Producer(self._config)
        # Fences any earlier producer with this id and aborts its open transaction.
        producer.init_transactions(30)
        return producer

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._buffer.append((topic, value, key))

    def take(self) -> Messages:
        taken, self._buffer = self._buffer, []
        return taken

    def commit(self, messages: Messages) -> None:
        """All of `messages` in one transaction. Only ever called from one thread at a time."""
        if not messages:
            return
        try:
            self._producer.begin_transaction()
            for topic, value, key in messages:
                self._produce(topic, value, key)
            self._producer.commit_transaction(30)
        except KafkaException as exc:
            self._recover(exc)
            raise DeliveryError(f"transaction failed: {exc.args[0].str()}") from exc

    def _produce(self, topic: str, value: bytes, key: bytes | None) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, partition=0)
                return
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let it drain

    def _recover(self, exc: KafkaException) -> None:
        error = exc.args[0]
        if error.txn_requires_abort():
            try:
                self._producer.abort_transaction(30)
                return
            except KafkaException:
                pass
        log.warning("transactional producer unusable (%s); starting a new one", error.str())
        self._producer = self._new_producer()

    def discard(self) -> None:
        self._buffer.clear()

    def close(self) -> None:
        self._buffer.clear()
        self._producer.flush(10)


class AtLeastOnceDelivery:
    """Produced as soon as added; `commit` waits for the broker's acknowledgements."""

    def __init__(self, endpoints: Endpoints) -> None:
        self._producer = Producer({"bootstrap.servers": endpoints.kafka, "enable.idempotence": True,
                                   "linger.ms": 5, "compression.type": "lz4"})

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, partition=0)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def take(self) -> Messages:
        return []  # already sent

    def commit(self, messages: Messages) -> None:
        """Wait for the acknowledgement of everything sent so far (the taken group included)."""
        if self._producer.flush(30) > 0:
            raise DeliveryError("messages still unacknowledged after 30 s")

    def discard(self) -> None:
        """Already sent: at-least-once cannot take them back (the trade-off it makes)."""

    def close(self) -> None:
        self._producer.flush(10)
